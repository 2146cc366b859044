"""GiGPO (Feng et al., 2025, arXiv:2505.10978) advantages as pure tensor functions over the per-trajectory layout.

Arithmetic follows verl-agent's ``gigpo/core_gigpo.py`` (``compute_gigpo_outcome_advantage`` and the helpers it calls),
where the batch holds one row per environment step; here trajectory i's steps are ``step_mask[i]`` (a prefix of the
row), so trajectory i stands for T_i = ``step_mask[i].sum()`` of verl-agent's rows.

* **episode term** (``episode_norm_reward`` with ``compute_mean_std_cross_all_data=True``, called
  ``compute_mean_std_cross_steps`` in later versions): the statistics of prompt group x are over its step-expanded rows,
  trajectory i counted T_i times: μ_x = Σ T_i R_i / K_x with K_x = Σ T_i, σ_x the *sample* (n − 1) standard deviation
  of those K_x rows. ``mean_std``: (R_i − μ_x) / (σ_x + ε); ``mean``: R_i − μ_x. A group of exactly one row (K_x = 1)
  uses μ = 0, σ = 1, so its lone step gets R_i / (1 + ε) (``mean_std``) or R_i (``mean``) — verl-agent's rule, kept.
* **step term** (``build_step_group`` + ``step_norm_reward``): discounted returns G_t = r_t + γ G_{t+1} within each
  trajectory, normalised within step groups = the steps of one prompt group whose anchor observations are identical
  (steps of the same trajectory included), again with the sample standard deviation; a singleton step group gives 0.
* A_{i,t} = episode_i + ω · step_{i,t} (``step_advantage_w``), 0 at padding.

One deliberate difference, invisible in exact arithmetic: a group (episode or step) with ≥ 2 rows whose values are all
equal gets exactly 0, where verl-agent divides float rounding noise of the mean by ε (σ = 0).
"""

from __future__ import annotations

import torch
from torch import Tensor

from deltattg.credit.batch import Credit, CreditConfig, Fallback, StepBatch
from deltattg.credit.registry import Option, Reads, register_estimator

NORMS = {"mean_std": False, "mean_std_norm": False, "mean": True, "mean_norm": True}
"""``--norm`` value (ours, or verl-agent's ``mode`` spelling) -> ``remove_std``."""


def remove_std(norm: str) -> bool:
    """True for mean-only normalisation (verl-agent's ``mean_norm``), False for mean-std (``mean_std_norm``)."""
    try:
        return NORMS[norm]
    except KeyError:
        raise ValueError(f"unknown norm {norm!r}: expected 'mean_std' or 'mean'") from None


def float_dtype(*tensors: Tensor) -> torch.dtype:
    """The promoted floating dtype of the inputs (the default dtype when none is floating)."""
    floats = [t.dtype for t in tensors if t.is_floating_point()]
    if not floats:
        return torch.get_default_dtype()
    dtype = floats[0]
    for other in floats[1:]:
        dtype = torch.promote_types(dtype, other)
    return dtype


def check_layout(reward: Tensor, step_rewards: Tensor, anchor: Tensor, group: Tensor, step_mask: Tensor) -> None:
    """Shapes agree and each trajectory's steps are a prefix of its row (padding only at the end)."""
    if step_rewards.dim() != 2:
        raise ValueError(f"step_rewards must be [n, S], got shape {tuple(step_rewards.shape)}")
    n, width = step_rewards.shape
    for name, tensor, shape in (
        ("reward", reward, (n,)),
        ("group", group, (n,)),
        ("anchor", anchor, (n, width)),
        ("step_mask", step_mask, (n, width)),
    ):
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(tensor.shape)}")
    if step_mask.dtype != torch.bool:
        raise ValueError(f"step_mask must be bool, got {step_mask.dtype}")
    if width > 1 and bool((step_mask[:, 1:] & ~step_mask[:, :-1]).any()):
        raise ValueError("step_mask must mark a prefix of each row (steps first, padding after)")
    if n and bool((group < 0).any()):
        raise ValueError("group ids must be non-negative")


def discounted_returns(step_rewards: Tensor, step_mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + γ G_{t+1} within each trajectory (verl-agent's ``compute_step_discounted_returns``); 0 at padding.

    ``[n, S] -> [n, S]`` in the floating dtype of ``step_rewards``; a masked position ends the running sum.
    """
    dtype = float_dtype(step_rewards)
    rewards = step_rewards.to(dtype)
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=dtype, device=rewards.device)
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = torch.where(step_mask[:, t], rewards[:, t] + gamma * running, torch.zeros_like(running))
        returns[:, t] = running
    return returns


def segment_normalize(
    values: Tensor,
    segment: Tensor,
    num_segments: int,
    *,
    weight: Tensor | None = None,
    unbiased: bool,
    mean_only: bool,
    epsilon: float,
) -> tuple[Tensor, Tensor]:
    """(v − μ_s) / (σ_s + ε), or v − μ_s with ``mean_only``, per element; and each segment's row count.

    ``weight`` counts an element that many times (default 1; 0 = not counted); σ is the sample (``unbiased``) or
    population standard deviation over the expanded rows. A segment with ≥ 2 rows whose values are all equal gives
    exactly 0. Segments of one row are left to the caller (their σ here is 0, their centred value exactly 0).
    """
    dtype = values.dtype
    weight = torch.ones_like(values) if weight is None else weight.to(dtype)
    rows = torch.zeros(num_segments, dtype=dtype, device=values.device).index_add_(0, segment, weight)
    total = torch.zeros(num_segments, dtype=dtype, device=values.device).index_add_(0, segment, weight * values)
    mean = total / rows.clamp(min=1)
    centered = values - mean[segment]
    squares = torch.zeros(num_segments, dtype=dtype, device=values.device).index_add_(
        0, segment, weight * centered.square()
    )
    variance = squares / ((rows - 1) if unbiased else rows).clamp(min=1)
    counted = weight > 0
    lowest = torch.full((num_segments,), torch.inf, dtype=dtype, device=values.device).scatter_reduce(
        0, segment, torch.where(counted, values, torch.inf), "amin"
    )
    highest = torch.full((num_segments,), -torch.inf, dtype=dtype, device=values.device).scatter_reduce(
        0, segment, torch.where(counted, values, -torch.inf), "amax"
    )
    centered = torch.where((lowest == highest)[segment], torch.zeros_like(centered), centered)
    normalized = centered if mean_only else centered / (variance.sqrt()[segment] + epsilon)
    return normalized, rows


def episode_advantage(
    reward: Tensor, num_steps: Tensor, group: Tensor, *, norm: str = "mean_std", epsilon: float = 1e-6
) -> Tensor:
    """verl-agent's ``episode_norm_reward`` (step-expanded statistics, sample std; a one-row group: μ = 0, σ = 1).

    ``reward`` [n], ``num_steps`` [n] (T_i), ``group`` [n] dense ids -> [n]. A trajectory with no steps has no rows in
    verl-agent's batch and gets 0 here.
    """
    mean_only = remove_std(norm)
    dtype = float_dtype(reward)
    reward = reward.to(dtype)
    n = reward.shape[0]
    if n == 0:
        return reward.clone()
    num_groups = int(group.max()) + 1
    weight = num_steps.to(dtype)
    advantage, rows = segment_normalize(
        reward, group, num_groups, weight=weight, unbiased=True, mean_only=mean_only, epsilon=epsilon
    )
    lone = reward if mean_only else reward / (1.0 + epsilon)
    advantage = torch.where(rows[group] == 1, lone, advantage)
    return torch.where(num_steps > 0, advantage, torch.zeros_like(advantage))


def gigpo_step_advantage(
    returns: Tensor, anchor: Tensor, group: Tensor, step_mask: Tensor, *, norm: str = "mean_std", epsilon: float = 1e-6
) -> Tensor:
    """verl-agent's ``build_step_group`` + ``step_norm_reward`` on discounted returns: ``[n, S]``, 0 at padding.

    Step group = (prompt group, anchor id); sample std; a singleton step group gives 0.
    """
    mean_only = remove_std(norm)
    out = torch.zeros_like(returns)
    rows, steps = step_mask.nonzero(as_tuple=True)
    if rows.numel() == 0:
        return out
    keys = torch.stack([group[rows], anchor[rows, steps]], dim=1)
    _, step_group = torch.unique(keys, dim=0, return_inverse=True)
    advantage, _ = segment_normalize(
        returns[rows, steps],
        step_group,
        int(step_group.max()) + 1,
        unbiased=True,
        mean_only=mean_only,
        epsilon=epsilon,
    )
    out[rows, steps] = advantage
    return out


def gigpo_advantages(
    reward: Tensor,
    step_rewards: Tensor,
    anchor: Tensor,
    group: Tensor,
    step_mask: Tensor,
    *,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    norm: str = "mean_std",
    epsilon: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """GiGPO: (episode term [n], per-step advantages [n, S] = episode + ω · step term, 0 at padding).

    ``reward`` [n] episode outcomes; ``step_rewards`` [n, S] per-step rewards (0 at padding), discounted here with γ;
    ``anchor`` [n, S] int64 anchor-observation ids (equal id ⇔ identical observation; ignored at padding); ``group``
    [n] dense prompt-group ids; ``step_mask`` [n, S] bool, a prefix of each row. ``norm``: ``mean_std`` | ``mean``
    (verl-agent's ``mean_std_norm`` | ``mean_norm``, also accepted). Everything stays on the inputs' device, in their
    promoted floating dtype.
    """
    check_layout(reward, step_rewards, anchor, group, step_mask)
    dtype = float_dtype(reward, step_rewards)
    num_steps = step_mask.sum(dim=1)
    episode = episode_advantage(reward.to(dtype), num_steps, group, norm=norm, epsilon=epsilon)
    returns = discounted_returns(step_rewards.to(dtype), step_mask, gamma)
    step = gigpo_step_advantage(returns, anchor, group, step_mask, norm=norm, epsilon=epsilon)
    advantages = torch.where(step_mask, episode[:, None] + step_weight * step, torch.zeros_like(step))
    return episode, advantages


# ---- the registered estimator --------------------------------------------------------------------------------------
STEP_GROUP_READS = frozenset({Reads.STEP_REWARDS, Reads.ANCHORS})
GAMMA = Option("gamma", "discount of the per-step returns", low=0, high=1)
NORM = Option("norm", "group normalisation (verl-agent's mean_std_norm | mean_norm)", choices=("mean_std", "mean"))


def step_group_inputs(batch: StepBatch) -> tuple[Tensor, Tensor]:
    """The per-step rewards and anchor ids an observation-grouping estimator reads (``ValueError`` without them)."""
    if batch.step_rewards is None or batch.anchor is None:
        raise ValueError("GiGPO and HGPO read per-step rewards and anchor observations: build the batch with them")
    return batch.step_rewards, batch.anchor


def step_group_credit(episode: Tensor, advantages: Tensor) -> Credit:
    """An observation-grouping estimator's answer: A_i is its episode term, Ã_{i,t} its per-step advantages."""
    return Credit.additive(episode, advantages, Fallback.STEP_GROUPS)


STEP_WEIGHT = Option("step_weight", "ω: A = episode + ω·step term (GiGPO's step_advantage_w; deltattg_mix: the "
                     "meter's step change, normalised within the group)", low=-1e6, high=1e6)


@register_estimator("gigpo", reads=STEP_GROUP_READS, options=(GAMMA, STEP_WEIGHT, NORM))
def gigpo(batch: StepBatch, config: CreditConfig) -> Credit:
    """GiGPO: episode advantage + ω·step advantage within anchor-observation groups (verl-agent's core_gigpo)."""
    step_rewards, anchor = step_group_inputs(batch)
    episode, advantages = gigpo_advantages(batch.reward, step_rewards, anchor, batch.group, batch.step_mask,
                                           gamma=config.gamma, step_weight=config.step_weight, norm=config.norm,
                                           epsilon=config.epsilon)  # fmt: skip
    return step_group_credit(episode, advantages)
