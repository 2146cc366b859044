"""The progress meter's answer: one JSON object, written for SFT targets and read back by a strict parser (§3.1, D.2).

The meter answers every decision prefix with exactly one of::

    {"can_complete": true, "tokens_to_go": 412}
    {"can_complete": false, "tokens_to_go": null}

``can_complete`` comes first so that the E.4 (+logit) readout can read the next-token distribution after the fixed
prefix ``{"can_complete":`` (:data:`LOGIT_PREFIX`).

The parser is strict — an answer that is not exactly this object is invalid (``None``), never repaired or guessed:

* whitespace between tokens and around the object is tolerated (JSON whitespace only); the caller strips any
  end-of-turn/EOS marker the backend leaves in the text;
* the keys are exactly ``can_complete`` then ``tokens_to_go``, each once, in that order (the order is part of the
  format: it is what the logit readout relies on);
* ``can_complete`` is a JSON boolean; with ``true``, ``tokens_to_go`` is a JSON *integer literal* in
  ``[0, MAX_TOKENS_TO_GO]``; with ``false`` it is ``null``;
* no fraction or exponent (``412.0`` and ``4.12e2`` are invalid: the meter is trained on integers, and its GRPO
  format reward should not pay for drifting away from them), no sign (``-0`` is invalid), no ``NaN``/``Infinity``;
* nothing else: no extra keys, no trailing text, no second object, no Markdown fence.
"""

from __future__ import annotations

import json
import numbers
from typing import Any

from deltattg.data.trajectory import MeterOutput

LOGIT_PREFIX = '{"can_complete":'
"""The fixed answer prefix after which E.4 (+logit) reads log p(true) − log p(false) (Eq. 19)."""

MAX_TOKENS_TO_GO = 2**53
"""Largest accepted ``tokens_to_go``: every count up to it is exactly representable as a float."""

_KEYS = ("can_complete", "tokens_to_go")


class _Malformed(ValueError):
    """Raised inside the JSON decoder's hooks; never leaves this module."""


class _Pairs(tuple):
    """A decoded JSON object as its ``(key, value)`` pairs, in order and with duplicates (unlike a JSON array)."""


def format_answer(can_complete: bool, tokens_to_go: int | None) -> str:
    """The answer text for (b, v) of Eq. 2: the SFT target (Eq. 3) and the format :func:`parse_answer` accepts.

    ``tokens_to_go`` must be a non-negative integer (any ``numbers.Integral``, e.g. a NumPy integer) when
    ``can_complete`` and ``None`` otherwise.
    """
    if not isinstance(can_complete, bool):
        raise TypeError(f"can_complete must be a bool, got {can_complete!r}")
    if can_complete and not _is_count(tokens_to_go):
        raise ValueError(f"tokens_to_go must be an integer in [0, {MAX_TOKENS_TO_GO}], got {tokens_to_go!r}")
    if not can_complete and tokens_to_go is not None:
        raise ValueError(f"tokens_to_go must be None when not can_complete, got {tokens_to_go!r}")
    count = int(tokens_to_go) if can_complete else None  # type: ignore[arg-type]
    return json.dumps({"can_complete": can_complete, "tokens_to_go": count})


def parse_answer(text: Any) -> MeterOutput | None:
    """The reading ``(b̂, v̂)`` in ``text``, or ``None`` when it is not exactly a valid answer (see module doc).

    Never raises, whatever ``text`` is.
    """
    if not isinstance(text, str):
        return None
    try:
        pairs = _DECODER.decode(text)
    except (ValueError, RecursionError):  # JSONDecodeError and _Malformed are ValueErrors
        return None
    return _reading(pairs)


def _is_count(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS_TO_GO


def _reject(literal: str) -> Any:
    raise _Malformed(literal)


def _unsigned_int(literal: str) -> int:
    if literal.startswith("-") or len(literal) > len(str(MAX_TOKENS_TO_GO)):
        raise _Malformed(literal)
    return int(literal)


_DECODER = json.JSONDecoder(
    object_pairs_hook=_Pairs,
    parse_int=_unsigned_int,
    parse_float=_reject,  # any fraction or exponent
    parse_constant=_reject,  # NaN, Infinity, -Infinity
)


def _reading(pairs: Any) -> MeterOutput | None:
    """The MeterOutput for the decoded top-level value, if it is the answer object."""
    if not isinstance(pairs, _Pairs) or [key for key, _ in pairs] != list(_KEYS):
        return None
    can_complete, tokens_to_go = (value for _, value in pairs)
    if can_complete is True and _is_count(tokens_to_go):
        return MeterOutput(can_complete=True, tokens_to_go=tokens_to_go)
    if can_complete is False and tokens_to_go is None:
        return MeterOutput(can_complete=False, tokens_to_go=None)
    return None
