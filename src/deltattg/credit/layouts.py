"""The two layouts every estimator serves, mapped onto ``StepBatch`` and back.

* **per trajectory** — records (``deltattg credit``) or padded ``[n, S]`` step tensors;
* **flat token rows** — ``[rows, L]`` with a response mask, a group id and a trajectory id per row, as trainers hold
  them. A trajectory's steps are the contiguous runs of 1s in its rows' masks, in row order: verl-agent's one step
  per row and verl's whole conversation per row (environment tokens masked 0) are both covered.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from deltattg.credit.batch import Credit, CreditConfig, MeterReadings, StepBatch
from deltattg.credit.registry import get_estimator
from deltattg.data.trajectory import MeterOutput


def factorize(values: Sequence[Hashable] | np.ndarray | Tensor) -> tuple[Tensor, list]:
    """Dense codes 0..K−1 in order of first appearance, and the distinct values (like ``pandas.factorize``)."""
    if isinstance(values, Tensor):
        uniques, first, inverse = np.unique(values.cpu().numpy(), return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        return torch.from_numpy(rank[inverse.reshape(-1)]).long(), [uniques[i].item() for i in order]
    index: dict[Hashable, int] = {}
    codes = [index.setdefault(v, len(index)) for v in values]
    return torch.tensor(codes, dtype=torch.long), list(index)


def pad_steps(rows: Sequence[Sequence[float]], dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """Ragged per-trajectory lists -> padded ``[n, S]`` values and mask."""
    width = max((len(r) for r in rows), default=0)
    values = torch.zeros(len(rows), width, dtype=dtype)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        values[i, : len(row)] = torch.as_tensor(list(row), dtype=dtype)
        mask[i, : len(row)] = True
    return values, mask


def meter_readings(
    entries: Sequence[Sequence[MeterOutput | None]], width: int, device: torch.device | str = "cpu"
) -> MeterReadings:
    """Padded tensors from per-trajectory lists of meter outputs (``None`` = invalid reading); see
    :class:`MeterReadings` for what stands where a reading lacks a field."""
    n = len(entries)
    valid = torch.zeros(n, width, dtype=torch.bool)
    can_complete = torch.zeros(n, width, dtype=torch.bool)
    ttg = torch.zeros(n, width)
    logit = torch.zeros(n, width)
    score = torch.zeros(n, width)
    probability = torch.zeros(n, width)
    for i, row in enumerate(entries):
        for t, out in enumerate(row):
            if out is None:
                continue
            valid[i, t] = True
            can_complete[i, t] = bool(out.can_complete)
            if out.tokens_to_go is not None:
                ttg[i, t] = float(out.tokens_to_go)
            elif not out.can_complete:
                ttg[i, t] = math.inf
            if out.logit is not None:
                logit[i, t] = out.logit
            if out.score is not None:
                score[i, t] = out.score
            probability[i, t] = float(bool(out.can_complete)) if out.probability is None else out.probability
    return MeterReadings(*(x.to(device) for x in (valid, can_complete, ttg, logit, score, probability)))


def step_batch(
    rewards: Sequence[float],
    successes: Sequence[bool],
    groups: Sequence[Hashable],
    step_tokens: Sequence[Sequence[int]],
    meter: Sequence[Sequence[MeterOutput | None]] | None = None,
    step_rewards: Sequence[Sequence[float]] | None = None,
    anchors: Sequence[Sequence[Hashable]] | None = None,
    answer_logprobs: Sequence[Sequence[float]] | None = None,
    verified: Sequence[Sequence[bool | None]] | None = None,
    histories: Sequence[Sequence[Hashable | None]] | None = None,
) -> StepBatch:
    """The per-trajectory layout from plain Python lists (one entry per trajectory); ``anchors`` are any hashable
    anchor observations (their text), numbered so that equal observations share an id; ``answer_logprobs`` T_i + 1
    numbers per trajectory (padded to ``[n, S+1]`` with 0); ``verified`` T_i verified step outcomes per trajectory
    (True, False or None; :func:`verified_codes`); ``histories`` a key of each decision state (None: unknown),
    numbered like the anchors."""
    tokens, mask = pad_steps(step_tokens)
    group, _ = factorize(list(groups))
    return StepBatch(
        reward=torch.tensor(list(rewards), dtype=torch.float32),
        success=torch.tensor(list(successes), dtype=torch.bool),
        group=group,
        step_tokens=tokens,
        step_mask=mask,
        meter=None if meter is None else meter_readings(meter, mask.shape[1]),
        step_rewards=None if step_rewards is None else pad_steps(step_rewards)[0],
        anchor=None if anchors is None else anchor_ids(anchors, mask.shape[1]),
        answer_logprobs=None if answer_logprobs is None else answer_columns(answer_logprobs, mask),
        verified=None if verified is None else verified_codes(verified, mask),
        history=None if histories is None else anchor_ids(histories, mask.shape[1]),
    )


def verified_codes(verified: Sequence[Sequence[bool | None]], step_mask: Tensor) -> Tensor:
    """``[n, S]`` int8: 1 (True), 0 (False), −1 (None: nothing verified, and at padding); ``ValueError`` on a wrong
    count."""
    n, width = step_mask.shape
    if len(verified) != n:
        raise ValueError(f"verified: {len(verified)} rows for {n} trajectories")
    out = torch.full((n, width), -1, dtype=torch.int8)
    for i, (row, steps) in enumerate(zip(verified, step_mask.sum(dim=1).tolist())):
        if len(row) != steps:
            raise ValueError(f"verified of trajectory {i}: {len(row)} entries for {steps} steps")
        out[i, : len(row)] = torch.tensor([-1 if v is None else int(bool(v)) for v in row], dtype=torch.int8)
    return out


def answer_columns(answer_logprobs: Sequence[Sequence[float]], step_mask: Tensor) -> Tensor:
    """``[n, S+1]`` answer log-probs, 0 past each trajectory's T_i + 1 entries (``ValueError`` on a wrong count)."""
    n, width = step_mask.shape
    if len(answer_logprobs) != n:
        raise ValueError(f"answer_logprobs: {len(answer_logprobs)} rows for {n} trajectories")
    out = torch.zeros(n, width + 1)
    for i, (row, steps) in enumerate(zip(answer_logprobs, step_mask.sum(dim=1).tolist())):
        if len(row) != steps + 1:
            raise ValueError(f"answer_logprobs of trajectory {i}: {len(row)} entries for {steps} steps (need T + 1)")
        out[i, : len(row)] = torch.as_tensor(list(row), dtype=out.dtype)
    return out


def anchor_ids(anchors: Sequence[Sequence[Hashable | None]], width: int) -> Tensor:
    """``[n, width]`` int64 ids of the anchor observations (equal observation ⇔ equal id, across the batch), −1 at
    padding and where a key is ``None`` (unknown: equal to nothing)."""
    ids, _ = factorize([a for row in anchors for a in row])
    known = torch.tensor([a is not None for row in anchors for a in row], dtype=torch.bool)
    ids = torch.where(known, ids, torch.full_like(ids, -1))
    out = torch.full((len(anchors), width), -1, dtype=torch.int64)
    start = 0
    for i, row in enumerate(anchors):
        out[i, : len(row)] = ids[start : start + len(row)]
        start += len(row)
    return out


class StepLayoutError(ValueError):
    """The steps located in a flat batch disagree with its response mask, skip a step index, or do not match the
    readings they should line up with; the message names the trajectory."""


@dataclass
class FlatSteps:
    """Where every step of every trajectory sits in a flat ``[rows, L]`` batch."""

    traj_of_row: Tensor  # [rows] dense trajectory ids
    token_step: Tensor  # [rows, L] the step index t (within its trajectory) of each response token; −1 outside steps
    step_tokens: Tensor  # [n, S] tokens per step
    step_mask: Tensor  # [n, S]
    row_step: Tensor | None = None  # [rows] the step of each row when no row holds two (verl-agent's layout); −1: none

    @property
    def num_trajectories(self) -> int:
        return self.step_tokens.shape[0]


def locate_steps(response_mask: Tensor, traj_of_row: Tensor) -> FlatSteps:
    """Number the contiguous runs of 1s of each trajectory's rows as its steps 0..T−1, in row order.

    Work is per run, not per token, apart from finding where runs start and the final per-token step map. Two
    actions with no masked token between them read as one step: where that can happen, give the steps explicitly
    (:func:`steps_from_ids`).
    """
    mask = response_mask.bool()
    starts = mask.clone()
    starts[:, 1:] &= ~mask[:, :-1]
    ends = mask.clone()
    ends[:, :-1] &= ~mask[:, 1:]
    run_row, run_start = starts.nonzero(as_tuple=True)
    _, run_end = ends.nonzero(as_tuple=True)  # row-major: the k-th end closes the k-th start
    run_traj = traj_of_row[run_row]
    n = int(traj_of_row.max().item()) + 1 if traj_of_row.numel() else 0
    # Rank of each run among its trajectory's runs: a stable sort by trajectory keeps the row-major order.
    order = torch.argsort(run_traj, stable=True)
    num_steps = torch.bincount(run_traj, minlength=n)
    first = torch.cumsum(num_steps, 0) - num_steps
    run_step = torch.empty_like(order)
    run_step[order] = torch.arange(len(order), device=order.device) - first[run_traj[order]]
    width = int(num_steps.max().item()) if n else 0
    step_tokens = torch.zeros(n, width, dtype=torch.long, device=mask.device)
    step_tokens[run_traj, run_step] = run_end - run_start + 1
    step_mask = torch.arange(width, device=mask.device)[None, :] < num_steps[:, None]
    if bool((torch.bincount(run_row, minlength=mask.shape[0]) <= 1).all()):  # one step per row: no per-token search
        row_step = torch.full((mask.shape[0],), -1, dtype=torch.long, device=mask.device).index_put_((run_row,), run_step)
        return FlatSteps(traj_of_row, torch.where(mask, row_step[:, None], -1), step_tokens, step_mask, row_step)
    # Each token's run, counted from 1 in row-major order (0 before the first run): a gather, not a masked scatter.
    token_run = torch.cumsum(starts.view(-1), 0, dtype=torch.int32).view_as(starts)
    step_or_none = torch.cat([run_step.new_full((1,), -1), run_step])
    return FlatSteps(traj_of_row, torch.where(mask, step_or_none[token_run], -1), step_tokens, step_mask)


def steps_from_ids(
    step_ids: Tensor, response_mask: Tensor, traj_of_row: Tensor, names: Sequence[Hashable] | None = None
) -> FlatSteps:
    """Steps given explicitly, whatever the row order: ``step_ids[r, k]`` is the step index t of response token k of
    row r within its trajectory, −1 on tokens of no step (observations, padding).

    ``StepLayoutError`` (naming the trajectory by ``names[id]``) where a step id sits on a masked-out token or a
    trainable token has none, or where a trajectory's step indices are not exactly 0..T−1.
    """
    mask = response_mask.bool()
    name = lambda i: names[i] if names is not None else i  # noqa: E731
    disagree = (step_ids >= 0) != mask
    if disagree.any():
        row, col = (int(x) for x in disagree.nonzero()[0])
        raise StepLayoutError(f"trajectory {name(int(traj_of_row[row]))}: response token {col} of row {row} has "
                              f"step id {int(step_ids[row, col])} but response mask {int(mask[row, col])}")  # fmt: skip
    n = int(traj_of_row.max().item()) + 1 if traj_of_row.numel() else 0
    token_traj = traj_of_row[:, None].expand_as(step_ids)[mask]
    token_steps = step_ids[mask].long()
    width = int(token_steps.max().item()) + 1 if token_steps.numel() else 0
    step_tokens = torch.zeros(n * width, dtype=torch.long, device=mask.device)
    step_tokens.index_add_(0, token_traj * width + token_steps, torch.ones_like(token_steps))
    step_tokens = step_tokens.view(n, width)
    present = step_tokens > 0
    step_mask = torch.arange(width, device=mask.device)[None, :] < present.sum(dim=1, keepdim=True)
    gaps = (present != step_mask).any(dim=1)
    if gaps.any():
        i = int(gaps.nonzero()[0])
        missing = int((present[i] != step_mask[i]).nonzero()[0])
        raise StepLayoutError(f"trajectory {name(i)}: step {missing} has no tokens but later steps do "
                              f"(step indices must be 0..T−1)")  # fmt: skip
    return FlatSteps(traj_of_row, step_ids.long().where(mask, -1), step_tokens, step_mask)


def check_step_counts(steps: FlatSteps, expected: Sequence[int], names: Sequence[Hashable] | None = None) -> None:
    """``StepLayoutError`` naming the first trajectory whose located step count differs from ``expected`` (e.g. its
    meter readings, its recorded actions)."""
    located = steps.step_mask.sum(dim=1).tolist()
    for i, (have, want) in enumerate(zip(located, expected)):
        if have != want:
            raise StepLayoutError(f"trajectory {names[i] if names is not None else i}: {have} steps located in the "
                                  f"batch but {want} expected (readings or recorded actions)")  # fmt: skip


def per_trajectory(values: Tensor, traj_of_row: Tensor, num_trajectories: int) -> Tensor:
    """A per-row value that is constant within a trajectory (its reward, success or group) as ``[n]``."""
    out = torch.zeros(num_trajectories, dtype=values.dtype, device=values.device)
    return out.scatter(0, traj_of_row, values)


def token_advantages(step_values: Tensor, steps: FlatSteps, response_mask: Tensor) -> Tensor:
    """Broadcast a per-step value (Ã_{i,t}, a clip factor) to every token of step t in the flat layout; 0 where the
    response mask is 0."""
    mask = response_mask.to(step_values.dtype)
    if step_values.shape[1] == 0:
        return torch.zeros_like(mask)
    if steps.row_step is not None:  # one value per row, broadcast over its tokens
        return step_values[steps.traj_of_row, steps.row_step.clamp(min=0)][:, None] * mask
    return step_values[steps.traj_of_row[:, None], steps.token_step.clamp(min=0)] * mask


def credit_flat(
    method: str,
    response_mask: Tensor,
    group_ids: Sequence[Hashable] | np.ndarray | Tensor,
    traj_ids: Sequence[Hashable] | np.ndarray | Tensor,
    reward: Tensor,
    success: Tensor,
    config: CreditConfig,
    meter: MeterReadings | Sequence[Sequence[MeterOutput | None]] | None = None,
    step_ids: Tensor | None = None,
) -> tuple[Tensor, Credit, FlatSteps]:
    """Per-token advantages ``[rows, L]`` for a flat batch, by any registered estimator, on the batch's device.

    ``reward`` and ``success`` are per row (every row of a trajectory carries its trajectory's values, as in
    verl-agent). Steps are ``step_ids`` where given (:func:`steps_from_ids`; rows in any order), else the runs of 1s
    of the response mask in row order (:func:`locate_steps`). ``meter`` is per step in the per-trajectory layout,
    trajectories in order of first appearance: as lists of readings (their counts are checked against the located
    steps, ``StepLayoutError`` naming the trajectory) or as prebuilt ``MeterReadings``.
    """
    device = response_mask.device
    traj_of_row, names = factorize(traj_ids)
    group_of_row, _ = factorize(group_ids)
    traj_of_row, group_of_row = traj_of_row.to(device), group_of_row.to(device)
    if step_ids is None:
        steps = locate_steps(response_mask, traj_of_row)
    else:
        steps = steps_from_ids(step_ids.to(device), response_mask, traj_of_row, names)
    n = steps.num_trajectories
    if meter is not None and not isinstance(meter, MeterReadings):
        check_step_counts(steps, [len(row) for row in meter], names)
        meter = meter_readings(meter, steps.step_mask.shape[1], device)
    elif meter is not None and (meter.valid.shape[0] != n or meter.valid.shape[1] < steps.step_mask.shape[1]):
        raise StepLayoutError(f"meter readings of shape {tuple(meter.valid.shape)} for {n} trajectories with up to "
                              f"{steps.step_mask.shape[1]} located steps")  # fmt: skip
    batch = StepBatch(
        reward=per_trajectory(reward.float().to(device), traj_of_row, n),
        success=per_trajectory(success.bool().to(device), traj_of_row, n),
        group=per_trajectory(group_of_row, traj_of_row, n),
        step_tokens=steps.step_tokens,
        step_mask=steps.step_mask,
        meter=meter,
    )
    credit = get_estimator(method)(batch, config)
    return token_advantages(credit.step_advantages, steps, response_mask), credit, steps
