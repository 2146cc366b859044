"""Judging a search agent's answer: exact match after SQuAD's normalisation (the reward Search-R1, PaperSearchQA and
verl's ``search_r1_like_qa_em`` use) and token F1 (reported in ``info``)."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (SQuAD's ``normalize_answer``)."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def exact_match(prediction: str, golden: Sequence[str]) -> bool:
    """Whether the normalised prediction equals any normalised golden answer."""
    guess = normalize_answer(prediction)
    return any(guess == normalize_answer(answer) for answer in golden)


def f1_score(prediction: str, golden: Sequence[str]) -> float:
    """The best token-overlap F1 of the normalised prediction against the golden answers (0 for an empty one)."""
    guess = normalize_answer(prediction).split()
    best = 0.0
    for answer in golden:
        truth = normalize_answer(answer).split()
        common = sum((Counter(guess) & Counter(truth)).values())
        if common:
            precision, recall = common / len(guess), common / len(truth)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def mentions(text: str, golden: Sequence[str]) -> bool:
    """Whether a passage contains a golden answer (normalised, on word boundaries): evidence the agent has found it."""
    haystack = f" {normalize_answer(text)} "
    return any(f" {normalize_answer(answer)} " in haystack for answer in golden if normalize_answer(answer))
