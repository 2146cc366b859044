"""Credit over trajectory records — what ``deltattg credit`` runs: records in, records with advantages out."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from deltattg.credit.batch import Credit, CreditConfig, Fallback, StepBatch
from deltattg.credit.grpo import step_expanded_advantage
from deltattg.credit.layouts import factorize, step_batch
from deltattg.credit.registry import Estimator, Reads, available_estimators, get_estimator
from deltattg.data.sources import Located
from deltattg.data.tokens import located_step_tokens
from deltattg.data.trajectory import (
    Trajectory,
    anchor_observations,
    decision_state_keys,
    step_rewards,
    verified_outcomes,
)
from deltattg.errors import InputError


def needs_meter(method: str) -> bool:
    """Whether ``method`` reads meter readings (``dapo`` and other non-estimators read none)."""
    return method in available_estimators() and get_estimator(method).needs_meter


def queried(items: Sequence[Located], method: str = "deltattg") -> list[bool]:
    """Which trajectories the frozen meter reads for ``method`` (its query rule: A_i ≠ 0 under Eq. 14)."""
    import torch

    group, _ = factorize([item.trajectory.group for item in items])
    steps = torch.tensor([item.trajectory.num_steps for item in items])
    reward = torch.tensor([item.trajectory.reward for item in items])
    advantage = step_expanded_advantage(reward, steps, group, int(group.max()) + 1 if len(items) else 0)
    return get_estimator(method).queried(advantage).tolist()


def check_meter_readings(items: Sequence[Located], method: str) -> None:
    """Every record carries ``meter`` with the reading ``method`` uses in each non-null entry."""
    estimator = get_estimator(method)
    for item in items:
        meter = item.trajectory.meter
        if meter is None:
            raise InputError(f"missing, and --method {method} needs meter readings", path=item.path, line=item.line,
                             field="meter")  # fmt: skip
        problem = estimator.reading_problem([meter])
        if problem is not None:
            raise InputError(f"--method {method} reads {estimator.meter_field!r}, which this entry lacks",
                             path=item.path, line=item.line, field=f"meter[{problem[1]}].{estimator.meter_field}")


def check_anchors(items: Sequence[Located], method: str) -> None:
    """Every record gives each step an anchor observation (``steps[].observation`` or the messages around it)."""
    for item in items:
        if len(anchor_observations(item.trajectory)) != item.trajectory.num_steps:
            raise InputError(f"--method {method} groups steps by the observation each action answered: give the "
                             "record its messages or steps[].observation", path=item.path, line=item.line,
                             field="messages")  # fmt: skip


def check_answer_logprobs(items: Sequence[Located], method: str) -> None:
    """Every record carries ``answer_logprobs`` (its length, T + 1, and values were checked when it was read)."""
    for item in items:
        if item.trajectory.answer_logprobs is None:
            raise InputError(f"missing, and --method {method} reads the reference answer's mean token log-prob after "
                             f"0..T steps ({item.trajectory.num_steps + 1} numbers <= 0 here)", path=item.path,
                             line=item.line, field="answer_logprobs")  # fmt: skip


def assign_credit(items: Sequence[Located], method: str, config: CreditConfig, tokenizer: Any = None) -> list[dict]:
    """Run estimator ``method`` over all records at once; return each record with ``advantage``, ``step_weights``,
    ``step_advantages``, ``clip_scale`` (A²TGPO's per-step clip factors) and ``credit`` (why it was or was not
    redistributed) added."""
    estimator = get_estimator(method)
    if estimator.records_problem() is not None:  # it reads what no record carries (DelTA's hidden states)
        raise ValueError(estimator.records_problem())
    if needs_meter(method):
        check_meter_readings(items, method)
    if Reads.ANCHORS in estimator.reads:
        check_anchors(items, method)
    if Reads.ANSWER_PROBS in estimator.reads:
        check_answer_logprobs(items, method)
    step_tokens = [located_step_tokens(item, tokenizer) for item in items]
    batch = trajectory_batch([item.trajectory for item in items], step_tokens, estimator)
    credit = estimator(batch, config)
    return [_with_credit(item.record, credit, i, tokens) for i, (item, tokens) in enumerate(zip(items, step_tokens))]


def trajectory_batch(trajectories: Sequence[Trajectory], step_tokens: Sequence[Sequence[int]], estimator: Estimator,
                     groups: Sequence[Hashable] | None = None, *, with_meter: bool = True) -> StepBatch:
    """The per-trajectory layout of ``trajectories`` with the inputs ``estimator`` reads: meter readings, per-step
    rewards and anchor observations (:func:`deltattg.data.trajectory.step_rewards`, ``anchor_observations``), the
    reference answer's log-probs (``Trajectory.answer_logprobs``, which must then be set on every trajectory), the
    verified step outcomes (``steps[].verified``, :func:`~deltattg.data.trajectory.verified_outcomes`).
    ``groups``: the prompt group of each trajectory, when not its ``group`` field (the trainer's positional groups);
    ``with_meter=False`` leaves the readings out (the trainer reads them afterwards, for the queried trajectories)."""
    return step_batch(
        [t.reward for t in trajectories],
        [t.success for t in trajectories],
        [t.group for t in trajectories] if groups is None else groups,
        step_tokens,
        [t.meter for t in trajectories] if estimator.needs_meter and with_meter else None,  # type: ignore[misc]
        [step_rewards(t) for t in trajectories] if Reads.STEP_REWARDS in estimator.reads else None,
        [anchor_observations(t) for t in trajectories] if Reads.ANCHORS in estimator.reads else None,
        _answer_logprobs(trajectories) if Reads.ANSWER_PROBS in estimator.reads else None,
        [verified_outcomes(t) for t in trajectories] if Reads.VERIFIED in estimator.reads else None,
        [decision_state_keys(t) for t in trajectories] if Reads.HISTORIES in estimator.reads else None,
    )


def _answer_logprobs(trajectories: Sequence[Trajectory]) -> list[list[float]]:
    missing = [t.id for t in trajectories if t.answer_logprobs is None]
    if missing:
        raise ValueError(f"trajectory {missing[0]!r} has no answer_logprobs (the estimator reads them)")
    return [t.answer_logprobs for t in trajectories]  # type: ignore[misc]


def _with_credit(record: dict, credit: Credit, i: int, step_tokens: list[int]) -> dict:
    num_steps = len(step_tokens)
    out: dict[str, Any] = dict(record)
    out.setdefault("step_tokens", step_tokens)
    out["advantage"] = float(credit.advantage[i])
    if credit.step_weights is not None:
        out["step_weights"] = credit.step_weights[i, :num_steps].tolist()
    out["step_advantages"] = credit.step_advantages[i, :num_steps].tolist()
    if credit.clip_scale is not None:
        out["clip_scale"] = credit.clip_scale[i, :num_steps].tolist()
    out["credit"] = Fallback(int(credit.fallback[i])).name.lower()
    return out
