"""`deltattg evaluate`: an actor on an environment split — the planner wins every household task, a random actor few,
the per-type table adds up to the totals, a killed run resumes to exactly the numbers of an uninterrupted one, and a
folder of other settings, a malformed record or a bad option exit 2 with nothing written or overwritten."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from conftest import exit_status, skip_here
from deltattg.cli import main
from deltattg.data.sources import read_trajectory_file
from deltattg.envs.base import Task
from deltattg.errors import InputError
from deltattg.rollout.evaluate import COLUMNS, EPISODES_FILE, RESULTS_JSON, RESULTS_MD, select_tasks
from deltattg.rollout.output import LOCK_FILE, held_folder

HOUSEHOLD = ["evaluate", "--env", "household", "--short", "--no-progress"]



def evaluate(out: Path, actor: str, *extra: str) -> int:
    return exit_status([*HOUSEHOLD, "--actor", actor, "--out", str(out), *extra])


def results(out: Path) -> dict:
    return json.loads((out / RESULTS_JSON).read_text())


def lines(out: Path) -> list[str]:
    """The records of ``out/episodes.jsonl`` (blank lines are skipped, as the reader skips them)."""
    return [line for line in (out / EPISODES_FILE).read_text().splitlines() if line.strip()]


def assert_table_adds_up(report: dict) -> None:
    types, overall = report["by_type"], report["overall"]
    assert sum(s["episodes"] for s in types.values()) == overall["episodes"] == report["episodes"]
    assert sum(s["successes"] for s in types.values()) == overall["successes"]
    steps = sum(s["avg_steps"] * s["episodes"] for s in types.values() if s["episodes"])
    assert steps == pytest.approx(overall["avg_steps"] * overall["episodes"])
    won = sum(s["avg_steps_success"] * s["successes"] for s in types.values() if s["successes"])
    assert won == pytest.approx((overall["avg_steps_success"] or 0) * overall["successes"])


def test_the_planner_wins_every_task_and_the_table_adds_up(tmp_path, capsys):
    out = tmp_path / "expert"
    assert evaluate(out, "expert:0", "--split", "valid_seen", "--episodes", "30") == 0
    report = results(out)
    assert report["overall"]["success"] == 1.0 and report["episodes"] == 30 and report["played"] == 30
    assert (report["env"], report["split"], report["actor"], report["short"]) == ("household", "valid_seen",
                                                                                   "expert-eps0", True)
    assert list(report["by_type"]) == list(COLUMNS["household"])  # the paper's Table 7 columns, in order
    assert all(s["success"] in (1.0, None) for s in report["by_type"].values())
    assert_table_adds_up(report)
    assert report["overall"]["avg_steps"] == report["overall"]["avg_steps_success"] > 1
    # the records are collect's trajectory records, one per task, readable by every other command
    items = read_trajectory_file(str(out / EPISODES_FILE)).items
    assert len(items) == 30 and len({i.trajectory.group for i in items}) == 30
    assert all(i.trajectory.success and i.trajectory.extra["task"]["split"] == "valid_seen" for i in items)
    markdown = (out / RESULTS_MD).read_text()
    printed = capsys.readouterr().out
    assert markdown == printed
    assert "| actor | Pick | Look | Clean | Heat | Cool | Pick2 | All |" in markdown
    assert "| **all** | 30 | 100.0 |" in markdown


def test_a_random_actor_wins_few_and_the_whole_split_is_the_default(tmp_path):
    out = tmp_path / "random"
    assert evaluate(out, "random", "--split", "valid_unseen") == 0
    report = results(out)
    assert report["episodes"] == 50  # HouseholdConfig.short(): n_valid_unseen = 50
    assert report["overall"]["success"] <= 0.2
    assert_table_adds_up(report)


def test_a_killed_run_resumes_to_the_uninterrupted_numbers(tmp_path, capsys):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    argv = ("expert:0.5", "--episodes", "40", "--seed", "3")
    assert evaluate(whole, *argv) == 0
    assert evaluate(killed, *argv) == 0
    assert lines(killed) == lines(whole)  # deterministic
    kept = lines(killed)[:11]  # a kill after 11 finished episodes (mid-chunk)
    (killed / EPISODES_FILE).write_text("\n".join(kept) + "\n")
    (killed / RESULTS_JSON).unlink()
    capsys.readouterr()
    assert evaluate(killed, *argv) == 0
    assert "resuming: 11 of 40 episodes already in" in capsys.readouterr().err
    after = lines(killed)
    assert len(after) == 40 and after[:11] == kept  # appended, the earlier records untouched
    assert sorted(after) == sorted(lines(whole))  # the same episodes, record for record
    rerun, uninterrupted = results(killed), results(whole)
    assert (rerun["played"], rerun["resumed"]) == (29, 11)
    for key in ("overall", "by_type", "episodes"):
        assert rerun[key] == uninterrupted[key]
    # a finished run plays nothing; a larger --episodes extends it (the tasks are a prefix of a seeded order)
    assert evaluate(killed, *argv) == 0 and results(killed)["played"] == 0 and len(lines(killed)) == 40
    assert evaluate(killed, "expert:0.5", "--episodes", "45", "--seed", "3") == 0
    assert (results(killed)["played"], results(killed)["episodes"]) == (5, 45)


def test_task_order_is_a_seeded_prefix():
    tasks = [Task(f"t{k}") for k in range(100)]
    assert select_tasks(tasks, 10, 7) == select_tasks(tasks, 30, 7)[:10] == select_tasks(tasks, None, 7)[:10]
    assert select_tasks(tasks, 10, 7) != select_tasks(tasks, 10, 8)
    with pytest.raises(ValueError, match="only 100 tasks"):
        select_tasks(tasks, 101, 0)
    with pytest.raises(ValueError, match="'t3' more than once"):
        select_tasks([*tasks, Task("t3", split="other")], 5, 0)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("eval") / "run"
    assert evaluate(out, "expert:0.3", "--episodes", "6", "--seed", "1") == 0
    return out


def snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.mark.parametrize("change, named", [
    (["--actor", "random"], "actor 'expert-eps0.3' (now 'random')"),
    (["--seed", "2"], "seed 1 (now 2)"),
    (["--max-turns", "5"], "max_turns None (now 5)"),
    (["--split", "valid_seen"], "split 'train' (now 'valid_seen')"),
    (["--full"], "short True (now False)"),
])  # fmt: skip
def test_a_folder_of_other_settings_is_refused(finished, change, named, tmp_path, capsys):
    options = {"--actor": "expert:0.3", "--episodes": "6", "--seed": "1"}
    full = change == ["--full"]
    if not full:
        options[change[0]] = change[1]
    argv = [a for a in HOUSEHOLD if not (full and a == "--short")]
    before = snapshot(finished)
    code = exit_status([*argv, *(x for kv in options.items() for x in kv), "--out", str(finished)])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{finished / EPISODES_FILE}:1: this folder holds a run with other settings" in err and named in err
    assert "Traceback" not in err and snapshot(finished) == before


@pytest.mark.parametrize("bad, message", [
    ("{not json", "malformed JSON"),
    ('{"id": "x", "group": "household/train/1", "reward": 1.0}', "success"),
    ("[1, 2]", "expected a JSON object"),
])  # fmt: skip
def test_a_malformed_record_is_named_by_file_and_line(finished, bad, message, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    records = lines(finished)
    (out / EPISODES_FILE).write_text("\n".join([*records[:2], bad, *records[2:4]]) + "\n")
    before = snapshot(out)
    assert evaluate(out, "expert:0.3", "--episodes", "6", "--seed", "1") == 2
    err = capsys.readouterr().err
    assert f"deltattg: error: {out / EPISODES_FILE}:3:" in err and message in err
    assert snapshot(out) == before  # nothing appended, no results written


def test_any_episodes_file_ends_in_exit_0_or_2_and_a_refused_one_is_left_alone(finished, tmp_path):
    """Random bytes and randomly mutated records as episodes.jsonl: a run exits 0 (the records were a valid part of
    this run: the rest is played) or 2 (nothing written), never with a traceback."""
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import strategies as st

    records = [json.loads(line) for line in lines(finished)]
    values = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6),
                       st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(),
                                                                              max_size=2))  # fmt: skip

    @st.composite
    def files(draw) -> bytes:
        if draw(st.booleans()):
            return draw(st.binary(max_size=64))
        chosen = [json.loads(json.dumps(r)) for r in draw(st.lists(st.sampled_from(records), min_size=1, max_size=3))]
        record = draw(st.sampled_from(chosen))
        field = draw(st.sampled_from(sorted(record) + ["evaluation.seed", "evaluation.actor", "steps.0"]))
        head, _, tail = field.partition(".")
        target = record[head] if tail and isinstance(record.get(head), (dict, list)) else record
        key = (int(tail) if isinstance(target, list) else tail) if tail and target is not record else field
        if draw(st.booleans()) and isinstance(target, dict):
            target.pop(key, None)
        elif isinstance(target, dict) or (isinstance(key, int) and key < len(target)):
            target[key] = draw(values)
        return "\n".join(json.dumps(r) for r in chosen).encode() + b"\n"

    @hypothesis.settings(max_examples=25, deadline=None, derandomize=True, database=None,
                         suppress_health_check=list(hypothesis.HealthCheck))  # fmt: skip
    @hypothesis.given(files())
    def check(content: bytes) -> None:
        out = Path(tempfile.mkdtemp(dir=tmp_path))
        (out / EPISODES_FILE).write_bytes(content)
        code = evaluate(out, "expert:0.3", "--episodes", "6", "--seed", "1")
        assert code in (0, 2)
        if code == 2:
            assert snapshot(out) == {EPISODES_FILE: content}
        else:
            assert len(lines(out)) == 6 and (out / RESULTS_JSON).is_file()

    check()


def test_foreign_or_repeated_records_are_refused(finished, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    records = lines(finished)
    (out / EPISODES_FILE).write_text("\n".join([records[0], records[1], records[0]]) + "\n")
    assert evaluate(out, "expert:0.3", "--episodes", "6", "--seed", "1") == 2
    assert f"{out / EPISODES_FILE}:3: task" in capsys.readouterr().err  # a task twice
    # records of tasks outside the selection (a smaller --episodes than the run's)
    assert evaluate(finished, "expert:0.3", "--episodes", "2", "--seed", "1") == 2
    assert "is not among this run's 2 tasks" in capsys.readouterr().err
    # a `collect` file has no evaluation settings
    record = json.loads(records[0])
    del record["evaluation"]
    (out / EPISODES_FILE).write_text(json.dumps(record) + "\n")
    assert evaluate(out, "expert:0.3", "--episodes", "6", "--seed", "1") == 2
    assert "not a record of `deltattg evaluate`" in capsys.readouterr().err


@pytest.mark.parametrize("change", [
    ["--split", "nowhere"],
    ["--split", "train,train"],
    ["--episodes", "201"],  # the short train split has 200 tasks
    ["--episodes", "0"],
    ["--actor", "expret:0.5"],
    ["--actor", "lm:./no-such-model"],
    ["--max-turns", "0"],
    ["--temperature", "nan"],
    ["--env", "nowhere"],
])  # fmt: skip
def test_bad_options_exit_2_and_write_nothing(change, tmp_path, capsys):
    options = {"--actor": "expert:0.3", "--episodes": "3"}
    options[change[0]] = change[1]
    out = tmp_path / "out"
    code = exit_status([*HOUSEHOLD, *(x for kv in options.items() for x in kv), "--out", str(out)])
    assert code == 2
    assert "Traceback" not in capsys.readouterr().err
    assert not out.exists()


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    out = tmp_path / "file"
    out.write_text("keep")
    assert evaluate(out, "expert", "--episodes", "2") == 2
    assert "is not a folder" in capsys.readouterr().err and out.read_text() == "keep"


def test_a_saved_model_folder_acts(tmp_path, one_torch_thread):
    """lm:FOLDER, a save_pretrained folder as `deltattg train` writes its checkpoints (RUN/checkpoints/step-N/actor)."""
    from deltattg.envs.household import HouseholdConfig, vocabulary
    from deltattg.tiny import tiny_llama, word_tokenizer

    tokenizer = word_tokenizer(vocabulary(HouseholdConfig.short()))
    folder = tmp_path / "actor"
    tiny_llama(tokenizer, hidden=32, layers=1, heads=2).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    out = tmp_path / "lm"
    argv = (f"lm:{folder}", "--episodes", "3", "--max-turns", "2", "--max-new-tokens", "4", "--temperature", "0",
            "--threads", "1")  # fmt: skip
    assert evaluate(out, *argv) == 0
    report = results(out)
    assert (report["actor"], report["temperature"], report["max_new_tokens"]) == (f"lm:{folder}", 0.0, 4)
    assert report["overall"]["avg_steps"] == 2.0 and report["played"] == 3
    records = [json.loads(line) for line in lines(out)]
    assert all(len(r["step_tokens"]) == 2 and all(0 < n <= 4 for n in r["step_tokens"]) for r in records)
    # a greedy actor resumes to the same actions (log-probs may differ in the last bits: other batch padding);
    # another temperature is another run
    (out / EPISODES_FILE).write_text(lines(out)[0] + "\n")
    assert evaluate(out, *argv) == 0
    played = sorted((r["group"], r["messages"]) for r in map(json.loads, lines(out)))
    assert played == sorted((r["group"], r["messages"]) for r in records)
    assert evaluate(out, *argv[:-4], "--temperature", "0.5") == 2


def test_a_model_path_spelled_otherwise_resumes_the_same_run(tmp_path, monkeypatch, capsys):
    """lm:DIR, lm:DIR/, lm:./DIR and the absolute path are one actor (resolved paths are compared), also against
    records that spell it otherwise; a finished run loads no model, so a folder without one does here."""
    folder = tmp_path / "actor"
    folder.mkdir()
    out = tmp_path / "lm"
    out.mkdir()
    record = json.loads(lines(finished_run(tmp_path))[0])
    settings = {**record["evaluation"], "actor": "lm:actor/", "temperature": 1.0, "max_new_tokens": 8}
    (out / EPISODES_FILE).write_text(json.dumps({**record, "evaluation": settings}) + "\n")  # one task, relative path
    monkeypatch.chdir(tmp_path)
    for spelled in ("lm:actor", "lm:actor/", "lm:./actor", f"lm:{folder}/", f"lm:{tmp_path}/./actor"):
        assert evaluate(out, spelled, "--episodes", "1", "--seed", "1", "--max-new-tokens", "8") == 0, spelled
        assert (results(out)["played"], results(out)["actor"]) == (0, f"lm:{folder.resolve()}")
    assert evaluate(out, "lm:other", "--episodes", "1", "--seed", "1", "--max-new-tokens", "8") == 2
    assert "actor 'lm:" in capsys.readouterr().err


def finished_run(tmp_path: Path) -> Path:
    """A household run of one episode (seed 1) in its own folder."""
    out = tmp_path / "one"
    assert evaluate(out, "expert:0.3", "--episodes", "1", "--seed", "1") == 0
    return out


def running_evaluation(out: Path) -> subprocess.Popen:
    """``deltattg evaluate`` in another process, stopped (SIGSTOP) once it holds ``out``: its pid is in the lock."""
    argv = [sys.executable, "-m", "deltattg", *HOUSEHOLD, "--actor", "expert:0.5", "--out", str(out)]
    first = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lock = out / LOCK_FILE
    deadline = time.monotonic() + 120
    while not (lock.is_file() and lock.read_text().strip() == str(first.pid)):
        assert first.poll() is None, first.stderr.read().decode()  # the 200 short tasks take seconds
        assert time.monotonic() < deadline, "the first run never took the folder"
        time.sleep(0.002)
    os.kill(first.pid, signal.SIGSTOP)
    return first


def test_a_second_run_on_a_folder_in_use_is_refused_and_a_killed_runs_lock_blocks_nobody(tmp_path):
    """Two real processes on one --out: the second exits 2 naming the first's pid and writes nothing; the first,
    killed (SIGKILL: no cleanup), leaves its lock file behind, and a rerun resumes past it: every task exactly once."""
    out = tmp_path / "run"
    first = running_evaluation(out)
    try:
        before = snapshot(out)
        second = subprocess.run([sys.executable, "-m", "deltattg", *HOUSEHOLD, "--actor", "expert:0.5", "--out",
                                 str(out)], capture_output=True, text=True, timeout=300)  # fmt: skip
        assert second.returncode == 2, second.stderr
        assert f"{out}: another run (pid {first.pid}) is writing to this folder" in second.stderr
        assert "Traceback" not in second.stderr and snapshot(out) == before
    finally:
        first.kill()
        first.wait()
        first.stderr.close()
    assert (out / LOCK_FILE).is_file()  # stale: its holder is gone, and so is the flock
    assert evaluate(out, "expert:0.5") == 0
    report = results(out)
    assert report["played"] + report["resumed"] == report["episodes"] == 200
    assert len({json.loads(line)["group"] for line in lines(out)}) == len(lines(out)) == 200
    assert not (out / LOCK_FILE).exists()


def test_the_folder_is_held_by_one_holder_at_a_time_and_left_as_found(tmp_path):
    out = tmp_path / "a" / "b"
    with held_folder(out):
        assert (out / LOCK_FILE).read_text().strip() == str(os.getpid())
        with pytest.raises(InputError, match=f"another run \\(pid {os.getpid()}\\)"):
            with held_folder(out):
                pass
        assert (out / LOCK_FILE).is_file()  # the refused one leaves the holder's lock alone
    assert not (tmp_path / "a").exists()  # created empty, removed empty
    with pytest.raises(RuntimeError), held_folder(out):
        (out / "kept").write_text("x")
        raise RuntimeError
    assert [p.name for p in out.iterdir()] == ["kept"]


@pytest.mark.parametrize("where", ["under a file", "/sys"])
def test_an_unwritable_out_exits_2_before_any_work(where, tmp_path, capsys):
    if where == "/sys":
        if not Path("/sys/kernel").is_dir():
            skip_here("no sysfs")
        out = Path("/sys/deltattg-evaluate/out")
    else:
        (tmp_path / "file").write_text("keep")
        out = tmp_path / "file" / "out"
    assert evaluate(out, "expert", "--episodes", "2") == 2
    err = capsys.readouterr().err
    assert "cannot write" in err and "Traceback" not in err and "evaluate expert" not in err
    assert not out.exists()
    with pytest.raises(InputError, match="cannot"):  # the folder's own check, whatever ran before it
        with held_folder(out):
            pass


# ---- the real environments --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def alfworld_data(shared_dir: Path, tmp_path_factory) -> Path:
    pytest.importorskip("alfworld")
    archive = shared_dir / "data" / "alfworld" / "json_2.1.1-valid_seen.tar.gz"
    if not archive.is_file():
        pytest.skip(f"{archive} not found")
    root = tmp_path_factory.mktemp("alfworld")
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    return root


@pytest.mark.slow
def test_alfworld_expert_wins_and_the_table_has_the_six_types(alfworld_data, tmp_path):
    out = tmp_path / "alf"
    assert main(["evaluate", "--env", "alfworld", "--data", str(alfworld_data), "--split", "valid_seen", "--actor",
                 "expert:0", "--episodes", "3", "--out", str(out), "--no-progress"]) == 0  # fmt: skip
    report = results(out)
    assert report["overall"]["success"] == 1.0 and report["episodes"] == 3
    assert list(report["by_type"]) == list(COLUMNS["alfworld"])
    assert_table_adds_up(report)
    played = {json.loads(line)["group"].split("/")[1].split("-")[0] for line in lines(out)}
    assert {t for t, s in report["by_type"].items() if s["episodes"]} == played


def test_bfcl_categories_are_the_breakdown(tmp_path):
    pytest.importorskip("bfcl_eval")
    out = tmp_path / "bfcl"
    assert exit_status(["evaluate", "--env", "bfcl", "--split", "base,miss_param", "--actor", "expert", "--episodes", "4",
                "--out", str(out), "--no-progress"]) == 0  # fmt: skip
    report = results(out)
    assert report["overall"]["success"] == 1.0 and report["breakdown"] == "category"
    assert list(report["by_type"]) == list(COLUMNS["bfcl"])
    assert_table_adds_up(report)
    played = {json.loads(line)["group"].rsplit("_", 1)[0].removeprefix("multi_turn_") for line in lines(out)}
    assert {t for t, s in report["by_type"].items() if s["episodes"]} == played <= {"base", "miss_param"}
    assert "| actor | base | miss_func | miss_param | long_context | All |" in (out / RESULTS_MD).read_text()
