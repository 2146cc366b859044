"""CrEST — turn-segmented verified advantages × an entropy-gated self-teacher magnitude factor (seed 002's second
abstract).

Seed ``002`` holds CrEST's abstract only, and there is no public text or code: "turn-segmented verified advantages
address inter-turn dilution, while entropy-gated self-teacher modulation refines intra-turn token contributions"; "the
teacher's role ... reduced from determining update directions to modulating update magnitudes". Issue 11 fixes the
shape — a per-turn outcome the environment itself verifies, normalised within the group at the same turn, times
w = clip(exp(sign(A)·(log π_teacher − log π_student)), 1 ± ε_w), pulled toward 1 where the teacher's entropy is high,
with a floor — and leaves every choice to us. They are these.

**Level 1: turn-segmented verified advantage** (:func:`verified_zscore`, :func:`crest_step_advantages`; the
registered estimator's ``compute``).

1. *What is verified.* v_{i,t} ∈ {0, 1} is step t's outcome as the environment itself checks it, recorded by the
   rollout in ``steps[t].verified`` (``deltattg.envs.base.verified_outcome``): household and ALFWorld — the action
   was admissible (``info["valid"]``); BFCL — the step's tool calls all ran without error (``info["verified"]``:
   no ``Error during execution`` and no backend ``{"error": ...}`` answer). A step with nothing to verify (a BFCL
   reply without calls, an environment that reports neither key) has v = None. Never the planner's privileged
   progress (``optimal_remaining``), never the episode outcome (that is A_i's job).
2. *Turn.* The turn index is the step index t = 0..T_i − 1 (one action; for BFCL one reply, not one user turn), as
   in A²TGPO's (prompt, turn index) groups.
3. *Normalisation.* Within each cell (prompt group g, turn index t), over the cell's steps whose v is known:
   ṽ = (v − μ_{g,t}) / (σ_{g,t} + ε), σ the *population* standard deviation (the cell is the whole population of
   peers at that depth; for a binary v, σ = sqrt(p(1 − p))), ε = ``CreditConfig.epsilon`` (1e-6, GRPO's). A cell
   with a single known step or a constant v gives ṽ = 0 (no peer to be better or worse than); a step with v = None
   gets ṽ = 0 and does not enter the statistics; padding gets 0. For a cell of m known binary values,
   |ṽ| <= sqrt(m − 1).
4. *Combination.* Ã_{i,t} = A_i + β_v·ṽ_{i,t}, with A_i GRPO's step-expanded outcome advantage (Eq. 14, as ``grpo``
   and ``delta`` use: with β_v = 0 and w ≡ 1 CrEST is GRPO) and β_v = ``crest_beta`` = 0.5 (half a standard unit of
   the outcome's z-score per standard unit of verified outcome: the outcome stays the main signal). Additive, not
   A·w: a group whose outcomes are all equal (A_i = 0) still credits its turns by what the environment verified,
   as GiGPO's step term does.
5. *Sign.* The verified term may flip the sign of a step relative to A_i: an admissible action of a failed
   trajectory, in a cell where most peers' actions were inadmissible, can end up with Ã > 0 when β_v·ṽ > |A_i|.
   That is intended — the environment verified that turn — and bounded: |Ã − A_i| <= β_v·sqrt(m − 1). The
   magnitude factor below preserves the sign of Ã (not of A_i) on every token.

**Level 2: entropy-gated self-teacher magnitude factor** (:func:`crest_token_weights`; the record's
``teacher_weights``, applied by the trainer, ``deltattg.train.teacher``).

6. *Teacher.* The actor itself with θ_old's weights (those that sampled the batch), no gradient, reading each step's
   exact prompt with a privileged block in front of it: its chat template's rendering of one system message,
   ``PRIVILEGED_NOTE`` with the environment's ``reference_answer(task)`` (household: the planner's optimal plan from
   the start, one command per line — the text IGPO reads; BFCL: the ground-truth calls). The block is prepended to
   the student's prompt token ids rather than the prompt re-rendered, so the student's context stays bit-identical
   behind it (a re-rendering would lose the admissible list the rollout does not record, and could tokenise
   differently): log π_T − log π_S measures the reference alone. Details in ``deltattg.train.teacher``.
7. *Student.* log π_S = the θ_old log-probs the update uses (the sampled ones; recomputed ones with
   ``optim.recompute_old_logprobs``). Both at the rollout temperature T (1 when greedy), as θ_old's are.
8. *Direction.* s = sign(Ã) of the token's advantage — the combined step advantage Ã_{i,t} of item 4 (or a
   per-token advantage, if another hook set one). A token the teacher likes more than the student (log π_T >
   log π_S) gets w > 1 when Ã > 0 (reinforce it harder) and w < 1 when Ã < 0 (penalise it less); a token the
   teacher likes less, the reverse. s = 0 (Ã = 0) gives w = 1 (the advantage is 0 anyway).
9. *Clip.* w = clip(exp(s·(log π_T − log π_S)), 1 − ε_w, 1 + ε_w), ε_w = ``crest_epsilon`` = 0.2 (the scale of PPO's
   ratio clip: the teacher moves a token's step size by at most ±20%).
10. *Entropy gate.* g = H_T / log|V| ∈ [0, 1], H_T the entropy of the teacher's next-token distribution at that
    position (at temperature T) and |V| the width of the LM head's output (the model's vocabulary, padding rows
    included); clamped to [0, 1] against rounding. w ← 1 + (1 − g)·(w − 1): linear pull toward 1, so w = 1 exactly
    where the teacher is maximally uncertain (g = 1) and w is untouched where it is certain (g = 0).
11. *Floor.* w ← max(w, w_min), w_min = ``crest_floor`` = 0.5, last. With ε_w <= 1 − w_min (the defaults) it never
    binds (1 − ε_w >= w_min); it matters for a wider ε_w, where it keeps w > 0 — the factor modulates magnitudes,
    it never zeroes or flips a token's advantage (w_min ∈ (0, 1] is enforced). Hence
    w ∈ [max(w_min, 1 − ε_w), 1 + ε_w] and sign(Ã·w) = sign(Ã).
12. *No self-normalisation.* Unlike DelTA's ω, w is not rescaled to mean 1: its range already bounds how far the
    update's scale moves, and a rescaling would couple every token to the whole batch.
13. *No gradient, no clip change.* w is a constant of the loss (computed without gradient); the PPO ratio clip is
    unchanged (no per-token clip range).

**Where it runs.** The registered estimator ``crest`` reads the verified outcomes (``Reads.VERIFIED``; records may
carry them in ``steps[].verified``) and teacher log-probs (``Reads.TEACHER_LOGPROBS``), which only the actor gives:
``deltattg credit`` and ``inspect`` refuse it (the record's ``records_problem``). Cost: one extra no-grad forward
pass over the step rows, each prompt longer by the privileged block (``time/teacher``). Settings:
``CreditConfig.crest_beta``, ``crest_epsilon``, ``crest_floor``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from deltattg.credit.batch import MAX_CREDIT_SETTING, Credit, CreditConfig, Fallback, StepBatch
from deltattg.credit.grpo import outcome_advantage
from deltattg.credit.registry import Option, Reads, TeacherTokens, register_estimator

PRIVILEGED_NOTE = "A reference solution of this task (privileged: the acting agent does not see it):\n{reference}"
"""The privileged context the self-teacher reads before the student's prompt (item 6), as one system message."""


# ---- level 1: turn-segmented verified advantages ---------------------------------------------------------------------
def _check_verified(verified: Tensor, step_mask: Tensor) -> Tensor:
    if step_mask.dim() != 2:
        raise ValueError(f"step_mask must be [n, S], got shape {tuple(step_mask.shape)}")
    if verified.shape != step_mask.shape:
        raise ValueError(f"verified must have step_mask's shape {tuple(step_mask.shape)}, got {tuple(verified.shape)}")
    if verified.is_floating_point() or bool(((verified < -1) | (verified > 1)).any()):
        raise ValueError("verified must hold integer codes 1 (verified), 0 (failed) or −1 (nothing verified)")
    return step_mask.bool() & (verified >= 0)


def verified_zscore(verified: Tensor, group: Tensor, step_mask: Tensor, *, epsilon: float = 1e-6) -> Tensor:
    """ṽ ``[n, S]`` (module docstring, item 3): each known v_{i,t} z-scored within its (prompt group, turn index) cell
    with the population σ, ṽ = (v − μ)/(σ + ε); 0 for a singleton or constant cell, where v is unknown (code −1) and at
    padding. ``verified`` holds codes 1/0/−1 (``StepBatch.verified``), ``group`` any integer ids ``[n]``."""
    known = _check_verified(verified, step_mask)
    n, width = step_mask.shape
    dtype = torch.get_default_dtype()
    _, dense = torch.unique(group, return_inverse=True)
    cell = dense.reshape(-1, 1) * width + torch.arange(width, device=group.device)[None, :]
    cells = cell[known]
    values = verified[known].to(dtype)
    size = int(dense.max().item() + 1) * width if n else 0
    count = torch.zeros(size, dtype=dtype, device=values.device).index_add_(0, cells, torch.ones_like(values))
    mean = torch.zeros(size, dtype=dtype, device=values.device).index_add_(0, cells, values) / count.clamp(min=1)
    centered = values - mean[cells]  # exactly 0 in a singleton or constant cell
    variance = torch.zeros(size, dtype=dtype, device=values.device).index_add_(0, cells, centered.square())
    std = (variance / count.clamp(min=1)).sqrt()
    out = torch.zeros(n, width, dtype=dtype, device=values.device)
    out[known] = centered / (std[cells] + epsilon)
    return out


def crest_step_advantages(outcome: Tensor, verified_z: Tensor, step_mask: Tensor, *, beta: float = 0.5) -> Tensor:
    """Ã_{i,t} = A_i + β_v·ṽ_{i,t} on real steps, 0 at padding (module docstring, items 4–5)."""
    if outcome.dim() != 1 or verified_z.shape != step_mask.shape or outcome.shape[0] != step_mask.shape[0]:
        raise ValueError(f"need outcome [n] and verified_z [n, S] matching step_mask {tuple(step_mask.shape)}; got "
                         f"{tuple(outcome.shape)} and {tuple(verified_z.shape)}")  # fmt: skip
    mask = step_mask.bool()
    combined = outcome.to(verified_z.dtype)[:, None] + beta * verified_z
    return torch.where(mask, combined, torch.zeros_like(combined))


# ---- level 2: the self-teacher's magnitude factor --------------------------------------------------------------------
@torch.no_grad()
def crest_token_weights(
    teacher_logprob: Tensor,
    student_logprob: Tensor,
    teacher_entropy: Tensor,
    advantage: Tensor,
    mask: Tensor,
    *,
    vocab_size: int,
    epsilon: float = 0.2,
    floor: float = 0.5,
) -> Tensor:
    """w ``[N, L]`` (module docstring, items 8–11), 0 at masked-out positions:

    w = clip(exp(sign(A)·(log π_T − log π_S)), 1 − ε_w, 1 + ε_w); g = clamp(H_T / log|V|, 0, 1);
    w ← 1 + (1 − g)·(w − 1); w ← max(w, w_min).

    ``teacher_logprob``, ``student_logprob``: log-probs of the sampled tokens; ``teacher_entropy``: the teacher's
    entropy (nats) at each position; ``advantage``: each token's advantage (only its sign is read); ``vocab_size``:
    |V| >= 2. Computed in at least float32."""
    shapes = {tuple(x.shape) for x in (teacher_logprob, student_logprob, teacher_entropy, advantage, mask)}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(f"teacher/student log-probs, teacher entropy, advantage and mask must all be [N, L]; got "
                         f"{sorted(shapes)}")  # fmt: skip
    if vocab_size < 2:
        raise ValueError(f"the entropy gate needs a vocabulary of at least 2 tokens, got {vocab_size}")
    if not (epsilon >= 0 and 0 < floor <= 1):
        raise ValueError(f"need epsilon >= 0 and 0 < floor <= 1, got {epsilon}, {floor}")
    dtype = torch.promote_types(teacher_logprob.dtype, torch.float32)
    sign = torch.sign(advantage.detach()).to(dtype)
    log_ratio = teacher_logprob.detach().to(dtype) - student_logprob.detach().to(dtype)
    weight = torch.exp(sign * log_ratio).clamp(min=1.0 - epsilon, max=1.0 + epsilon)
    gate = (teacher_entropy.detach().to(dtype) / math.log(vocab_size)).clamp(min=0.0, max=1.0)
    weight = 1.0 + (1.0 - gate) * (weight - 1.0)
    weight = weight.clamp(min=floor)
    return torch.where(mask.bool(), weight, torch.zeros_like(weight))


# ---- the registered estimator ----------------------------------------------------------------------------------------
def verified_inputs(batch: StepBatch) -> Tensor:
    """The batch's verified codes ``[n, S]`` (``ValueError`` without them)."""
    if batch.verified is None:
        raise ValueError("CrEST reads the verified step outcomes: build the batch with verified (steps[].verified)")
    return batch.verified


def crest_weights(teacher: TeacherTokens, student_logprob: Tensor, advantage: Tensor, mask: Tensor,
                  config: CreditConfig) -> Tensor:  # fmt: skip
    """The record's ``teacher_weights``: :func:`crest_token_weights` with ``config``'s ε_w and w_min."""
    return crest_token_weights(teacher.logprob, student_logprob, teacher.entropy, advantage, mask,
                               vocab_size=teacher.vocab_size, epsilon=config.crest_epsilon, floor=config.crest_floor)


def verified_metrics(batch: StepBatch) -> dict[str, float]:
    """``verified/known`` (share of real steps with a verified outcome) and ``verified/rate`` (share of those that
    passed); {} when the batch carries none."""
    if batch.verified is None:
        return {}
    real = batch.step_mask.bool()
    known = real & (batch.verified >= 0)
    steps, checked = int(real.sum()), int(known.sum())
    return {"verified/known": checked / steps if steps else 0.0,
            "verified/rate": int((batch.verified[known] == 1).sum()) / checked if checked else 0.0}  # fmt: skip


@register_estimator("crest", reads=frozenset({Reads.VERIFIED, Reads.TEACHER_LOGPROBS}), teacher_weights=crest_weights,
                    side_pass="deltattg.train.teacher:self_teacher_pass", options=(
    Option("crest_beta", "β_v: Ã_t = A_i + β_v·ṽ_t, ṽ the verified outcome z-scored per (prompt, turn)", low=0,
           high=MAX_CREDIT_SETTING),
    Option("crest_epsilon", "ε_w: the teacher's weight w is clipped to [1 − ε_w, 1 + ε_w]", low=0, high=100),
    Option("crest_floor", "w_min: the lowest teacher weight (after the entropy gate)", low=0, low_open=True,
           high=1)))  # fmt: skip
def crest(batch: StepBatch, config: CreditConfig) -> Credit:
    """CrEST: GRPO's outcome plus per-turn verified outcomes, scaled per token by an entropy-gated self-teacher.

    Ã_{i,t} = A_i + β_v·ṽ_{i,t} (:func:`verified_zscore`, :func:`crest_step_advantages`); the token factor w needs
    the actor as a privileged self-teacher, so the trainer applies it (the record's ``teacher_weights``, here
    :func:`crest_weights`) and hands the policy loss Ã·w per token. ``verified_turns``, or ``zero_advantage`` where
    A_i and every step's advantage are 0.
    """
    outcome = outcome_advantage(batch, config)
    z = verified_zscore(verified_inputs(batch), batch.group, batch.step_mask, epsilon=config.epsilon)
    advantages = crest_step_advantages(outcome, z, batch.step_mask, beta=config.crest_beta)
    return Credit.additive(outcome, advantages, Fallback.VERIFIED_TURNS)
