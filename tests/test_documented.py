"""The documentation's commands, run as written (their pages mark them ``run by`` these tests; ``docblocks``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import exit_status
from docblocks import marked_block


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow  # ~20 s: the closed set from the shared hotpotqa file, 29 episodes
def test_the_documented_search_commands_run(shared_dir, tmp_path, monkeypatch):
    pytest.importorskip("bm25s", reason="the search environment needs the [search] extra")
    block = marked_block("docs/environments.md", "test_the_documented_search_commands_run")
    monkeypatch.chdir(tmp_path)
    commands = [argv for argv in block.commands() if argv[0] != "train"]  # the mark: train is not run (minutes)
    assert [argv[0] for argv in commands] == ["search-data", "collect"]
    for argv in commands:
        assert exit_status([a.replace("../shared", str(shared_dir)) for a in argv]) == 0, argv
    records = read_jsonl(tmp_path / "search.jsonl")
    assert len(records) == 58 and {r["policy"] for r in records} == {"expert-eps0.3", "random"}  # 29 per policy
    assert any(r["success"] for r in records)


@pytest.mark.slow  # ~30 s: a scenario server per episode
def test_the_documented_awm_commands_run(tmp_path, monkeypatch):
    pytest.importorskip("fastapi_mcp", reason="the awm environment needs the [awm] extra")
    block = marked_block("docs/environments.md", "test_the_documented_awm_commands_run")
    monkeypatch.chdir(tmp_path)
    commands = [argv for argv in block.commands() if argv[0] != "train"]  # the mark: train is not run (a minute)
    assert [argv[0] for argv in commands] == ["awm-examples", "collect"]
    for argv in commands:
        assert exit_status(argv) == 0, argv
    records = read_jsonl(tmp_path / "awm.jsonl")
    assert len(records) == 12 and any(r["success"] for r in records)  # 6 episodes per policy


@pytest.mark.slow  # ~30 s: 30 household episodes, 4 candidates a step read by the oracle
def test_the_documented_household_guidance_runs(tmp_path, monkeypatch):
    block = marked_block("docs/guidance-evaluation.md", "test_the_documented_household_guidance_runs")
    monkeypatch.chdir(tmp_path)
    (argv,) = block.commands()
    assert exit_status(argv) == 0
    report = json.loads((tmp_path / "guide.json").read_text())
    assert report  # the Table 9 layout: natural, random-of-4, meter-of-4
