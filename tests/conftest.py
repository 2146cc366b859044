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


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tiny_tokenizer(words: list[str] | None = None):
    """A word-level HF tokenizer with a ChatML template, built offline (no hub)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>"]
    base = words or "system user assistant tool go to take put the a mug cup from in on search query answer yes no".split()
    vocab = {w: i for i, w in enumerate(specials + base + [str(d) for d in range(10)] + list("{}[]:,.\"'_\n"))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<|im_end|>")
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    fast.chat_template = CHATML
    return fast


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return make_tiny_tokenizer()
