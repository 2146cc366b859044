"""Tiny actors and meters for CPU runs and tests: a word-level tokenizer with a ChatML template, built offline from
a vocabulary, a byte-level one for any text, and small randomly initialised Llama-architecture models."""

from __future__ import annotations

import string
from collections.abc import Iterable
from typing import Any

SPECIALS = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
BASE_WORDS = ["system", "user", "assistant", "tool", *string.digits, *string.punctuation]


def word_tokenizer(words: Iterable[str]) -> Any:
    """A word-level HF tokenizer (whitespace, then punctuation split) over ``words`` plus digits, punctuation and the
    chat roles, with a ChatML template; unknown words become ``<unk>``. Decoding joins words with spaces."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for word in [*SPECIALS, *BASE_WORDS, *words]:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<|im_end|>")
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    fast.chat_template = CHATML
    return fast


def byte_tokenizer() -> Any:
    """A byte-level HF tokenizer (one token per byte, GPT-2's byte alphabet, no merges) with a ChatML template: any
    text round-trips exactly, for environments whose text has no closed vocabulary (JSON tool calls, AWM)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {token: i for i, token in enumerate([*SPECIALS, *sorted(alphabet)])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<|im_end|>")
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    fast.chat_template = CHATML
    return fast


def tiny_llama(tokenizer: Any, *, hidden: int = 128, layers: int = 2, heads: int = 4, max_positions: int = 2048, seed: int = 0) -> Any:
    """A randomly initialised ``LlamaForCausalLM`` sized for CPU (h128 × 2 layers ≈ 0.7 M parameters with a small
    vocabulary), whose end-of-sequence token is the tokenizer's end of turn."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)
