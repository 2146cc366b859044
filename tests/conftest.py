"""Shared fixtures: paths to ../shared data (tests skip when absent) and a tiny offline HF tokenizer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("DELTATTG_SHARED", REPO.parent / "shared"))


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


def make_tiny_tokenizer(words: list[str] | None = None):
    """A word-level HF tokenizer with a ChatML template, built offline (no hub)."""
    from deltattg.tiny import word_tokenizer

    return word_tokenizer(words or "go to take put the a mug cup from in on search query answer yes no".split())


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return make_tiny_tokenizer()
