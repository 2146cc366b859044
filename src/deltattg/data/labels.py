"""Supervision for the progress meter: one label per decision prefix (§3.1 Eq. 1–2, E.6 alternatives).

Targets:
  * ``ttg``   — Token-to-Go, TTG_t = Σ_{u≥t} n_u (Eq. 1), ``null`` for unsuccessful trajectories (Eq. 2);
  * ``steps`` — Step-to-Go: remaining action units, where (as in E.6) an assistant message counts its text block and
    each of its tool calls (at least 1), so a plain-text agent counts remaining actions; ``null`` when unsuccessful;
  * ``score`` — Future Score: the trajectory's final outcome (its ``reward``) for every prefix (E.6, E.4 +value).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from deltattg.data.tokens import text_of
from deltattg.data.trajectory import Trajectory, assistant_indices

Target = Literal["ttg", "steps", "score"]
TARGETS: tuple[str, ...] = ("ttg", "steps", "score")
TARGET_FIELD = {"ttg": "tokens_to_go", "steps": "steps_to_go", "score": "score"}


def remaining_sums(counts: Sequence[int]) -> list[int]:
    """Suffix sums Σ_{u≥t} counts[u] for t = 0..T (the last one, the terminal prefix, is 0). Eq. 1 for token counts."""
    suffix = list(itertools.accumulate(reversed(counts)))[::-1]
    return [*suffix, 0]


def action_units(message: dict) -> int:
    """E.6's Step-to-Go unit count of one assistant message: its text block (if any) plus each tool call, at least 1."""
    units = (1 if text_of(message.get("content")).strip() else 0) + len(message.get("tool_calls") or [])
    return max(units, 1)


def prefix_labels(
    traj: Trajectory, step_tokens: Sequence[int] | None, *, target: Target = "ttg", terminal: bool = False
) -> Iterator[dict[str, Any]]:
    """One label record per decision prefix t = 0..T−1 (and t = T with ``terminal``), Eq. 2.

    Each record: ``id``, ``group``, ``step``, ``can_complete`` (b = success), the target field (see module doc) and,
    when the trajectory has messages, the prefix ``messages``.
    """
    num_steps = traj.num_steps
    if target == "ttg":
        if step_tokens is None:
            raise ValueError("the ttg target needs step token counts")
        remaining: list[Any] = remaining_sums(step_tokens)
    elif target == "steps":
        if traj.messages is not None:
            units = [action_units(traj.messages[i]) for i in assistant_indices(traj.messages)]
        else:
            units = [1] * num_steps
        remaining = remaining_sums(units)
    elif target == "score":
        remaining = [traj.reward] * (num_steps + 1)
    else:
        raise ValueError(f"unknown target {target!r}; choose from {', '.join(TARGETS)}")
    field = TARGET_FIELD[target]
    prefixes = list(traj.prefixes(terminal)) if traj.messages is not None else None
    for t in range(num_steps + (1 if terminal else 0)):
        record: dict[str, Any] = {"id": traj.id, "group": traj.group, "step": t, "can_complete": traj.success}
        if traj.policy is not None:
            record["policy"] = traj.policy
        record[field] = remaining[t] if (traj.success or target == "score") else None
        if prefixes is not None:
            record["messages"] = prefixes[t]
        yield record
