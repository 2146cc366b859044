"""HGPO (He et al., ICLR 2026, "Hierarchy-of-Groups Policy Optimization for Long-Horizon Agentic Tasks") advantages as
pure tensor functions over the per-trajectory layout.

Arithmetic follows verl-agent's ``recipe/hgpo/core_hgpo.py`` (``hgpo_advantage_estimate``), with step rewards = the
discounted returns of ``compute_step_discounted_returns`` (γ = ``algorithm.gamma``, 0.95 in the HGPO scripts) and
K = ``env.history_length`` (2 in the scripts):

* for k = 1 … K + 1, the k-th hierarchy group of step t of trajectory i is the set of steps of the same prompt group
  whose last k anchor observations (t − k + 1 … t, within their own trajectory) equal i's. A step with t < k − 1 has
  no k-th group (verl-agent loops k over 1 … min(K + 1, t + 1); shorter histories are neither padded nor matched).
  Steps of the same trajectory share a group when their windows match (repeated observations);
* within each group of ≥ 2 steps: ``mean_std``: (G − μ) / (σ + ε) with the *population* standard deviation;
  ``mean``: G − μ. Groups of one step contribute nothing;
* the step's advantage combines its *nonzero* group advantages a_k with weights w_k = (k + 1)^α:
  A = Σ w_k a_k / Σ w_k over the nonzero a_k, 0 when none. The normalised weights are a softmax of α·log(k + 1) over
  the kept items, computed in float64 (:func:`weighted_items`), so every α and K the CLI accepts (|α| ≤ 100,
  K ≤ 64) gives the exact mixture: raw weights (K + 2)^α overflow float32 from 66^22 on, and verl-agent's
  ``w_raw / (w_raw.sum() + ε)`` lets ε swamp weights far below 1 (α = −40: 2^−40 ≈ 9e−13 against ε = 1e−6). For
  α ≥ 0 every kept weight is ≥ 1, so dropping ε moves the result by a relative ≤ ε from verl-agent's;
* ``base_group=True`` adds the GiGPO episode advantage (step-expanded statistics, sample std, mode as above; see
  ``deltattg.credit.gigpo.episode_advantage``) as one more item with k = 0, weight 1^α = 1, subject to the same
  nonzero filter. Off by default (the HGPO scripts run ``base_group=False``).

As in ``deltattg.credit.gigpo``, a group with ≥ 2 steps whose returns are all equal gives exactly 0 (so it is dropped by
the nonzero filter), where verl-agent would divide rounding noise of the mean by ε.
"""

from __future__ import annotations

import torch
from torch import Tensor

from deltattg.credit.batch import Credit, CreditConfig, StepBatch
from deltattg.credit.gigpo import (
    GAMMA,
    NORM,
    STEP_GROUP_READS,
    check_layout,
    discounted_returns,
    episode_advantage,
    float_dtype,
    remove_std,
    segment_normalize,
    step_group_credit,
    step_group_inputs,
)
from deltattg.credit.registry import Option, register_estimator


def hgpo_step_items(
    returns: Tensor, anchor: Tensor, group: Tensor, step_mask: Tensor, k: int, *, norm: str, epsilon: float
) -> Tensor:
    """a_k: each step's advantage within its k-th hierarchy group, ``[n, S]``; 0 at padding, at t < k − 1 and for
    singleton groups."""
    mean_only = remove_std(norm)
    out = torch.zeros_like(returns)
    width = returns.shape[1]
    if k > width:
        return out
    windows = anchor.unfold(1, k, 1)  # [n, S − k + 1, k]: column j holds anchors j … j + k − 1
    rows, starts = step_mask[:, k - 1 :].nonzero(as_tuple=True)
    if rows.numel() == 0:
        return out
    steps = starts + (k - 1)
    keys = torch.cat([group[rows, None], windows[rows, starts]], dim=1)
    _, member = torch.unique(keys, dim=0, return_inverse=True)
    advantage, count = segment_normalize(
        returns[rows, steps], member, int(member.max()) + 1, unbiased=False, mean_only=mean_only, epsilon=epsilon
    )
    out[rows, steps] = torch.where(count[member] > 1, advantage, torch.zeros_like(advantage))
    return out


def hgpo_advantages(
    reward: Tensor,
    step_rewards: Tensor,
    anchor: Tensor,
    group: Tensor,
    step_mask: Tensor,
    *,
    history: int = 2,
    alpha: float = 1.0,
    gamma: float = 0.95,
    norm: str = "mean_std",
    base_group: bool = False,
    epsilon: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """HGPO: (episode term [n], per-step advantages [n, S], 0 at padding).

    Inputs as in ``deltattg.credit.gigpo.gigpo_advantages``. ``history`` = K (groups k = 1 … K + 1), ``alpha`` = α
    (``length_weight_alpha``), ``base_group`` adds the episode term as a k = 0 item. The episode term is returned
    either way (it enters the per-step advantages only with ``base_group=True``).
    """
    check_layout(reward, step_rewards, anchor, group, step_mask)
    if history < 0:
        raise ValueError(f"history must be >= 0, got {history}")
    dtype = float_dtype(reward, step_rewards)
    episode = episode_advantage(reward.to(dtype), step_mask.sum(dim=1), group, norm=norm, epsilon=epsilon)
    returns = discounted_returns(step_rewards.to(dtype), step_mask, gamma)
    items: list[tuple[int, Tensor]] = []
    if base_group:
        items.append((0, torch.where(step_mask, episode[:, None].expand_as(returns), torch.zeros_like(returns))))
    for k in range(1, history + 2):
        items.append((k, hgpo_step_items(returns, anchor, group, step_mask, k, norm=norm, epsilon=epsilon)))
    levels = torch.tensor([k for k, _ in items], dtype=torch.float64, device=returns.device)
    return episode, weighted_items(torch.stack([a for _, a in items]), alpha * torch.log1p(levels))


def weighted_items(items: Tensor, log_weights: Tensor) -> Tensor:
    """Σ_k w_k a_k / Σ_k w_k over each step's nonzero items a_k (``items`` ``[I, n, S]``), 0 where none; the weights
    are given as log w_k (``[I]``). Normalised in log space — exp(log w_k − max over the step's kept items), a
    softmax — in float64, so neither huge nor tiny weights lose the answer (no overflow, and no ε next to them)."""
    kept = items != 0
    scores = torch.where(kept, log_weights.to(torch.float64)[:, None, None], -torch.inf)
    top = scores.amax(dim=0)
    share = torch.exp(scores - torch.where(torch.isfinite(top), top, torch.zeros_like(top)))  # 0 where not kept
    weights = share / share.sum(dim=0).clamp(min=1.0)  # the largest kept share is exp(0) = 1; none kept: all 0
    return (weights * items.to(torch.float64)).sum(dim=0).to(items.dtype)


@register_estimator("hgpo", reads=STEP_GROUP_READS, options=(
    Option("history", "K: groups over the last k = 1..K+1 anchor observations", low=0, high=64),
    Option("alpha", "length weight exponent: w_k ∝ (k+1)^α", low=-100, high=100), GAMMA, NORM,
    Option("base_group", "also the episode term, as a k = 0 item")))  # fmt: skip
def hgpo(batch: StepBatch, config: CreditConfig) -> Credit:
    """HGPO: per-step advantages from history groups of 1..K+1 anchor observations, weighted ∝ (k+1)^α (verl-agent)."""
    step_rewards, anchor = step_group_inputs(batch)
    episode, advantages = hgpo_advantages(batch.reward, step_rewards, anchor, batch.group, batch.step_mask,
                                          history=config.history, alpha=config.alpha, gamma=config.gamma,
                                          norm=config.norm, base_group=config.base_group, epsilon=config.epsilon)
    return step_group_credit(episode, advantages)
