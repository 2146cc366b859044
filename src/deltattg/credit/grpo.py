"""Group-relative outcome advantages (GRPO) with step-expanded statistics (Appendix D.3, Eq. 14)."""

from __future__ import annotations

import torch
from torch import Tensor

from deltattg.credit.batch import Credit, CreditConfig, Fallback, StepBatch
from deltattg.credit.registry import register_estimator


def group_sum(values: Tensor, group: Tensor, num_groups: int) -> Tensor:
    """Σ of ``values`` over each group id: ``[n] -> [G]``."""
    return torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(0, group, values)


def step_expanded_advantage(
    reward: Tensor, num_steps: Tensor, group: Tensor, num_groups: int, *, epsilon: float = 1e-6, scale_by_std: bool = True
) -> Tensor:
    """A_i = (R_i − μ_x) / (σ_x + ε), where trajectory i counts T_i times in its group's statistics (Eq. 14).

    μ_x = Σ_i T_i R_i / K_x and σ_x is the sample standard deviation over the K_x = Σ_i T_i step-expanded rows.
    A group whose rows' rewards are all equal gets exactly 0 (no relative signal; such trajectories are not queried).
    A trajectory without actions (T_i = 0) has no rows: it does not enter its group's statistics and gets 0, as in
    GiGPO's episode term (it has no token to carry an advantage). ``scale_by_std=False`` drops the division by σ
    (Dr. GRPO style).
    """
    reward = reward.to(torch.get_default_dtype()) if not reward.is_floating_point() else reward
    weight = num_steps.to(reward.dtype)
    rows = group_sum(weight, group, num_groups)
    mean = group_sum(weight * reward, group, num_groups) / rows.clamp(min=1)
    centered = reward - mean[group]
    variance = group_sum(weight * centered.square(), group, num_groups) / (rows - 1).clamp(min=1)
    advantage = centered / (variance.sqrt()[group] + epsilon) if scale_by_std else centered
    acted = num_steps > 0
    lowest = torch.full((num_groups,), torch.inf, dtype=reward.dtype, device=reward.device)
    highest = torch.full((num_groups,), -torch.inf, dtype=reward.dtype, device=reward.device)
    lowest = lowest.scatter_reduce(0, group, torch.where(acted, reward, torch.inf), "amin")
    highest = highest.scatter_reduce(0, group, torch.where(acted, reward, -torch.inf), "amax")
    no_signal = (lowest == highest)[group] | ~acted
    return torch.where(no_signal, torch.zeros_like(advantage), advantage)


def outcome_advantage(batch: StepBatch, config: CreditConfig) -> Tensor:
    """Eq. 14 on a batch."""
    return step_expanded_advantage(
        batch.reward,
        batch.num_steps,
        batch.group,
        batch.num_groups,
        epsilon=config.epsilon,
        scale_by_std=config.scale_by_std,
    )


@register_estimator("grpo")
def grpo(batch: StepBatch, config: CreditConfig) -> Credit:
    """GRPO: every token of trajectory i gets A_i (step-expanded group statistics, Eq. 14)."""
    advantage = outcome_advantage(batch, config)
    weights = batch.step_mask.to(advantage.dtype)
    return Credit.weighted(advantage, weights, outcome_fallback(advantage))


def outcome_fallback(advantage: Tensor) -> Tensor:
    """``zero_advantage`` where A_i = 0, else ``outcome_only`` (an estimator that does not read a meter)."""
    return torch.where(advantage == 0, Fallback.ZERO_ADVANTAGE, Fallback.OUTCOME_ONLY).to(torch.int8)
