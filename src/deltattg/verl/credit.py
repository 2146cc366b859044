"""Step-level credit for verl's batch: one row per step, steps identified by explicit indices, never by row order.

What verl hands the advantage step (v1 trainer, multi-output agent loop): rows keyed ``"{uid}_{session}_{index}"``
(uid = the prompt group, session = the rollout within it, index = the step), in whatever order ``_balance_batch``
left them, with synthetic padding rows tagged ``is_padding``; each row's ``extra_fields`` as the agent loop
(:mod:`deltattg.verl.agent_loop`) wrote them: ``deltattg_step`` and ``deltattg_tokens`` on every row and the
episode's trajectory record (``deltattg_trajectory``, the JSONL record format of ``deltattg collect``, with the
environment's reward) on its last row.

:func:`check_rows_in_step` checks that verl's tensors are the keys' rows, position by position;
:func:`step_row_credit` rebuilds the episodes, checks that the rows line up with the records, lets the frozen meter
read the decision states of the A ≠ 0 trajectories in one deduplicated call (Algorithm 1, lines 9–10), applies any
registered estimator and writes each step's Ã_{i,t} onto its row's tokens. A meter that fails (endpoint down, timeout,
garbage) leaves its readings invalid, so the groups concerned keep their GRPO advantages (``credit/invalid_group``);
the failure is counted in the metrics and training goes on — for ``max_failed_meter_steps`` consecutive steps at most
(:class:`MeterWatch`): then the run stops rather than train as GRPO under the method's name. Nothing here imports
verl.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from deltattg.credit import CreditConfig, get_estimator
from deltattg.credit.grpo import outcome_advantage
from deltattg.credit.layouts import StepLayoutError, meter_readings
from deltattg.credit.records import trajectory_batch
from deltattg.data.trajectory import Trajectory, parse_trajectory
from deltattg.meter.base import Meter
from deltattg.meter.loading import read_states

log = logging.getLogger(__name__)

STEP_FIELD = "deltattg_step"  # extra_fields key on every row: the step index t of the row's action
TOKENS_FIELD = "deltattg_tokens"  # extra_fields key on every row: how many response tokens the row's action has
TRAJECTORY_FIELD = "deltattg_trajectory"  # extra_fields key on an episode's last row: its trajectory record


@dataclass(frozen=True)
class RowKey:
    """Where a row belongs: its prompt group (verl's uid), its episode (uid + session) and its step index."""

    group: str
    episode: str
    step: int


def parse_row_key(key: str) -> RowKey:
    """``"{uid}_{session}_{index}"`` (verl's TransferQueue key of one agent-loop output) -> :class:`RowKey`."""
    parts = str(key).rsplit("_", 2)
    if len(parts) != 3 or not parts[2].isdigit():
        raise StepLayoutError(f"row key {key!r} is not '<uid>_<session>_<step>' (one agent-loop output per step)")
    return RowKey(parts[0], f"{parts[0]}_{parts[1]}", int(parts[2]))


@dataclass
class Episodes:
    """The non-padding rows grouped into episodes (in order of first appearance) with their trajectory records."""

    rows: list[int]  # batch positions of the real rows
    episode_of_row: list[int]  # episode index of each real row
    step_of_row: list[int]  # step index of each real row
    trajectories: list[Trajectory]
    groups: list[str]  # verl uid of each episode
    names: list[str]  # uid_session of each episode, for error messages


def gather_episodes(
    keys: Sequence[str], padding: Sequence[bool], extra_fields: Sequence[Mapping[str, Any] | None]
) -> Episodes:
    """Group rows by episode and check the layout: each episode's step indices are exactly 0..T−1, each row's
    ``deltattg_step`` equals its key's index, exactly one row carries the trajectory record and that record has T
    actions. ``StepLayoutError`` / ``InputError`` name the episode otherwise."""
    index: dict[str, int] = {}
    out = Episodes([], [], [], [], [], [])
    records: dict[int, dict] = {}
    steps: dict[int, list[int]] = {}
    for row, (key, pad, extra) in enumerate(zip(keys, padding, extra_fields, strict=True)):
        if pad:
            continue
        where = parse_row_key(key)
        extra = extra or {}
        if extra.get(STEP_FIELD) != where.step:
            raise StepLayoutError(f"episode {where.episode}: row {key!r} has {STEP_FIELD}={extra.get(STEP_FIELD)!r} "
                                  f"but its key says step {where.step} (rows from deltattg's agent loop?)")  # fmt: skip
        e = index.setdefault(where.episode, len(index))
        if e == len(out.names):
            out.names.append(where.episode)
            out.groups.append(where.group)
        out.rows.append(row)
        out.episode_of_row.append(e)
        out.step_of_row.append(where.step)
        steps.setdefault(e, []).append(where.step)
        if TRAJECTORY_FIELD in extra:
            if e in records:
                raise StepLayoutError(f"episode {where.episode}: two rows carry its {TRAJECTORY_FIELD}")
            records[e] = extra[TRAJECTORY_FIELD]
    for e, name in enumerate(out.names):
        if sorted(steps[e]) != list(range(len(steps[e]))):
            raise StepLayoutError(f"episode {name}: step indices {sorted(steps[e])} are not 0..T−1")
        if e not in records:
            raise StepLayoutError(f"episode {name}: no row carries its {TRAJECTORY_FIELD} record")
        trajectory = parse_trajectory(records[e])
        if trajectory.num_steps != len(steps[e]):
            raise StepLayoutError(f"episode {name} (trajectory {trajectory.id}): {len(steps[e])} step rows in the "
                                  f"batch but its record has {trajectory.num_steps} actions")  # fmt: skip
        out.trajectories.append(trajectory)
    return out


def check_rows_in_step(
    keys: Sequence[str],
    padding: Sequence[bool],
    extra_fields: Sequence[Mapping[str, Any] | None],
    uids: Sequence[Any] | None,
    response_mask: Tensor,
) -> None:
    """That the rows verl's advantage step hands an estimator are those of ``keys``, position by position: each real
    row's uid (verl's ``index``) is its key's, and its response mask ends within the response length the agent loop
    recorded for that key (``deltattg_tokens``). So two rows of different lengths that swapped places are caught even
    within one group (rejection sampling may clear mask tokens, never add any). verl passes nothing else per row:
    two rows of one group with equal lengths cannot be told apart. ``StepLayoutError`` names the row."""
    width = response_mask.shape[1]
    ends = (response_mask.bool() * torch.arange(1, width + 1, device=response_mask.device)).amax(dim=1).tolist()
    for row, (key, pad, extra) in enumerate(zip(keys, padding, extra_fields, strict=True)):
        if pad:
            continue
        if uids is not None and parse_row_key(key).group != str(uids[row]):
            raise StepLayoutError(f"row {key!r} arrived with uid {uids[row]!r}: rows and keys are out of step")
        tokens = (extra or {}).get(TOKENS_FIELD)
        if not isinstance(tokens, numbers.Integral) or isinstance(tokens, bool):
            raise StepLayoutError(f"row {key!r} has {TOKENS_FIELD}={tokens!r}, not its number of response tokens "
                                  "(rows from deltattg's agent loop?)")  # fmt: skip
        if ends[row] > tokens:
            raise StepLayoutError(f"row {key!r} arrived with a response of {ends[row]} tokens but its action has "
                                  f"{tokens}: rows and keys are out of step")  # fmt: skip


@dataclass
class RowCredit:
    advantages: Tensor  # [rows, L]: Ã_{i,t} on every response token of step t's row, 0 on padding rows
    metrics: dict[str, float]


def step_row_credit(
    method: str,
    config: CreditConfig,
    keys: Sequence[str],
    padding: Sequence[bool],
    extra_fields: Sequence[Mapping[str, Any] | None],
    response_mask: Tensor,
    meter: Meter | None = None,
) -> RowCredit:
    """Per-token advantages of verl's step rows by estimator ``method`` (see the module docstring).

    An episode's outcome R_i is the environment's reward in its trajectory record, never the rows' token-level
    rewards (which verl may have shaped, e.g. with a KL penalty). Works on the device of ``response_mask``.
    """
    estimator = get_estimator(method)
    if problem := estimator.records_problem():
        raise ValueError(f"{method} cannot run inside verl: {problem}")
    if estimator.needs_meter and meter is None:
        raise ValueError(f"{method} reads a frozen meter: set algorithm.deltattg.meter")
    device = response_mask.device
    episodes = gather_episodes(keys, padding, extra_fields)
    n = len(episodes.trajectories)
    step_tokens: list[list[int]] = [[0] * t.num_steps for t in episodes.trajectories]
    lengths = response_mask.sum(dim=1).tolist()
    for row, e, t in zip(episodes.rows, episodes.episode_of_row, episodes.step_of_row):
        step_tokens[e][t] = int(lengths[row])
    batch = trajectory_batch(episodes.trajectories, step_tokens, estimator, episodes.groups, with_meter=False)
    metrics: dict[str, float] = {"deltattg/episodes": float(n)}
    if estimator.needs_meter:
        queried = estimator.queried(outcome_advantage(batch, config)).tolist()
        readings, meter_metrics = read_safely(meter, episodes.trajectories, queried)  # type: ignore[arg-type]
        metrics |= meter_metrics
        batch.meter = meter_readings(readings, batch.step_mask.shape[1])
    credit = estimator(batch, config)
    metrics |= {f"deltattg/{k}": float(v) for k, v in (credit.fallback_counts() | credit.metrics).items()}
    advantages = torch.zeros(response_mask.shape, dtype=torch.float32, device=device)
    if episodes.rows:
        rows = torch.tensor(episodes.rows, device=device)
        values = credit.step_advantages[episodes.episode_of_row, episodes.step_of_row].to(device)
        advantages[rows] = values[:, None] * response_mask[rows].float()
    return RowCredit(advantages, metrics)


def read_safely(
    meter: Meter, trajectories: Sequence[Trajectory], queried: Sequence[bool]
) -> tuple[list[list[Any]], dict[str, float]]:
    """:func:`read_states` that never stops training: a meter that raises leaves every reading invalid (the groups
    fall back to GRPO), counted as ``deltattg/meter_errors``."""
    try:
        readings, stats = read_states(meter, trajectories, queried)
    except Exception as error:  # noqa: BLE001 - any meter fault is contained here, by design
        log.warning("deltattg: the meter failed (%s: %s); these groups keep their GRPO advantages",
                    type(error).__name__, error)  # fmt: skip
        return [[None] * t.num_steps for t in trajectories], {"deltattg/meter_errors": 1.0}
    return readings, {"deltattg/meter_errors": 0.0} | {f"deltattg/meter_{k}": float(v) for k, v in vars(stats).items()}


class MeterFailing(RuntimeError):
    """The frozen meter gave no valid reading for too many consecutive training steps."""


def meter_step_failed(metrics: Mapping[str, float]) -> bool | None:
    """Whether a step's meter read failed as a whole — the meter raised, or none of the states it was asked about got
    a valid reading; None when the step asked the meter nothing (no trajectory with A ≠ 0, or no meter)."""
    if metrics.get("deltattg/meter_errors", 0.0) > 0:
        return True
    states = metrics.get("deltattg/meter_states", 0.0)
    return None if states == 0 else metrics.get("deltattg/meter_invalid", 0.0) == states


@dataclass
class MeterWatch:
    """Counts consecutive failed meter steps (:func:`meter_step_failed`); the ``limit``-th raises :class:`MeterFailing`
    (``limit`` 0: never). A step that asked the meter nothing leaves the count as it is."""

    limit: int
    failed_in_a_row: int = 0

    def record(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        failed = meter_step_failed(metrics)
        if failed is None:
            return
        self.failed_in_a_row = self.failed_in_a_row + 1 if failed else 0
        if self.limit and self.failed_in_a_row >= self.limit:
            where = f" (training step {step})" if step is not None else ""
            raise MeterFailing(f"the meter gave no valid reading for {self.failed_in_a_row} consecutive training "
                               f"steps{where}: the run would train as GRPO under the method's name, so it stops. "
                               "Check the meter (endpoint up? the log names each failure), or raise "
                               "algorithm.deltattg.max_failed_meter_steps (0: never stop)")  # fmt: skip


@dataclass(frozen=True)
class VerlSettings:
    """The ``algorithm.deltattg`` section of a verl config: the credit hyperparameters (``CreditConfig`` fields)
    and the frozen meter — a saved meter folder loaded beside the trainer, an ``http(s)://`` endpoint (vLLM / SGLang
    serving the generative meter; ``meter_model`` names it, ``turn_limit`` the turn limit it was trained under, so
    that each prompt states the turns left) or ``oracle`` (household; ``tokenizer`` counts tokens);
    ``max_failed_meter_steps`` consecutive steps without a valid meter reading stop the run (0: never)."""

    credit: CreditConfig
    meter: str | None = None
    meter_model: str | None = None
    meter_timeout_s: float = 60.0
    tokenizer: str | None = None
    turn_limit: int | None = None
    max_failed_meter_steps: int = 5

    METER_KEYS = ("meter", "meter_model", "meter_timeout_s", "tokenizer", "turn_limit", "max_failed_meter_steps")

    @classmethod
    def from_section(cls, section: Mapping[str, Any] | None) -> VerlSettings:
        """Settings from the section (a mapping); an unknown key is an error naming it."""
        section = dict(section or {})
        credit_keys = {f.name for f in fields(CreditConfig)}
        unknown = sorted(set(section) - credit_keys - set(cls.METER_KEYS))
        if unknown:
            known = ", ".join(sorted(credit_keys | set(cls.METER_KEYS)))
            raise ValueError(f"algorithm.deltattg.{unknown[0]}: unknown setting (known: {known})")
        credit = CreditConfig(**{k: v for k, v in section.items() if k in credit_keys})
        limit = section.get("max_failed_meter_steps", 0)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ValueError(f"algorithm.deltattg.max_failed_meter_steps: a whole number >= 0, got {limit!r}")
        return cls(credit, **{k: section[k] for k in cls.METER_KEYS if k in section})

    def check_for(self, method: str) -> None:
        """Refuse, when the trainer is built, a setting ``method`` needs and the section lacks (the failure cost C)."""
        if get_estimator(method).needs_failure_cost and self.credit.failure_cost is None:
            raise ValueError(f"algorithm.adv_estimator={method} needs the failure cost C (Eq. 7): set "
                             "algorithm.deltattg.failure_cost, e.g. the turn limit × the longest action in tokens "
                             "(`deltattg methods` explains it)")  # fmt: skip

    def load_meter(self, method: str, device: Any = "cpu") -> Meter | None:
        """The frozen meter ``method`` reads (None for methods that read none)."""
        estimator = get_estimator(method)
        if not estimator.needs_meter:
            return None
        if self.meter is None:
            raise ValueError(f"algorithm.adv_estimator={method} reads a frozen meter: set algorithm.deltattg.meter")
        from deltattg.meter.loading import load_meter

        return load_meter(self.meter, endpoint_model=self.meter_model, endpoint_timeout_s=self.meter_timeout_s,
                          device=device, readout=estimator.readout, tokenizer=self.tokenizer,
                          turn_limit=self.turn_limit)  # fmt: skip
