"""The actor loss (Appendix D.5, Eq. 15–18): clipped policy gradient with asymmetric clip, dual clip on negative
advantages, token-mean reduction over the whole batch, and optional KL-to-reference and entropy terms.

Two entropy guards from verl (``policy_loss.loss_mode``, after Cui et al. 2025, "The Entropy Mechanism of RL for
Reasoning LMs"; beyond the paper) can replace the surrogate: ``clip_cov`` and ``kl_cov`` single out the few tokens
whose centred advantage × centred log-probability (their covariance term, what drives entropy down) is largest.

All tensors are ``[rows, L]`` token tensors with a response mask; advantages are Ã_{i,t,k} (GRPO: A_i everywhere).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

KLEstimator = Literal["k1", "k3"]
LossMode = Literal["vanilla", "clip_cov", "kl_cov"]


@dataclass(frozen=True)
class LossConfig:
    """Table 4 defaults: clip 0.2 / 0.28, dual clip 3; KL and entropy coefficients are per preset (0 = off)."""

    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = 3.0
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"
    entropy_coef: float = 0.0
    loss_mode: LossMode = "vanilla"  # verl's policy_loss.loss_mode: the entropy guards (:func:`covariance_guard`)
    clip_cov_ratio: float = 0.0002  # clip_cov: fraction of the batch's tokens whose gradient is dropped
    clip_cov_lb: float = 1.0  # clip_cov: only tokens with covariance term in (lb, ub) are candidates
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002  # kl_cov: fraction of the batch's tokens (the largest covariance) held by |log r|
    ppo_kl_coef: float = 1.0  # kl_cov: the coefficient of |log r| on those tokens

    def __post_init__(self) -> None:
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ValueError("clip widths must satisfy 0 <= clip_low < 1 and clip_high >= 0")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"the dual clip constant d must be > 1, got {self.dual_clip}")
        if self.kl_estimator not in ("k1", "k3"):
            raise ValueError(f"kl_estimator must be k1 or k3, got {self.kl_estimator!r}")
        if self.loss_mode not in ("vanilla", "clip_cov", "kl_cov"):
            raise ValueError(f"loss_mode must be vanilla, clip_cov or kl_cov, got {self.loss_mode!r}")
        if not (0 < self.clip_cov_ratio <= 1 and 0 < self.kl_cov_ratio <= 1):
            raise ValueError("clip_cov_ratio and kl_cov_ratio must lie in (0, 1]")
        if not self.clip_cov_lb < self.clip_cov_ub:
            raise ValueError(f"clip_cov_lb must be below clip_cov_ub, got {self.clip_cov_lb} and {self.clip_cov_ub}")
        if self.ppo_kl_coef < 0:
            raise ValueError(f"ppo_kl_coef must be >= 0, got {self.ppo_kl_coef}")


def token_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Σ values·mask / Σ mask over the whole batch: the token-mean reduction of Eq. 18."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


def importance_ratio(logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    """r = π_θ / π_θ_old per token (Eq. 15), computed in log space and clamped against overflow."""
    return torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))


def clipped_surrogate(
    ratio: Tensor, advantages: Tensor, clip_low: float | Tensor, clip_high: float | Tensor
) -> Tensor:
    """s = min(r·Ã, clip(r, 1−η_low, 1+η_high)·Ã) (Eq. 15–16).

    ``clip_low`` / ``clip_high`` are floats (one range for every token) or tensors broadcastable to the token
    tensors (a per-token range, e.g. A²TGPO's turn-scaled [1 − ε_low·c_k, 1 + ε_high·c_k]).
    """
    if isinstance(clip_low, Tensor) or isinstance(clip_high, Tensor):
        lower = torch.as_tensor(1.0 - clip_low, dtype=ratio.dtype, device=ratio.device)
        upper = torch.as_tensor(1.0 + clip_high, dtype=ratio.dtype, device=ratio.device)
        clipped = torch.minimum(torch.maximum(ratio, lower), upper)
    else:
        clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return torch.minimum(ratio * advantages, clipped * advantages)


def dual_clipped_surrogate(surrogate: Tensor, advantages: Tensor, dual_clip: float) -> Tensor:
    """s^dual = max(s, d·Ã) where Ã < 0, else s (Eq. 17): bounds the loss of a very large ratio on a bad token."""
    return torch.where(advantages < 0, torch.maximum(surrogate, dual_clip * advantages), surrogate)


def covariance_terms(logprobs: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """(Ã − mean Ã)·(log π_θ − mean log π_θ) per token, means over the batch's response tokens (detached): each
    token's term of Cov(log π, Ã), whose sum drives the policy's entropy down (Cui et al. 2025, Eq. 9)."""
    logp, adv = logprobs.detach(), advantages.detach()
    return (adv - token_mean(adv, mask)) * (logp - token_mean(logp, mask))


def clip_cov_tokens(covariance: Tensor, unclipped_active: Tensor, mask: Tensor, config: LossConfig) -> Tensor:
    """verl's ``clip_cov`` selection: ``max(1, ⌊clip_cov_ratio·N⌋)`` tokens drawn at random (torch's RNG) among the
    response tokens the clip leaves active whose covariance term lies in (clip_cov_lb, clip_cov_ub)."""
    candidates = mask & unclipped_active & (covariance > config.clip_cov_lb) & (covariance < config.clip_cov_ub)
    where = candidates.flatten().nonzero().squeeze(1)
    count = min(max(1, int(config.clip_cov_ratio * int(mask.sum()))), len(where))
    chosen = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
    chosen[where[torch.randperm(len(where), device=where.device)[:count]]] = True
    return chosen.view_as(mask)


def kl_cov_tokens(covariance: Tensor, mask: Tensor, config: LossConfig) -> Tensor:
    """verl's ``kl_cov`` selection: the ``max(1, ⌊kl_cov_ratio·N⌋)`` response tokens of largest covariance term."""
    where = mask.flatten().nonzero().squeeze(1)
    count = min(max(1, int(config.kl_cov_ratio * len(where))), len(where))
    chosen = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
    chosen[where[covariance.flatten()[where].topk(count).indices]] = True
    return chosen.view_as(mask)


def covariance_guard(
    objective: Tensor, ratio: Tensor, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
    config: LossConfig,
) -> tuple[Tensor, Tensor]:
    """The per-token objective under verl's entropy guards, and the tokens they singled out.

    ``clip_cov``: ``objective`` (the clipped surrogate, without dual clip as in verl) with the chosen tokens'
    gradient dropped (multiplied by 0). ``kl_cov``: the unclipped r·Ã (as verl: no clip) less
    ``ppo_kl_coef``·|log r| on the chosen tokens, which holds them near π_old."""
    covariance = covariance_terms(logprobs, advantages, mask)
    if config.loss_mode == "clip_cov":
        chosen = clip_cov_tokens(covariance, objective >= ratio * advantages, mask, config)
        return torch.where(chosen, objective * 0.0, objective), chosen
    chosen = kl_cov_tokens(covariance, mask, config)
    unclipped = ratio * advantages
    return torch.where(chosen, unclipped - config.ppo_kl_coef * (logprobs - old_logprobs).abs(), unclipped), chosen


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: KLEstimator) -> Tensor:
    """Per-token KL(π_θ ‖ π_ref) estimate: k1 = log π_θ − log π_ref; k3 = e^{−k1} + k1 − 1 (≥ 0, low variance)."""
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    return torch.exp(-log_ratio.clamp(-20.0, 20.0)) + log_ratio - 1.0


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    config: LossConfig = LossConfig(),
    *,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    clip_scale: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """L = L_PG (Eq. 18) + β_KL·KL − β_H·H, each token-mean over the batch; returns the loss and metrics.

    ``clip_scale`` (a tensor broadcastable to the token tensors, e.g. A²TGPO's turn clip factor c_k on every token
    of turn k) scales both clip widths per token: the range becomes [1 − η_low·c, 1 + η_high·c]. None = the
    config's fixed range.

    ``config.loss_mode`` ``clip_cov`` / ``kl_cov`` replaces the surrogate by verl's entropy guard of that name
    (:func:`covariance_guard`; no dual clip).

    Metrics: ``pg_loss``, ``clipfrac`` (tokens where the clipped branch is active), ``dual_clipfrac`` (negative-
    advantage tokens held by the dual clip), ``approx_kl`` (k1 estimate of KL(π_old ‖ π_θ) on sampled tokens),
    ``kl`` / ``entropy`` when given, and ``cov_guard_frac`` (tokens the guard singled out) under a guard.
    """
    mask = response_mask.bool()
    ratio = importance_ratio(logprobs, old_logprobs)
    if clip_scale is None:
        surrogate = clipped_surrogate(ratio, advantages, config.clip_low, config.clip_high)
    else:
        scale = clip_scale.detach().to(ratio.dtype)
        surrogate = clipped_surrogate(ratio, advantages, config.clip_low * scale, config.clip_high * scale)
    objective = surrogate
    dual_active = torch.zeros_like(mask)
    guarded = None
    if config.loss_mode != "vanilla":
        objective, guarded = covariance_guard(surrogate, ratio, logprobs, old_logprobs, advantages, mask, config)
    elif config.dual_clip is not None:
        objective = dual_clipped_surrogate(surrogate, advantages, config.dual_clip)
        dual_active = (advantages < 0) & (objective > surrogate)
    pg_loss = -token_mean(objective, mask)
    loss = pg_loss
    unclipped = ratio * advantages
    metrics = {
        "pg_loss": pg_loss.item(),
        "clipfrac": token_mean((surrogate < unclipped).float(), mask).item(),
        "dual_clipfrac": token_mean(dual_active.float(), mask).item(),
        "approx_kl": token_mean(old_logprobs - logprobs, mask).item(),
    }
    if guarded is not None:
        metrics["cov_guard_frac"] = token_mean(guarded.float(), mask).item()
    if ref_logprobs is not None:
        kl = token_mean(kl_penalty(logprobs, ref_logprobs, config.kl_estimator), mask)
        metrics["kl"] = kl.item()
        if config.kl_coef:
            loss = loss + config.kl_coef * kl
    if entropy is not None:
        mean_entropy = token_mean(entropy, mask)
        metrics["entropy"] = mean_entropy.item()
        if config.entropy_coef:
            loss = loss - config.entropy_coef * mean_entropy
    metrics["loss"] = loss.item()
    return loss, metrics
