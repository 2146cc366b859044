"""Supervision for the progress meter: one label per decision prefix (§3.1 Eq. 1–2, E.6 alternatives).

Targets:
  * ``ttg``   — Token-to-Go, TTG_t = Σ_{u≥t} n_u (Eq. 1), ``null`` for unsuccessful trajectories (Eq. 2);
  * ``steps`` — Step-to-Go: remaining action units, where (as in E.6) an assistant message counts its text block and
    each of its tool calls (at least 1), so a plain-text agent counts remaining actions; ``null`` when unsuccessful;
  * ``score`` — Future Score: the trajectory's final outcome (its ``reward``) for every prefix (E.6, E.4 +value).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from deltattg.data.tokens import text_of
from deltattg.data.trajectory import Trajectory, assistant_indices, state_prefixes

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


# ---- labels from continuations of the state (``deltattg labels --labels rollout | best-of-k``) ------------------------
LABEL_SOURCES: tuple[str, ...] = ("outcome", "rollout", "best-of-k", "td")


@dataclass(frozen=True)
class Continuation:
    """One way an episode went on from a decision state: whether it succeeded, and the assistant tokens it spent
    from the state to its end (Σ_{u≥t} n_u of Eq. 1 over its own actions)."""

    success: bool
    tokens: float


@dataclass(frozen=True)
class StateLabel:
    """A decision state's supervision: ``can_complete`` (b, a hard label), ``completion_rate`` (a soft target in
    [0, 1] where the source gives one, else b), ``tokens_to_go`` (v; None where no continuation succeeded) and the
    ``source`` that made it (``outcome`` also where a replay-based source could not reach the state)."""

    can_complete: bool
    tokens_to_go: float | None
    source: str
    completion_rate: float | None = None

    @property
    def target(self) -> float:
        """The completion target a meter learns (soft where the source gives a rate)."""
        return float(self.can_complete) if self.completion_rate is None else self.completion_rate


def outcome_label(success: bool, tokens_to_go: float) -> StateLabel:
    """The paper's label of a state (Eq. 1–2): the trajectory's own outcome, and its own remaining tokens on success."""
    return StateLabel(success, float(tokens_to_go) if success else None, "outcome")


def rollout_label(completions: Sequence[Continuation]) -> StateLabel:
    """Monte-Carlo label of a state from K completions (Math-Shepherd's soft estimate, VinePPO, AgentPRM): b̃ = their
    success rate, v = the mean remaining tokens of the successful ones (None when none succeeded); the hard b is
    b̃ ≥ 1/2."""
    if not completions:
        raise ValueError("a rollout label needs at least one completion")
    wins = [c.tokens for c in completions if c.success]
    rate = len(wins) / len(completions)
    return StateLabel(rate >= 0.5, sum(wins) / len(wins) if wins else None, "rollout", rate)


def best_of_k_labels(success: bool, step_tokens: Sequence[int],
                     completions: Sequence[Sequence[Continuation] | None]) -> list[StateLabel]:
    """Best-of-K labels of every state s_0..s_T of one trajectory from the completions of its nonterminal states (None
    where a state did not replay): s_t is completable when a continuation from it succeeded — one of its K
    completions, or the record's own path to a later state s_u and on from there (the record's own end, or one of
    s_u's completions) — and its remaining work is the fewest tokens among those successes:

        v_t = min( {tokens of s_t's successful completions} ∪ {n_t + v_{t+1}} ),   v_T = 0 on success, else none

    (b_t = v_t exists). A success proves a state completable in the turns it had left, and the state before it, one
    more turn left, completable by the recorded action and then that success: what a planner's (b, v) read,
    estimated from policies, from above. A state that did not replay keeps its outcome label (source ``outcome``);
    states replay as a prefix of the record, so every state after it did not either."""
    if len(completions) != len(step_tokens):
        raise ValueError(f"{len(completions)} states' completions for a trajectory of {len(step_tokens)} steps")
    best: float | None = 0.0 if success else None
    labels = [outcome_label(success, 0)]
    for t in range(len(step_tokens) - 1, -1, -1):
        along = None if best is None else step_tokens[t] + best
        found = completions[t]
        wins = [c.tokens for c in found or () if c.success] + ([along] if along is not None else [])
        best = min(wins) if wins else None
        labels.append(StateLabel(best is not None, best, "best-of-k" if found is not None else "outcome"))
    return labels[::-1]


def td_labels(success: bool, step_tokens: Sequence[int], readings: Sequence[tuple[float, float | None] | None],
              lam: float = 0.0) -> list[StateLabel]:
    """Bootstrapped targets of every state s_0..s_T of one trajectory from a meter's own readings (TD(λ), as AgentPRM
    of Xi et al. 2025 does for process rewards; no resets): ``readings[t] = (p̂_t, v̂_t)`` for t = 0..T, None where the
    meter gave no valid reading. The terminal state is anchored to the outcome, (b̃_T, v_T) = (success, 0 if success
    else none); before it

        b̃_t = (1 − λ) · p̂_{t+1} + λ · b̃_{t+1},      v_t = n_t + (1 − λ) · v̂_{t+1} + λ · v_{t+1}

    (λ = 1: the outcome labels; λ = 0: one-step bootstrapping). A missing reading, or a missing v̂, passes the later
    return on unchanged; a failed trajectory's v has no Monte-Carlo end, so it is bootstrapped from v̂ alone."""
    count = len(step_tokens)
    if len(readings) != count + 1:
        raise ValueError(f"{len(readings)} readings for a trajectory of {count} steps (needs {count + 1})")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"λ must be in [0, 1], got {lam}")
    rate = [0.0] * (count + 1)
    value: list[float | None] = [None] * (count + 1)
    rate[count], value[count] = float(success), (0.0 if success else None)
    for t in range(count - 1, -1, -1):
        anchored = t + 1 == count or readings[t + 1] is None  # the outcome at T; a missing reading passes it on
        p_next, v_next = (rate[t + 1], value[t + 1]) if anchored else readings[t + 1]  # type: ignore[misc]
        rate[t] = (1 - lam) * p_next + lam * rate[t + 1]
        later = value[t + 1]
        if later is None or v_next is None:
            ahead = v_next if later is None else later
        else:
            ahead = (1 - lam) * v_next + lam * later
        value[t] = None if ahead is None else step_tokens[t] + ahead
    return [StateLabel(r >= 0.5, v, "td", r) for r, v in zip(rate, value)]


# ---- a pool's labels from a source (``rollout.label_sources`` makes them; meter training reads them) -------------
SETTINGS_KEY = "labelling"  # each label record's copy of the settings that made it
REPLAYED_SOURCES = ("rollout", "best-of-k")


@dataclass(frozen=True)
class LabelSettings:
    """Everything that shapes a set of labels, recorded in every label record (:data:`SETTINGS_KEY`) so that a file
    or cache made otherwise is never resumed or reused: the ``source``; for the replay sources the ``completer`` (a
    policy spec, as ``collect`` takes it), the ``completions`` per state, the ``seed`` (for ``best-of-k``,
    ``until_success``: completions in rounds, :func:`completion_rounds`, none more for a state once it is proven
    completable), the ``environment`` the completer plays (``--env`` and its options; None: each record's own
    description), the turn limit of records without one (``max_turns``), the ``tokenizer`` that counts completion
    tokens and the completer's sampling (``completer_temperature``, ``completer_max_new_tokens``); for ``td`` the
    bootstrap meter, the digest of its files (a meter retrained at the same path is another meter) and λ.
    What a trajectory's labels are made from (its messages, step tokens, outcome and provenance) is checked apart,
    by :func:`trajectory_digest`."""

    source: str = "outcome"
    completer: str | None = None
    completions: int = 4
    seed: int = 0
    bootstrap_meter: str | None = None
    td_lambda: float = 0.0
    until_success: bool = False  # best-of-k: complete in rounds, a state proven completable gets no more
    environment: dict[str, Any] | None = None  # replay sources: the environment the command line names, else None
    max_turns: int | None = None  # replay sources: the turn limit of records that carry none
    tokenizer: str | None = None  # replay sources: what counts the completions' tokens
    completer_temperature: float | None = None
    completer_max_new_tokens: int | None = None
    bootstrap_meter_sha256: str | None = None  # td: the bootstrap meter's files

    def __post_init__(self) -> None:
        if self.source not in LABEL_SOURCES:
            raise ValueError(f"unknown label source {self.source!r}; choose from {', '.join(LABEL_SOURCES)}")
        if self.source in REPLAYED_SOURCES and not self.completer:
            raise ValueError(f"--labels {self.source} completes each state with a policy: give --completer POLICY "
                             "(random, expert:EPS, lm:MODEL, an actor folder as lm:DIR)")
        if self.source not in REPLAYED_SOURCES and self.completer:
            raise ValueError(f"--completer plays completions for --labels rollout or best-of-k, not {self.source}")
        if self.source == "td" and not self.bootstrap_meter:
            raise ValueError("--labels td bootstraps from a meter's readings: give --bootstrap-meter METER (e.g. one "
                             "trained on --labels outcome)")
        if self.source != "td" and self.bootstrap_meter:
            raise ValueError("--bootstrap-meter is read by --labels td only")
        if self.completions < 1:
            raise ValueError(f"--completions must be at least 1, got {self.completions}")
        if not 0.0 <= self.td_lambda <= 1.0:
            raise ValueError(f"--td-lambda must be in [0, 1], got {self.td_lambda}")
        if self.until_success and self.source != "best-of-k":
            raise ValueError("--until-success stops completing a state proven completable: --labels best-of-k only")

    def to_json(self) -> dict[str, Any]:
        """The settings that shaped the labels (those a source does not read left out, so an ``outcome`` set reads
        ``{"source": "outcome"}``; unset ones left out too)."""
        out: dict[str, Any] = {"source": self.source}
        if self.source in REPLAYED_SOURCES:
            out |= {"completer": self.completer, "completions": self.completions, "seed": self.seed}
            replay = {"environment": self.environment, "max_turns": self.max_turns, "tokenizer": self.tokenizer,
                      "completer_temperature": self.completer_temperature,
                      "completer_max_new_tokens": self.completer_max_new_tokens}  # fmt: skip
            out |= {key: value for key, value in replay.items() if value is not None}
        if self.until_success:
            out["until_success"] = True
        if self.source == "td":
            out |= {"bootstrap_meter": self.bootstrap_meter, "td_lambda": self.td_lambda}
            if self.bootstrap_meter_sha256 is not None:
                out["bootstrap_meter_sha256"] = self.bootstrap_meter_sha256
        return out


DIGEST_KEY = "trajectory_sha256"  # each label record's digest of what its trajectory's labels are made from


def trajectory_digest(trajectory: Trajectory, step_tokens: Sequence[int]) -> str:
    """SHA-256 of what a trajectory's labels are made from: its messages (the actions and what they showed), its
    step token counts, its outcome and where it was played (the task and environment a replay rebuilds). A pool
    collected again under the same ids, or a record edited, gets other digests, so its old labels are not taken for
    its new ones."""
    content = {"messages": trajectory.messages, "step_tokens": list(step_tokens), "success": trajectory.success,
               "task": trajectory.extra.get("task"), "env": trajectory.extra.get("env")}  # fmt: skip
    text = json.dumps(content, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def completion_rounds(completions: int) -> list[int]:
    """How ``best-of-k --until-success`` spends K completions per state: rounds of 1, 1, 2, 4, ... (the last cut to
    reach K), each played only for the states not yet proven completable."""
    rounds: list[int] = []
    while sum(rounds) < completions:
        rounds.append(min(max(sum(rounds), 1), completions - sum(rounds)))
    return rounds


def outcome_labels(trajectory: Trajectory, step_tokens: Sequence[int]) -> list[StateLabel]:
    """Eq. 1–2 labels of s_0..s_T (the terminal state anchored: b = success, v = 0 on success)."""
    return [outcome_label(trajectory.success, ttg) for ttg in remaining_sums(step_tokens)]


def replayed_labels(source: str, trajectory: Trajectory, step_tokens: Sequence[int],
                    completions: Sequence[list[Continuation] | None]) -> list[StateLabel]:
    """``rollout`` or ``best-of-k`` labels of s_0..s_T from each nonterminal state's completions (None: the state did
    not replay, and keeps its outcome label); the terminal state is anchored to the outcome."""
    if source == "best-of-k":
        return best_of_k_labels(trajectory.success, step_tokens, completions)
    own = remaining_sums(step_tokens)
    labels = [outcome_label(trajectory.success, own[t]) if found is None else rollout_label(found)
              for t, found in enumerate(completions)]  # fmt: skip
    return [*labels, outcome_label(trajectory.success, 0)]


def label_records(trajectory: Trajectory, labels: Sequence[StateLabel], settings: LabelSettings,
                  completions: Sequence[list[Continuation] | None] = (), *, terminal: bool = False,
                  digest: str | None = None) -> list[dict]:
    """One record per decision state t = 0..T−1 (and T with ``terminal``), as ``deltattg labels`` writes them: ``id``,
    ``group``, ``step``, ``can_complete``, ``tokens_to_go`` (null where unknown), ``source``, the soft
    ``completion_rate`` where the source gives one, for replay sources ``replayed`` and ``completions`` (successes
    of how many), ``policy``, the prefix ``messages``, the settings (``labelling``) and, where given, the
    trajectory's :func:`trajectory_digest` (``trajectory_sha256``)."""
    prefixes = state_prefixes(trajectory.messages, terminal) if trajectory.messages is not None else None
    out = []
    count = trajectory.num_steps + (1 if terminal else 0)
    for t, label in enumerate(labels[:count]):
        record: dict[str, Any] = {"id": trajectory.id, "group": trajectory.group, "step": t,
                                  "can_complete": label.can_complete,
                                  "tokens_to_go": _plain(label.tokens_to_go) if label.can_complete else None,
                                  "source": label.source}  # fmt: skip
        if label.completion_rate is not None:
            record["completion_rate"] = label.completion_rate
        if label.tokens_to_go is not None and not label.can_complete:
            record["tokens_to_go_if_completed"] = _plain(label.tokens_to_go)
        if settings.source in REPLAYED_SOURCES and t < trajectory.num_steps:
            found = completions[t] if t < len(completions) else None
            record["replayed"] = found is not None
            if found is not None:
                record["completions"] = [sum(c.success for c in found), len(found)]
        if trajectory.policy is not None:
            record["policy"] = trajectory.policy
        if prefixes is not None:
            record["messages"] = prefixes[t]
        record[SETTINGS_KEY] = settings.to_json()
        if digest is not None:
            record[DIGEST_KEY] = digest
        out.append(record)
    return out


def _plain(value: float | None) -> float | int | None:
    return None if value is None else int(value) if float(value).is_integer() else value


def labels_of_records(records: Sequence[dict], trajectory: Trajectory) -> list[StateLabel]:
    """A trajectory's labels s_0..s_T back from its records in a label file (the terminal state anchored)."""
    by_step = {record["step"]: record for record in records}
    labels = []
    for t in range(trajectory.num_steps):
        record = by_step[t]
        value = record.get("tokens_to_go")
        if value is None:
            value = record.get("tokens_to_go_if_completed")
        labels.append(StateLabel(bool(record["can_complete"]), None if value is None else float(value),
                                 str(record.get("source", "outcome")), record.get("completion_rate")))  # fmt: skip
    return [*labels, outcome_label(trajectory.success, 0)]


