"""Information-gain credit: IGPO and A²TGPO as pure tensor functions over the per-trajectory padded layout.

Layout: ``n`` trajectories padded to ``S`` turns (steps); ``step_mask[i, t]`` marks real turns and is a prefix
(turns 0..T_i−1, T_i = ``step_mask[i].sum()``); ``group[i]`` is the prompt group of trajectory i (any integer ids);
``reward[i]`` its outcome reward. Turn T_i−1, the last, is the *answer turn*.

Sources. Seed ``002`` holds only the abstracts of DelTA, CrEST and A²TGPO (no equations, so no equation numbers can
be cited from it). The arithmetic here follows:

* **IGPO** — Wang et al., "Information Gain-based Policy Optimization" (arXiv 2510.14967), method section
  (section and equation numbers not checked: only secondary copies of its text were reachable): the turn reward is
  the marginal increase of π_θ(a | q, o_{≤t}) = exp(mean token log-prob of the ground truth a); the answer turn's
  reward is the outcome; all turn rewards of a prompt group are z-scored together; discounted accumulation. And its
  public code, ``GuoqingWang1/IGPO`` ``verl/trainer/ppo/core_algos.py:compute_grpo_outcome_advantage`` in its
  default ``info_gain_norm_mode="joint"`` (the statistics quoted below are that code's).
* **A²TGPO** — Chen et al. (arXiv 2605.06200; seed 002's third abstract): turn-group normalisation within
  (prompt, turn index), variance-rescaled discounted accumulation, adaptive turn-level clipping; the exact forms
  (D_k, A_k = α·D_k + Â_out, c_k, α = β = 0.3) are those of issue 11, which this module follows literally.

Every function is side-effect free and works on any device; nothing here needs gradients.

The registered estimators ``igpo`` and ``a2tgpo`` (bottom of the module) read ``StepBatch.answer_logprobs``
``[n, S+1]`` — the mean token log-prob of the task's reference answer teacher-forced after 0..T_i turns: from the
records' ``answer_logprobs`` (``deltattg credit``) or from the actor itself (the trainer, ``deltattg.train.answers``).
Their settings are ``CreditConfig.ig_gamma`` (γ = 1), ``ig_alpha`` (α = 0.3), ``ig_beta`` (β = 0.3) and ``ig_log``
(the log-prob variant of IG); ε is ``CreditConfig.epsilon``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from deltattg.credit.batch import MAX_CREDIT_SETTING, Credit, CreditConfig, Fallback, StepBatch
from deltattg.credit.registry import Option, Reads, register_estimator

STD_FLOOR = 1e-8  # IGPO's compute_group_stats: σ = sqrt(population variance + 1e-8)


def mean_token_logprob(token_logprobs: Tensor, answer_mask: Tensor) -> Tensor:
    """(1/L) Σ_j log π_θ(a_j | …, a_{<j}) over the answer tokens marked in ``answer_mask`` (last dimension).

    The teacher-forced log-probs of the reference answer (in the task's answer format) after each turn; rows with no
    answer token give 0.
    """
    mask = answer_mask.to(token_logprobs.dtype)
    return (token_logprobs * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def answer_probabilities(mean_logprobs: Tensor) -> Tensor:
    """p = exp(mean token log-prob of the reference answer): IGPO's π_θ(a | q, o_{≤t}), a geometric-mean probability.

    ``mean_logprobs`` is ``[n, S+1]`` for the information-gain functions: column 0 before any turn (prompt only),
    column t after turn t (1-based), i.e. after step index t−1.
    """
    return torch.exp(mean_logprobs)


def _check_layout(values: Tensor, step_mask: Tensor, name: str) -> Tensor:
    if step_mask.dim() != 2:
        raise ValueError(f"step_mask must be [n, S], got shape {tuple(step_mask.shape)}")
    if values.shape != step_mask.shape:
        raise ValueError(f"{name} must have step_mask's shape {tuple(step_mask.shape)}, got {tuple(values.shape)}")
    mask = step_mask.bool()
    if mask.shape[1] > 1 and bool((mask[:, 1:] & ~mask[:, :-1]).any()):
        raise ValueError("step_mask must be a prefix mask: real turns first, padding after")
    return mask


def information_gain(p: Tensor, step_mask: Tensor, *, log: bool = False) -> Tensor:
    """IG of every turn: IG_{i,t} = p_{i,t+1} − p_{i,t} (``log=True``: log p_{i,t+1} − log p_{i,t}); ``[n, S]``.

    ``p`` is ``[n, S+1]``: p_0 before any turn, p_t after turn t (IGPO: r_{i,t} = π_θ(a|q, o_{≤t}) −
    π_θ(a|q, o_{≤t−1})). Entries of ``p`` past a trajectory's T_i are ignored; IG is 0 at padding. Over the real
    turns the sum telescopes: Σ_t IG_{i,t} = p_{i,T_i} − p_{i,0}. IG is defined for the answer turn too
    (p_T − p_{T−1}) but neither estimator below uses it: there the outcome takes its place.
    The log variant clamps p at the dtype's smallest normal number, so an underflowed probability stays finite.
    """
    if p.dim() != 2 or step_mask.dim() != 2 or p.shape != (step_mask.shape[0], step_mask.shape[1] + 1):
        raise ValueError(f"p must be [n, S+1] for a step_mask of shape [n, S]; got {tuple(p.shape)} and "
                         f"{tuple(step_mask.shape)}")  # fmt: skip
    mask = _check_layout(p[:, 1:], step_mask, "p[:, 1:]")
    values = torch.log(p.clamp(min=torch.finfo(p.dtype).tiny)) if log else p
    gain = values[:, 1:] - values[:, :-1]
    return torch.where(mask, gain, torch.zeros_like(gain))


def _dense_ids(ids: Tensor) -> tuple[Tensor, int]:
    _, inverse = torch.unique(ids, return_inverse=True)
    return inverse.reshape(ids.shape), int(inverse.max().item()) + 1 if inverse.numel() else 0


def _pooled_zscore(values: Tensor, valid: Tensor, key: Tensor, epsilon: float) -> Tensor:
    """(x − μ_k) / (σ_k + ε) over the ``valid`` entries sharing a key; IGPO's ``compute_group_stats`` statistics.

    μ_k: mean; σ_k = sqrt(population variance + 1e-8); σ_k = 1 where the key holds a single entry (a singleton is
    centred on itself and so gets exactly 0). Invalid entries give 0.
    """
    dense, count = _dense_ids(key[valid])
    x = values[valid]
    n = torch.zeros(count, dtype=x.dtype, device=x.device).index_add_(0, dense, torch.ones_like(x))
    mean = torch.zeros_like(n).index_add_(0, dense, x) / n.clamp(min=1)
    centred = x - mean[dense]
    var = torch.zeros_like(n).index_add_(0, dense, centred.square()) / n.clamp(min=1)
    std = torch.where(n <= 1, torch.ones_like(var), torch.sqrt(var + STD_FLOOR))
    out = torch.zeros_like(values)
    out[valid] = centred / (std[dense] + epsilon)
    return out


def _discounted_tail_sum(values: Tensor, gamma: float) -> Tensor:
    """Σ_{k≥t} γ^{k−t} values_{:,k} along the last dimension (padding must already be 0)."""
    out = torch.zeros_like(values)
    acc = torch.zeros_like(values[:, 0]) if values.shape[1] else None
    for t in range(values.shape[1] - 1, -1, -1):
        acc = values[:, t] + gamma * acc
        out[:, t] = acc
    return out


def _float(x: Tensor) -> Tensor:
    return x if x.is_floating_point() else x.to(torch.get_default_dtype())


def group_zscore(reward: Tensor, group: Tensor, *, epsilon: float = 1e-6) -> Tensor:
    """GRPO's outcome advantage, one entry per trajectory: (R_i − mean_g) / (std_g + ε), sample std.

    This is what A²TGPO's Â_out is (GRPO's per-trajectory group statistics, as in verl's
    ``compute_grpo_outcome_advantage``, each trajectory counted once). A group whose rewards are all equal —
    singletons included — gets exactly 0, the project's GRPO convention (verl instead passes a singleton's raw
    reward through). Equal to ``deltattg.credit.grpo.step_expanded_advantage`` with every T_i = 1.
    """
    reward = _float(reward)
    dense, count = _dense_ids(group)
    n = torch.zeros(count, dtype=reward.dtype, device=reward.device).index_add_(0, dense, torch.ones_like(reward))
    mean = torch.zeros_like(n).index_add_(0, dense, reward) / n.clamp(min=1)
    centred = reward - mean[dense]
    var = torch.zeros_like(n).index_add_(0, dense, centred.square()) / (n - 1).clamp(min=1)
    lowest = torch.full_like(n, torch.inf).scatter_reduce(0, dense, reward, "amin")
    highest = torch.full_like(n, -torch.inf).scatter_reduce(0, dense, reward, "amax")
    advantage = centred / (var.sqrt()[dense] + epsilon)
    return torch.where((lowest == highest)[dense], torch.zeros_like(advantage), advantage)


def _answer_turn(mask: Tensor) -> tuple[Tensor, Tensor]:
    """(last real turn index per trajectory, ``[n, S]`` mask of the answer turns)."""
    last = mask.sum(dim=1) - 1
    columns = torch.arange(mask.shape[1], device=mask.device)
    return last, mask & (columns[None, :] == last[:, None])


def igpo_advantages(
    ig: Tensor, reward: Tensor, group: Tensor, step_mask: Tensor, *, gamma: float = 1.0, epsilon: float = 1e-6
) -> Tensor:
    """IGPO turn advantages ``[n, S]`` (0 at padding).

    1. Turn rewards (IGPO's method): r_{i,t} = IG_{i,t} for the turns before the answer turn, r_{i,T_i−1} = R_i (the
       outcome reward; IGPO uses F1 there). A one-turn trajectory has the outcome only.
    2. Joint group normalisation (their default ``info_gain_norm_mode="joint"``): every r_{i,t} of the prompt group —
       all trajectories, all turns, IG and outcome rewards together — is z-scored with the group's mean and
       σ = sqrt(population variance + 1e-8), σ = 1 for a group with one reward in all: r̃ = (r − μ)/(σ + ε).
    3. Discounted accumulation (γ = 1 by default): A_{i,t} = Σ_{k=t}^{T_i−1} γ^{k−t} r̃_{i,k}; every token of turn t
       gets A_{i,t}.

    One deliberate difference from their code: it finds IG turns by ``reward != 0`` (an IG of exactly 0 is dropped
    from the statistics and merged into the next turn); here every real turn counts, whatever its IG.
    """
    mask = _check_layout(ig, step_mask, "ig")
    ig = _float(ig)
    _, answer = _answer_turn(mask)
    reward = reward.to(ig.dtype)
    turn_reward = torch.where(answer, reward[:, None].expand_as(ig), ig)
    key = group.reshape(-1, 1).expand_as(mask)
    normalised = _pooled_zscore(turn_reward, mask, key, epsilon)
    return torch.where(mask, _discounted_tail_sum(normalised, gamma), torch.zeros_like(normalised))


def turn_group_normalised_ig(ig: Tensor, group: Tensor, step_mask: Tensor, *, epsilon: float = 1e-6) -> Tensor:
    """A²TGPO's turn-group normalisation: ĨG_{i,k} = (IG_{i,k} − μ_{g,k}) / (σ_{g,k} + ε) over the trajectories of
    prompt group g that have an IG turn at index k (the answer turn has none); ``[n, S]``, 0 elsewhere.

    σ_{g,k} = sqrt(population variance + 1e-8) as in IGPO's statistics, σ = 1 for a singleton (which, centred on
    itself, gets 0: with no peer at that depth there is no relative signal).
    """
    mask = _check_layout(ig, step_mask, "ig")
    ig = _float(ig)
    _, answer = _answer_turn(mask)
    informative = mask & ~answer
    dense_group, _ = _dense_ids(group)
    key = dense_group[:, None] * mask.shape[1] + torch.arange(mask.shape[1], device=mask.device)[None, :]
    return _pooled_zscore(ig, informative, key, epsilon)


def a2tgpo_advantages(
    ig: Tensor,
    reward: Tensor,
    group: Tensor,
    step_mask: Tensor,
    *,
    gamma: float = 1.0,
    alpha: float = 0.3,
    beta: float = 0.3,
    epsilon: float = 1e-6,
    outcome: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """A²TGPO: (turn advantages ``[n, S]``, turn clip factors c ``[n, S]``).

    With turns numbered k = 1..n (n = T_i, turn n the answer turn) as in issue 11:

    * ĨG_k — :func:`turn_group_normalised_ig`, within (prompt group, turn index), for k < n;
    * D_k = Σ_{j=k}^{n−1} γ^{j−k} ĨG_j / √(n − k) for k < n: the discounted sum of the n − k IG terms still ahead,
      divided by the square root of their number (variance-rescaled accumulation). At k = n there is no IG term
      (√0): D_n is defined as 0, so the answer turn gets Â_out only;
    * A_k = α·D_k + Â_out (α = 0.3), A_n = Â_out;
    * c_k = 1 + β(2σ(ĨG_k) − 1) (β = 0.3, σ the logistic function), so c_k ∈ (1 − β, 1 + β), c_k > 1 exactly when
      the turn beat its turn group (ĨG_k > 0). The answer turn (no IG) and padding get c = 1. The actor loss then
      clips turn k's tokens to [1 − ε_low·c_k, 1 + ε_high·c_k] (``deltattg.loss.policy_loss(clip_scale=…)``).

    Â_out is GRPO's per-trajectory group z-score of the outcome (:func:`group_zscore`), which is what the paper's
    GRPO-based outcome term implies; pass ``outcome`` (``[n]``) to use another, e.g. the step-expanded Eq. 14.
    Sign conventions: A_k − Â_out has the sign of D_k; at turn n − 1 it is α·ĨG_{n−1}.
    """
    mask = _check_layout(ig, step_mask, "ig")
    normalised = turn_group_normalised_ig(ig, group, step_mask, epsilon=epsilon)
    last, answer = _answer_turn(mask)
    informative = mask & ~answer
    terms_ahead = (last[:, None] - torch.arange(mask.shape[1], device=mask.device)[None, :]).clamp(min=1)
    accumulated = _discounted_tail_sum(normalised, gamma) / terms_ahead.to(normalised.dtype).sqrt()
    accumulated = torch.where(informative, accumulated, torch.zeros_like(accumulated))
    if outcome is None:
        outcome = group_zscore(reward, group, epsilon=epsilon)
    elif outcome.shape != reward.shape:
        raise ValueError(f"outcome must be [n] like reward, got {tuple(outcome.shape)}")
    outcome = outcome.to(normalised.dtype)
    advantage = torch.where(mask, alpha * accumulated + outcome[:, None], torch.zeros_like(accumulated))
    clip = 1.0 + beta * (2.0 * torch.sigmoid(normalised) - 1.0)
    clip = torch.where(informative, clip, torch.ones_like(clip))
    return advantage, clip


# ---- the registered estimators -------------------------------------------------------------------------------------
ANSWER_READS = frozenset({Reads.ANSWER_PROBS})
ANSWER_PASS = "deltattg.train.answers:answer_logprobs_pass"  # the trainer's pass that reads them (the actor's)
IG_GAMMA = Option("ig_gamma", "discount of the accumulated information gains", low=0, high=1)
IG_LOG = Option("ig_log", "IG in log-probability, log p_t − log p_{t−1}, instead of p_t − p_{t−1}")


def answer_inputs(batch: StepBatch) -> Tensor:
    """The batch's ``answer_logprobs`` ``[n, S+1]`` (``ValueError`` without them or with another shape)."""
    values = batch.answer_logprobs
    if values is None:
        raise ValueError("IGPO and A²TGPO read the reference answer's mean token log-prob after each turn: build the "
                         "batch with answer_logprobs")  # fmt: skip
    n, width = batch.step_mask.shape
    if tuple(values.shape) != (n, width + 1):
        raise ValueError(f"answer_logprobs must be [n, S+1] = {(n, width + 1)}, got {tuple(values.shape)}")
    return values


def turn_information_gain(batch: StepBatch, config: CreditConfig) -> Tensor:
    """IG of every turn ``[n, S]``: p_t − p_{t−1} with p = exp(mean token log-prob); with ``config.ig_log`` the
    difference of the mean log-probs themselves (= log p_t − log p_{t−1}, without the round trip through exp, which
    would underflow for a long, unlikely answer)."""
    logprobs = _float(answer_inputs(batch))
    values = logprobs if config.ig_log else answer_probabilities(logprobs)
    return information_gain(values, batch.step_mask)


def information_gain_credit(outcome: Tensor, advantages: Tensor, clip_scale: Tensor | None = None) -> Credit:
    """An information-gain estimator's answer: A_i = Â_out (the trajectory's GRPO outcome z-score, what the step
    advantages do not decompose into: they are additive, not A·w), its per-turn advantages and clip factors;
    ``information_gain``, or ``zero_advantage`` where A_i and every turn's advantage are 0 (:meth:`Credit.additive`)."""
    return Credit.additive(outcome, advantages, Fallback.INFORMATION_GAIN, clip_scale=clip_scale)


@register_estimator("igpo", reads=ANSWER_READS, side_pass=ANSWER_PASS, options=(IG_GAMMA, IG_LOG))
def igpo(batch: StepBatch, config: CreditConfig) -> Credit:
    """IGPO: turn rewards = gains in the reference answer's probability, z-scored per prompt group, accumulated.

    The answer turn's reward is the outcome; every turn reward of the prompt group is z-scored together; γ-discounted
    accumulation (:func:`igpo_advantages`)."""
    ig = turn_information_gain(batch, config)
    advantages = igpo_advantages(ig, batch.reward, batch.group, batch.step_mask, gamma=config.ig_gamma,
                                 epsilon=config.epsilon)  # fmt: skip
    return information_gain_credit(group_zscore(batch.reward, batch.group, epsilon=config.epsilon), advantages)


@register_estimator("a2tgpo", reads=ANSWER_READS, side_pass=ANSWER_PASS, options=(
    IG_GAMMA, Option("ig_alpha", "α: A_k = α·D_k + Â_out", low=0, high=MAX_CREDIT_SETTING),
    Option("ig_beta", "β: turn clip factor c_k = 1 + β(2σ(ĨG_k) − 1)", low=0, high=1), IG_LOG))  # fmt: skip
def a2tgpo(batch: StepBatch, config: CreditConfig) -> Credit:
    """A²TGPO: IGPO's gains normalised per (prompt, turn), rescaled, added to the outcome; a per-turn clip range.

    A_k = α·D_k + Â_out with D_k the variance-rescaled accumulation of the turn-group-normalised gains; the answer turn
    gets Â_out only; the clip factors c_k = 1 + β(2σ(ĨG_k) − 1) go to the loss (:func:`a2tgpo_advantages`)."""
    ig = turn_information_gain(batch, config)
    outcome = group_zscore(batch.reward, batch.group, epsilon=config.epsilon)
    advantages, clip = a2tgpo_advantages(ig, batch.reward, batch.group, batch.step_mask, gamma=config.ig_gamma,
                                         alpha=config.ig_alpha, beta=config.ig_beta, epsilon=config.epsilon,
                                         outcome=outcome)  # fmt: skip
    return information_gain_credit(outcome, advantages, clip)
