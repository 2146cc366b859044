"""Completions from recorded decision states: put the environment back into state s_t of a record (checked replay,
``rollout.replay``) and let a completer policy finish the episode K times within the turns the record had left —
the Monte-Carlo evidence of Math-Shepherd, VinePPO and AgentPRM (Choudhury 2025), from which ``data.labels`` makes
``rollout`` and ``best-of-k`` labels.

All completions of a batch of states are played together (one batched ``act`` per turn, ``rollout.engine.play``),
``chunk`` episodes at a time. States that are the same state (one task, one transcript to the decision, the same
turns left: the records of a pool share their first states) are completed once and share the completions. Each
state is replayed once; its K copies come from the environment's
``snapshot``/``restore`` where it has them, else from K more replays. A completion's tokens are the completer's
generated ids where it records them (an LM), else each action's assistant turn counted with ``count_action``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tqdm import tqdm

from deltattg.data.labels import Continuation
from deltattg.rollout.engine import Episode, Policy, play
from deltattg.envs.replay import RecordedEpisode, check_replay
from deltattg.rollout.replay import copy_episode, resume


@dataclass
class CompletionCost:
    """What completing cost: replays and completion episodes played, environment steps taken (replays included),
    tokens the completions spent and the wall time."""

    states: int = 0
    unreplayable: int = 0
    episodes: int = 0
    env_steps: int = 0
    completer_tokens: int = 0
    seconds: float = 0.0
    mismatches: dict[str, int] = field(default_factory=dict)  # why states did not replay, counted

    def add(self, other: CompletionCost) -> None:
        for name in ("states", "unreplayable", "episodes", "env_steps", "completer_tokens", "seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for why, count in other.mismatches.items():
            self.mismatches[why] = self.mismatches.get(why, 0) + count

    def count_mismatch(self, why: str) -> None:
        self.mismatches[why] = self.mismatches.get(why, 0) + 1

    def as_dict(self) -> dict:
        return {"states": self.states, "unreplayable": self.unreplayable, "completion_episodes": self.episodes,
                "env_steps": self.env_steps, "completer_tokens": self.completer_tokens,
                "seconds": round(self.seconds, 3), "mismatches": dict(self.mismatches)}  # fmt: skip


Completions = dict[tuple[int, int], list[Continuation] | None]  # (record, t) -> K continuations; None: not replayable


def continuation_of(episode: Episode, resumed_at: int, count_action: Callable[[str], int]) -> tuple[Continuation, int]:
    """The continuation an episode resumed with ``resumed_at`` messages in its transcript played, and the tokens it
    spent: its steps' generated ids where recorded (a resumed episode's ``steps`` are its own), else each reply
    counted with ``count_action``."""
    new_steps = episode.steps
    replies = [m for m in episode.messages[resumed_at:] if m.get("role") == "assistant"]
    if new_steps and all(step.token_ids is not None for step in new_steps):
        tokens = sum(len(step.token_ids or []) for step in new_steps)
    else:
        tokens = sum(count_action(str(m.get("content") or "")) for m in replies)
    return Continuation(bool(episode.won), float(tokens)), tokens


def complete_states(
    recorded: Sequence[RecordedEpisode],
    policy: Policy,
    completions: int,
    count_action: Callable[[str], int],
    *,
    only: set[tuple[int, int]] | None = None,
    chunk: int = 256,
    progress: bool = False,
) -> tuple[Completions, CompletionCost]:
    """``completions`` continuations by ``policy`` of every nonterminal decision state s_0..s_{T−1} of every record
    (of the states ``only`` names, where given: ``(record, t)``), each within the turns the record had left there
    (its ``max_turns`` − t); states that do not replay map to ``None`` (counted in the cost, with why)."""
    if completions < 1:
        raise ValueError(f"completions must be at least 1, got {completions}")
    started = time.perf_counter()
    cost = CompletionCost()
    out: Completions = {}
    states: list[tuple[int, int]] = []
    for i, record in enumerate(recorded):
        wanted = [t for t in range(record.num_steps) if only is None or (i, t) in only]
        if not wanted:
            continue
        check = check_replay(record)
        cost.env_steps += max(check.replayed - 1, 0)
        for t in wanted:
            if t < check.replayed:
                states.append((i, t))
            else:
                out[i, t] = None
                cost.unreplayable += 1
                cost.count_mismatch(check.mismatch or "unknown")
    cost.states = len(states) + cost.unreplayable
    states, same_as = distinct_states(recorded, states)
    per_chunk = max(chunk // completions, 1)
    bar = tqdm(total=len(states), desc=f"completions ({policy.name})", unit="state", disable=not progress)
    for start in range(0, len(states), per_chunk):
        batch = states[start : start + per_chunk]
        episodes, owners = [], []
        for i, t in batch:
            record = recorded[i]
            first = resume(record, t)
            cost.env_steps += t
            if first is None:  # reproduced in the check, not now: a nondeterministic environment
                out[i, t] = None
                cost.unreplayable += 1
                cost.count_mismatch("replays differently each time")
                continue
            copies = [first]
            for k in range(1, completions):
                copy = copy_episode(first, record.make_env(), k)
                if copy is None:
                    copy = resume(record, t, index=k)
                    cost.env_steps += t
                copies.append(copy)
            if any(c is None for c in copies):
                out[i, t] = None
                cost.unreplayable += 1
                continue
            episodes += copies
            owners += [(i, t)] * completions
        left = [recorded[i].max_turns - t for i, t in owners]
        resumed_at = [len(e.messages) for e in episodes]
        play(episodes, policy, left)
        for (i, t), episode, at in zip(owners, episodes, resumed_at):
            continuation, tokens = continuation_of(episode, at, count_action)
            out.setdefault((i, t), []).append(continuation)  # type: ignore[union-attr]
            cost.env_steps += len(episode.steps)
            cost.completer_tokens += tokens
            cost.episodes += 1
        bar.update(len(batch))
    bar.close()
    for state, first in same_as.items():
        out[state] = out[first]
    cost.seconds = time.perf_counter() - started
    return out, cost


def distinct_states(recorded: Sequence[RecordedEpisode], states: Sequence[tuple[int, int]]
                    ) -> tuple[list[tuple[int, int]], dict[tuple[int, int], tuple[int, int]]]:
    """The states to complete — one of each set of states that are the same state: the same task, the same
    transcript up to the decision (``decision_state_keys``: what a completer reads, and the actions that led there)
    and the same turns left — and, for every other state, the one whose completions it shares."""
    from deltattg.data.trajectory import decision_state_keys

    keys = {i: decision_state_keys(recorded[i].trajectory) for i in {i for i, _ in states}}
    first: dict[tuple, tuple[int, int]] = {}
    kept, same_as = [], {}
    for i, t in states:
        key = (recorded[i].task.id, recorded[i].max_turns - t, keys[i][t])
        if key in first:
            same_as[i, t] = first[key]
        else:
            first[key] = (i, t)
            kept.append((i, t))
    return kept, same_as
