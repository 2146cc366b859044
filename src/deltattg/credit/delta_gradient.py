"""DelTA — discriminative token credit assignment (Zhang, Wu, Lin, arXiv 2605.21467; seed 002's first abstract).

A pure tensor function over the flat token layout ``[N, L]`` (rows, positions) with a response mask. It follows the
public code, ``RUCBM/DelTA`` ``verl-DelTA/verl/workers/actor/dp_actor.py``, ``DataParallelPPOActor.
compute_log_prob_h`` (its ``impl="Normal"`` branch, with the run script's ``K=1``, ``lam_min=0.8``, ``lam_max=1.2``);
the seed has the abstract only, so there are no equation numbers to cite. Their steps, over every masked token of
the batch at once:

1. token-gradient proxy v = (1 − p)·h, h the last hidden state (the input of the LM head, their pre-hook on
   ``lm_head``), p the probability of the sampled token;
2. advantage-weighted centroids μ⁺ = Σ A⁺·v / Σ A⁺ and μ⁻ = Σ A⁻·v / Σ A⁻ (A⁺ = max(A, 0), A⁻ = max(−A, 0); the
   denominators clamped at 1e-8);
3. squared-Euclidean margins, each side measured towards its own centroid: for a token of a positive-advantage
   sequence m = ‖v − μ⁻‖² − ‖v − μ⁺‖², for a negative one m = ‖v − μ⁺‖² − ‖v − μ⁻‖² (their ``margin_pos`` /
   ``margin_neg`` with ``lam_w = 1``; their diagonal metric ``d`` is overwritten with ones, so plain Euclidean).
   m > 0 means "closer to my own side's centroid": a side-specific, discriminative direction;
4. side temperature γ± = the population standard deviation of that side's margins over its tokens,
   sqrt(max(var, 1e-8));
5. K refinement steps (K = 1): soft weights σ(m/γ)·|A| on each side's tokens give new centroids
   μ± = Σ w·v / max(Σ w, 1e-8); γ± is then re-estimated from the margins just used (the ones measured against the
   centroids *before* the step — so with K = 1 the final γ± are the ones of step 4, exactly as in their loop);
6. ω = λ_min + (λ_max − λ_min)·σ(m/γ) with the refined centroids (same formula on both sides, each with its own
   margin sign and γ); a token whose advantage is 0 gets λ_min; padding gets 0;
7. self-normalisation: ω ← ω · (Σ mask / Σ ω·mask), so the masked token mean of ω over the whole batch is 1; the
   policy-gradient advantage is Â = A·ω (their ``weighted_adv``, used with the token-mean loss).

Choices where their code is silent or this project differs (all documented on the functions):

* the margin is computed in its exact linear form m⁺ = 2v·(μ⁺ − μ⁻) + ‖μ⁻‖² − ‖μ⁺‖² (= their d⁻ − d⁺, the paper's
  "linear discriminator" view), which avoids subtracting two large squared distances;
* when one side has no token (no positive or no negative advantage in the batch) the discriminator is undefined and
  every masked token gets ω = 1 (their code would compare against a zero centroid; DAPO-style dynamic sampling
  keeps both sides present there);
* their advantage is per row (``advantages[:, 0]``); here ``sequence`` says which rows form one sequence and the
  sequence's advantage is read at its first masked token, as theirs is; without ``sequence`` the per-token
  advantage is used as it is (identical whenever the advantage is constant along a row, as an outcome advantage is);
* everything is computed without gradient, in at least float32.

The registered estimator ``delta`` (bottom of the module) reads the token hidden states, which only the actor gives:
its function returns GRPO's outcome advantage (Eq. 14), and its record's ``token_weights``
(:func:`delta_weights`) is what the trainer calls on one no-grad θ_old pass over the step rows to hand the policy
loss Â = A·ω (``deltattg.train.side_passes.token_weighted_advantages``). Settings: ``CreditConfig.delta_lambda_min``,
``delta_lambda_max``, ``delta_refine`` (K). ``deltattg credit`` and ``inspect`` refuse it: records carry no hidden
states.
"""

from __future__ import annotations

import torch
from torch import Tensor

from deltattg.credit.batch import MAX_CREDIT_SETTING, Credit, CreditConfig, StepBatch
from deltattg.credit.grpo import grpo
from deltattg.credit.registry import Option, Reads, register_estimator

EPS = 1e-8  # their ``eps``: clamp of the centroid denominators and of the margin variances


def _side_std(margin: Tensor, side: Tensor) -> Tensor:
    """Population std of ``margin`` over the tokens of one side, sqrt(max(var, 1e-8)) (their γ±)."""
    count = side.sum().clamp(min=1)
    values = margin * side
    mean = values.sum() / count
    var = (values * margin).sum() / count - mean.square()
    return var.clamp(min=EPS).sqrt()


def _centroid(v: Tensor, weight: Tensor) -> Tensor:
    return (weight[:, None] * v).sum(0) / weight.sum().clamp(min=EPS)


def _positive_margin(v: Tensor, mu_pos: Tensor, mu_neg: Tensor) -> Tensor:
    """m⁺ = ‖v − μ⁻‖² − ‖v − μ⁺‖² = 2v·(μ⁺ − μ⁻) + ‖μ⁻‖² − ‖μ⁺‖² per token (m⁻ = −m⁺)."""
    return 2.0 * (v @ (mu_pos - mu_neg)) + mu_neg.square().sum() - mu_pos.square().sum()


def _token_advantage(advantage: Tensor, sequence: Tensor | None, mask: Tensor, dtype: torch.dtype) -> Tensor:
    rows, length = mask.shape
    if advantage.shape == (rows,):
        advantage = advantage[:, None].expand(rows, length)
    elif advantage.shape != (rows, length):
        raise ValueError(f"advantage must be [N] or [N, L] = {(rows, length)}, got {tuple(advantage.shape)}")
    advantage = advantage.to(dtype)
    if sequence is None:
        return advantage
    if sequence.shape != (rows,):
        raise ValueError(f"sequence must be [N] = ({rows},), one id per row, got {tuple(sequence.shape)}")
    _, seq = torch.unique(sequence, return_inverse=True)
    seq_tok = seq[:, None].expand(rows, length)
    flat = torch.arange(rows * length, device=mask.device).view(rows, length)
    first = torch.full((int(seq.max().item()) + 1 if rows else 0,), rows * length, device=mask.device)
    first = first.scatter_reduce(0, seq_tok[mask], flat[mask], "amin")
    seq_advantage = advantage.reshape(-1)[first.clamp(max=max(rows * length - 1, 0))]
    return seq_advantage[seq_tok]


@torch.no_grad()
def delta_token_weights(
    hidden: Tensor,
    token_prob: Tensor,
    advantage: Tensor,
    sequence: Tensor | None,
    mask: Tensor,
    *,
    lambda_min: float = 0.8,
    lambda_max: float = 1.2,
    refine: bool | int = True,
    normalize: bool = True,
) -> Tensor:
    """DelTA token coefficients ω ``[N, L]`` (module docstring, steps 1–7); 0 at masked-out positions.

    ``hidden`` ``[N, L, d]``: last hidden states (LM-head inputs) at the positions that predict each response
    token; ``token_prob`` ``[N, L]``: probability of the sampled token there; ``advantage`` ``[N, L]`` or ``[N]``:
    the outcome advantage; ``sequence`` ``[N]`` or None: the sequence (trajectory) id of each row (see the module
    docstring); ``mask`` ``[N, L]``: the response mask. ``refine``: number of centroid refinement steps K
    (True = 1, their default; False = 0). ``normalize=False`` returns the raw ω ∈ [λ_min, λ_max] before step 7.
    The statistics are batch-wide, so call it on the whole batch the update uses (as their actor does).
    """
    if hidden.dim() != 3 or hidden.shape[:2] != mask.shape or token_prob.shape != mask.shape:
        raise ValueError(f"need hidden [N, L, d] and token_prob [N, L] matching mask {tuple(mask.shape)}; got "
                         f"{tuple(hidden.shape)} and {tuple(token_prob.shape)}")  # fmt: skip
    if not 0 <= lambda_min <= lambda_max:
        raise ValueError(f"need 0 <= lambda_min <= lambda_max, got {lambda_min}, {lambda_max}")
    steps = int(refine)
    if steps < 0:
        raise ValueError(f"refine must be a bool or a number of steps >= 0, got {refine}")
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    valid = mask.bool()
    token_advantage = _token_advantage(advantage.detach(), sequence, valid, dtype)
    weight = torch.zeros(valid.shape, dtype=dtype, device=hidden.device)

    a = token_advantage[valid]
    positive, negative = a > 0, a < 0
    if not bool(positive.any()) or not bool(negative.any()):
        weight[valid] = 1.0  # one side empty: no discriminator, no reweighting
        return weight

    v = (1.0 - token_prob.detach()[valid].to(dtype))[:, None] * hidden.detach()[valid].to(dtype)  # [M, d]
    pos, neg = positive.to(dtype), negative.to(dtype)
    a_pos, a_neg = a.clamp(min=0), (-a).clamp(min=0)
    mu_pos, mu_neg = _centroid(v, a_pos), _centroid(v, a_neg)
    margin = _positive_margin(v, mu_pos, mu_neg)
    gamma_pos, gamma_neg = _side_std(margin, pos), _side_std(-margin, neg)
    for _ in range(steps):
        soft_pos = torch.sigmoid(margin / gamma_pos) * a_pos * pos
        soft_neg = torch.sigmoid(-margin / gamma_neg) * a_neg * neg
        mu_pos, mu_neg = _centroid(v, soft_pos), _centroid(v, soft_neg)
        gamma_pos, gamma_neg = _side_std(margin, pos), _side_std(-margin, neg)  # margins of the step just taken
        margin = _positive_margin(v, mu_pos, mu_neg)

    span = lambda_max - lambda_min
    omega = torch.full_like(a, lambda_min)
    omega = torch.where(positive, lambda_min + span * torch.sigmoid(margin / gamma_pos), omega)
    omega = torch.where(negative, lambda_min + span * torch.sigmoid(-margin / gamma_neg), omega)
    if normalize:
        omega = omega * (omega.numel() / omega.sum().clamp(min=EPS))
    weight[valid] = omega
    return weight


@torch.no_grad()
def delta_advantages(
    hidden: Tensor, token_prob: Tensor, advantage: Tensor, sequence: Tensor | None, mask: Tensor, **options
) -> Tensor:
    """Â = A·ω per token ``[N, L]`` (0 at masked-out positions); ``options`` go to :func:`delta_token_weights`."""
    valid = mask.bool()
    weight = delta_token_weights(hidden, token_prob, advantage, sequence, mask, **options)
    token_advantage = _token_advantage(advantage.detach(), sequence, valid, weight.dtype)
    return torch.where(valid, token_advantage * weight, torch.zeros_like(weight))


# ---- the registered estimator --------------------------------------------------------------------------------------
def delta_weights(hidden: Tensor, token_prob: Tensor, advantage: Tensor, mask: Tensor, config: CreditConfig) -> Tensor:
    """The record's ``token_weights``: ω over the whole batch with ``config``'s λ_min, λ_max and K (each token's own
    advantage, so the layout may be any ``[N, L]``, e.g. every token of the batch in one row)."""
    return delta_token_weights(hidden, token_prob, advantage, None, mask, lambda_min=config.delta_lambda_min,
                               lambda_max=config.delta_lambda_max, refine=config.delta_refine)  # fmt: skip


@register_estimator("delta", reads=frozenset({Reads.HIDDEN_STATES}), token_weights=delta_weights,
                    side_pass="deltattg.train.side_passes:hidden_state_pass", options=(
    Option("delta_lambda_min", "λ_min: the lowest token weight before self-normalisation", low=0,
           high=MAX_CREDIT_SETTING),
    Option("delta_lambda_max", "λ_max: the highest token weight before self-normalisation", low=0,
           high=MAX_CREDIT_SETTING),
    Option("delta_refine", "K: centroid refinement steps", low=0, high=16)))  # fmt: skip
def delta(batch: StepBatch, config: CreditConfig) -> Credit:
    """DelTA: GRPO's outcome advantage, reweighted per token by ω from the actor's hidden states (RUCBM/DelTA).

    This gives the sequence-level advantage DelTA reweights, A_i on every step (Eq. 14, GRPO's); the token weights ω
    need the actor's last hidden states, so the trainer applies them (the record's ``token_weights``, here
    :func:`delta_weights`) and hands the policy loss Â = A·ω per token.
    """
    return grpo(batch, config)
