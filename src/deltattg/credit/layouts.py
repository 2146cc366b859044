"""The two layouts every estimator serves, mapped onto ``StepBatch`` and back.

* **per trajectory** — records (``deltattg credit``) or padded ``[n, S]`` step tensors;
* **flat token rows** — ``[rows, L]`` with a response mask, a group id and a trajectory id per row, as trainers hold
  them. A trajectory's steps are the contiguous runs of 1s in its rows' masks, in row order: verl-agent's one step
  per row and verl's whole conversation per row (environment tokens masked 0) are both covered.
"""

from __future__ import annotations

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
    else:
        array = np.asarray(values, dtype=object if not isinstance(values, np.ndarray) else None)
        uniques, first, inverse = np.unique(array, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return torch.from_numpy(rank[inverse.reshape(-1)]).long(), [uniques[i] for i in order]


def pad_steps(rows: Sequence[Sequence[float]], dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """Ragged per-trajectory lists -> padded ``[n, S]`` values and mask."""
    width = max((len(r) for r in rows), default=0)
    values = torch.zeros(len(rows), width, dtype=dtype)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        values[i, : len(row)] = torch.as_tensor(list(row), dtype=dtype)
        mask[i, : len(row)] = True
    return values, mask


def meter_readings(entries: Sequence[Sequence[MeterOutput | None]], width: int) -> MeterReadings:
    """Padded tensors from per-trajectory lists of meter outputs (``None`` = invalid reading)."""
    n = len(entries)
    valid = torch.zeros(n, width, dtype=torch.bool)
    can_complete = torch.zeros(n, width, dtype=torch.bool)
    ttg = torch.zeros(n, width)
    logit = torch.zeros(n, width)
    score = torch.zeros(n, width)
    for i, row in enumerate(entries):
        for t, out in enumerate(row):
            if out is None:
                continue
            valid[i, t] = True
            if out.can_complete:
                can_complete[i, t] = True
                ttg[i, t] = float(out.tokens_to_go or 0.0)
            if out.logit is not None:
                logit[i, t] = out.logit
            if out.score is not None:
                score[i, t] = out.score
    return MeterReadings(valid, can_complete, ttg, logit, score)


def step_batch(
    rewards: Sequence[float],
    successes: Sequence[bool],
    groups: Sequence[Hashable],
    step_tokens: Sequence[Sequence[int]],
    meter: Sequence[Sequence[MeterOutput | None]] | None = None,
) -> StepBatch:
    """The per-trajectory layout from plain Python lists (one entry per trajectory)."""
    tokens, mask = pad_steps(step_tokens)
    group, _ = factorize(list(groups))
    return StepBatch(
        reward=torch.tensor(list(rewards), dtype=torch.float32),
        success=torch.tensor(list(successes), dtype=torch.bool),
        group=group,
        step_tokens=tokens,
        step_mask=mask,
        meter=None if meter is None else meter_readings(meter, mask.shape[1]),
    )


@dataclass
class FlatSteps:
    """Where every step of every trajectory sits in a flat ``[rows, L]`` batch."""

    traj_of_row: Tensor  # [rows] dense trajectory ids
    step_of_token: Tensor  # [rows, L] step index within its trajectory, −1 where the response mask is 0
    step_tokens: Tensor  # [n, S] tokens per step
    step_mask: Tensor  # [n, S]

    @property
    def num_trajectories(self) -> int:
        return self.step_tokens.shape[0]


def locate_steps(response_mask: Tensor, traj_of_row: Tensor) -> FlatSteps:
    """Number the contiguous runs of 1s of each trajectory's rows as its steps 0..T−1 (vectorised, no token loop)."""
    mask = response_mask.bool()
    rows, _ = mask.shape
    n = int(traj_of_row.max().item()) + 1 if rows else 0
    starts = mask.clone()
    starts[:, 1:] &= ~mask[:, :-1]
    runs_per_row = starts.sum(dim=1)
    # Exclusive running count of runs over earlier rows of the same trajectory (rows keep their order).
    order = torch.argsort(traj_of_row, stable=True)
    sorted_runs = runs_per_row[order]
    exclusive = torch.cumsum(sorted_runs, 0) - sorted_runs
    first_of_traj = torch.zeros(n, dtype=exclusive.dtype).scatter_reduce(
        0, traj_of_row[order], exclusive, "amin", include_self=False
    )
    row_offset = torch.empty_like(exclusive)
    row_offset[order] = exclusive - first_of_traj[traj_of_row[order]]
    run_in_row = torch.cumsum(starts, dim=1) - 1
    step_of_token = torch.where(mask, row_offset[:, None] + run_in_row, torch.full_like(run_in_row, -1))
    num_steps = torch.zeros(n, dtype=torch.long).index_add_(0, traj_of_row, runs_per_row)
    width = int(num_steps.max().item()) if n else 0
    flat_index = (traj_of_row[:, None] * width + step_of_token)[mask]
    step_tokens = torch.zeros(n * width, dtype=torch.long).index_add_(0, flat_index, torch.ones_like(flat_index))
    step_mask = torch.arange(width)[None, :] < num_steps[:, None]
    return FlatSteps(traj_of_row, step_of_token, step_tokens.view(n, width), step_mask)


def per_trajectory(values: Tensor, traj_of_row: Tensor, num_trajectories: int) -> Tensor:
    """A per-row value that is constant within a trajectory (its reward, success or group) as ``[n]``."""
    out = torch.zeros(num_trajectories, dtype=values.dtype, device=values.device)
    return out.scatter(0, traj_of_row, values)


def token_advantages(step_advantages: Tensor, steps: FlatSteps) -> Tensor:
    """Broadcast Ã_{i,t} to every token of step t in the flat layout; 0 where the response mask is 0."""
    width = step_advantages.shape[1]
    index = steps.traj_of_row[:, None] * width + steps.step_of_token.clamp(min=0)
    values = step_advantages.reshape(-1)[index]
    return torch.where(steps.step_of_token >= 0, values, torch.zeros_like(values))


def credit_flat(
    method: str,
    response_mask: Tensor,
    group_ids: Sequence[Hashable] | np.ndarray | Tensor,
    traj_ids: Sequence[Hashable] | np.ndarray | Tensor,
    reward: Tensor,
    success: Tensor,
    config: CreditConfig,
    meter: MeterReadings | None = None,
) -> tuple[Tensor, Credit, FlatSteps]:
    """Per-token advantages ``[rows, L]`` for a flat batch, by any registered estimator.

    ``reward`` and ``success`` are per row (every row of a trajectory carries its trajectory's values, as in
    verl-agent); ``meter`` is per step in the per-trajectory layout, trajectories in order of first appearance.
    """
    traj_of_row, _ = factorize(traj_ids)
    group_of_row, _ = factorize(group_ids)
    steps = locate_steps(response_mask, traj_of_row)
    n = steps.num_trajectories
    batch = StepBatch(
        reward=per_trajectory(reward.float(), traj_of_row, n),
        success=per_trajectory(success.bool(), traj_of_row, n),
        group=per_trajectory(group_of_row, traj_of_row, n),
        step_tokens=steps.step_tokens,
        step_mask=steps.step_mask,
        meter=meter,
    )
    credit = get_estimator(method)(batch, config)
    return token_advantages(credit.step_advantages, steps), credit, steps
