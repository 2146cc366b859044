"""``deltattg verl-tasks`` as the README, docs/verl.md and recipes/verl/train.sh run it (issue 21): ALFWorld and BFCL
describe themselves, so their documented commands write a parquet whose every row rebuilds its environment and task
the way the ``deltattg_env`` agent loop does; an output that cannot be written is an error naming it before any
task is loaded, and never leaves a partial parquet."""

from __future__ import annotations

import os
import shlex
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from conftest import exit_status, skip_here
from docblocks import marked_block
from deltattg.envs.base import StatesTask
from deltattg.cli import main
from deltattg.errors import InputError
from deltattg.verl.tasks import AGENT_NAME, rebuild_task, task_of, write_parquet

REPO = Path(__file__).resolve().parent.parent
ALFWORLD_GAMES = 1  # per split: the documented commands run verbatim on every game there is (2-6 s to load one)
BFCL_LIMIT = ["--limit", "3"]  # BFCL's 200 tasks ship with bfcl-eval: the recipe's commands get a --limit (last wins)


def documented_commands(env: str) -> list[list[str]]:
    """Every distinct ``deltattg verl-tasks --env ENV ...`` command of the README's and docs/verl.md's blocks this
    test runs (``docblocks``: the blocks marked as run by it), as arguments of ``main``."""
    test = "test_the_documented_alfworld_commands_write_rows_the_agent_loop_plays"
    commands = []
    for block in (marked_block("README.md", test), marked_block("docs/verl.md", test)):
        for argv in block.commands():
            if argv[:3] == ["verl-tasks", "--env", env] and argv not in commands:
                commands.append(argv)
    return commands


def recipe_commands(setting: str, out: Path) -> list[list[str]]:
    """The ``deltattg verl-tasks`` commands ``recipes/verl/train.sh`` runs for ``SETTING`` (its ``DRY_RUN`` print)."""
    env = {**os.environ, "DRY_RUN": "1", "METHOD": "grpo_step", "SETTING": setting, "OUT": str(out)}
    printed = subprocess.run(["bash", str(REPO / "recipes" / "verl" / "train.sh")], env=env, capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
    commands = [shlex.split(line)[1:] for line in printed.splitlines() if line.startswith("deltattg verl-tasks ")]
    assert len(commands) == 2  # train and val
    return commands


def the_out(argv: list[str]) -> str:
    return argv[argv.index("--out") + 1]


def distinct(commands: list[list[str]]) -> list[list[str]]:
    """The commands that differ in more than their ``--out``."""
    seen, kept = set(), []
    for argv in commands:
        at = argv.index("--out")
        key = tuple(argv[:at] + argv[at + 2:])
        if key not in seen:
            seen.add(key)
            kept.append(argv)
    return kept



def read_rows(path: Path, cache: Path) -> Any:
    """The parquet read as verl's ``RLHFDataset`` reads it (``datasets``' parquet loader)."""
    import datasets

    return datasets.load_dataset("parquet", data_files=str(path), cache_dir=str(cache))["train"]


def check_rows(rows: Any, env: str, count: int) -> None:
    """``count`` rows, each with the fields verl and the agent loop read and a task from which the agent loop's
    :func:`rebuild_task` rebuilds the environment the row describes."""
    assert len(rows) == count
    for index, row in enumerate(rows):
        assert {"data_source", "agent_name", "prompt", "reward_model", "extra_info"} <= set(row)
        assert row["agent_name"] == AGENT_NAME and row["data_source"] == f"deltattg/{env}"
        assert row["extra_info"]["index"] == index and [m["role"] for m in row["prompt"]] == ["system", "user"]
        made, task = rebuild_task(row["extra_info"])
        assert made.describe() == task_of(row["extra_info"])["env"] and made.name == env
        assert task.split == row["extra_info"]["split"]


def check_first_prompt(rows: Any) -> None:
    """The first row's rebuilt environment, reset to its task, shows the row's prompt — ALFWorld, whose reset is
    costly, its first observation's last line, the task's text (one reset: an ALFWorld game takes seconds to
    load)."""
    system, user = rows[0]["prompt"]
    made, task = rebuild_task(rows[0]["extra_info"])
    observation = made.reset(task)
    if isinstance(made, StatesTask):
        assert observation.endswith("\n" + user["content"]) and user["content"].startswith("Your task is to: ")
    else:
        assert observation == user["content"]
    assert made.system_prompt == system["content"]


def extract_games(archive: Path, root: Path, count: int) -> None:
    """The first ``count`` games of an ALFWorld tarball (only their ``game.tw-pddl``, all the env reads)."""
    with tarfile.open(archive) as tar:
        for member in tar:
            if member.name.endswith("/game.tw-pddl"):
                tar.extract(member, root, filter="data")
                count -= 1
                if count == 0:
                    return


@pytest.fixture(scope="module")
def alfworld_data(shared_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few train and valid_seen games from the shared tarballs (the splits the documented commands use)."""
    pytest.importorskip("alfworld", reason="ALFWorld needs the [alfworld] extra (pip install alfworld)")
    root = tmp_path_factory.mktemp("alfworld")
    for split in ("train", "valid_seen"):
        archive = shared_dir / "data" / "alfworld" / f"json_2.1.1-{split}.tar.gz"
        if not archive.is_file():
            pytest.skip(f"{archive} not found")
        extract_games(archive, root, ALFWORLD_GAMES)
    return root


@pytest.mark.slow  # three ALFWorld game loads
def test_the_documented_alfworld_commands_write_rows_the_agent_loop_plays(alfworld_data, tmp_path, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(alfworld_data))
    monkeypatch.chdir(tmp_path)  # the README writes to data/, a folder that does not exist yet
    readme = ["verl-tasks", "--env", "alfworld", "--out", "data/alfworld-train.parquet"]
    commands = distinct(documented_commands("alfworld") + recipe_commands("alfworld", tmp_path / "recipe"))
    assert readme in commands and len(commands) == 2  # the train split's and valid_seen's
    for argv in commands:
        assert main(argv) == 0, argv
        rows = read_rows(Path(the_out(argv)), tmp_path / "cache")
        check_rows(rows, "alfworld", ALFWORLD_GAMES)
        if argv == readme:
            check_first_prompt(rows)


def test_the_recipes_bfcl_commands_write_rows_the_agent_loop_plays(tmp_path):
    pytest.importorskip("bfcl_eval", reason="BFCL needs bfcl-eval (pip install --no-deps bfcl-eval mpmath)")
    for argv in recipe_commands("papersearch", tmp_path / "recipe"):  # the paper's setting on BFCL multi-turn
        assert argv[:3] == ["verl-tasks", "--env", "bfcl"]
        assert main(argv + BFCL_LIMIT) == 0, argv
        rows = read_rows(Path(the_out(argv)), tmp_path / "cache")
        check_rows(rows, "bfcl", 3)
        check_first_prompt(rows)


def unwritable_outputs(tmp_path: Path) -> dict[str, Path]:
    """Outputs that cannot be written, even by root: /proc (no file can be created: FileNotFoundError), /sys (no
    permission: PermissionError), a folder that is a regular file; and a folder without write permission (not for
    root, who may write anyway: then it is left out)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    outs = {"a file as folder": blocker / "x.parquet"}
    outs |= {f"{root}": Path(root) / "x.parquet" for root in ("/proc", "/sys") if Path(root).is_dir()}
    if not os.access(locked, os.W_OK):
        outs["read-only folder"] = locked / "x.parquet"
    return outs


@pytest.mark.parametrize("case", ["a file as folder", "/proc", "/sys", "read-only folder"])
def test_an_unwritable_out_is_refused_before_any_task_is_loaded(case, tmp_path, monkeypatch, capsys):
    out = unwritable_outputs(tmp_path).get(case)
    if out is None:
        skip_here(f"{case}: writable here (root, or no such folder)")
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)  # loading the tasks would fail: the output is checked first
    code = exit_status(["verl-tasks", "--env", "alfworld", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"deltattg: error: {out}: cannot write: " in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "locked"]
    assert not any((tmp_path / "locked").iterdir())


def test_the_parquet_is_written_whole_or_not_at_all(tmp_path):
    out = tmp_path / "tasks.parquet"
    with pytest.raises(Exception):  # noqa: B017 - whatever arrow raises on a column of mixed types
        write_parquet([{"a": 1}, {"a": "one"}], out)
    assert list(tmp_path.iterdir()) == []  # neither the parquet nor its temporary file
    if Path("/sys").is_dir():  # the folder turns unwritable after the check: still an error naming the output
        with pytest.raises(InputError, match="^/sys/x.parquet: cannot write: Permission denied"):
            write_parquet([{"a": 1}], "/sys/x.parquet")
