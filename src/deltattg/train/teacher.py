"""A privileged self-teacher: the actor reading each step's prompt with the task's reference answer in front of it —
what CrEST's token factor reads (``Reads.TEACHER_LOGPROBS``; ``deltattg.credit.crest``, items 6–13).

For every step row (the exact prompt the actor read, then the response it sampled) the actor, with the weights that
sampled the batch (θ_old) and no gradient, reads ``privileged block + prompt`` and gives, at each sampled response
token, its log-probability log π_T and the entropy H_T of its whole next-token distribution. The estimator record's
``teacher_weights`` turns them, with the student's own log-probs, into per-token weights w; the policy loss gets
Ã·w (:class:`TeacherWeights`, CrEST's side pass). Choices, all ours:

* **the privileged block** is the actor's chat template rendering one system message,
  ``deltattg.credit.crest.PRIVILEGED_NOTE`` with the environment's ``reference_answer(task)`` (household: the
  planner's optimal plan from the start, one command per line — the text IGPO / A²TGPO read; BFCL: the ground-truth
  calls; the lookup and its refusals are ``deltattg.train.answers``'), without a generation prompt and tokenised
  without added special tokens. A chat template that cannot render a lone system message (one that raises) gets
  the note's plain tokens and a newline instead. With the tiny word-level tokenizer the note's own words are
  ``<unk>`` (its vocabulary is left as it is, so every tiny actor stays what it was); the reference's commands are
  known words;
* **the teacher's prompt** is the block followed by the step's recorded ``prompt_ids``, unchanged: the student's
  context, after its own truncation, stays bit-identical behind the block (re-rendering it would lose the admissible
  list, which the rollout does not record), so log π_T − log π_S measures the reference alone. It is not truncated
  again: ``rollout.max_prompt_tokens`` limits what the student reads, not the teacher;
* **log-probs and entropies** come from one pass at the rollout temperature T (1 when greedy), as θ_old's log-probs
  do; the rows are read in micro-batches of ``optim.micro_batch_size``, rows with the same prompt side by side and
  each distinct prompt of a micro-batch read once (``run.share_prompts``);
* **the student's log-probs** are the θ_old log-probs the update uses (the sampled ones, or the recomputed ones with
  ``optim.recompute_old_logprobs``).

Cost: one no-grad forward pass over the step rows, each prompt longer by the block; timed as ``time/teacher``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from deltattg.credit import CreditConfig, Estimator, TeacherTokens
from deltattg.credit.crest import PRIVILEGED_NOTE
from deltattg.data.trajectory import Trajectory
from deltattg.train.answers import ReferencePass
from deltattg.train.rows import Row, chunks, collate, logprobs_of, response_logits
from deltattg.train.side_passes import Setup, SidePass, UpdateBatch, token_advantage_row


class SelfTeacher(ReferencePass):
    """The actor of ``policy`` as a privileged self-teacher of the step rows (module doc; :class:`ReferencePass`)."""

    READS = "each task's reference answer (its privileged self-teacher's context)"

    def render(self, reference: str) -> list[int]:
        """The privileged block: the note with the reference answer, as one rendered system message (module doc)."""
        note = PRIVILEGED_NOTE.format(reference=reference)
        tokenizer = self.policy.tokenizer
        try:
            text = tokenizer.apply_chat_template([{"role": "system", "content": note}], tokenize=False,
                                                 add_generation_prompt=False)  # fmt: skip
        except Exception:  # a template that refuses a lone system message (jinja2's TemplateError, ...)
            text = note + "\n"
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    def block(self, task_id: str) -> list[int]:
        """The privileged block of task ``task_id`` (:meth:`render`)."""
        return self.task_tokens(task_id)

    @torch.no_grad()
    def read(self, trajectories: Sequence[Trajectory], rows: Sequence[Row]) -> tuple[list[Tensor], list[Tensor], int]:
        """Each row's teacher log-probs and entropies of its response tokens (on the CPU, float32) and |V|."""
        teacher_rows = [Row(self.block(trajectories[r.traj].group) + list(r.prompt), list(r.response), r.traj, r.step)
                        for r in rows]  # fmt: skip
        by_prompt: dict[tuple[int, ...], list[int]] = {}
        for k, row in enumerate(teacher_rows):
            by_prompt.setdefault(tuple(row.prompt), []).append(k)
        order = [k for ks in by_prompt.values() for k in ks]  # rows with one prompt side by side
        model = self.policy.model
        model.eval()
        device = next(model.parameters()).device
        pad = self.policy.tokenizer.pad_token_id
        pad = self.policy.eos_ids[0] if pad is None else pad
        logprobs: list[Tensor] = [torch.empty(0)] * len(rows)
        entropies: list[Tensor] = [torch.empty(0)] * len(rows)
        vocab_size = 0
        for micro in chunks(order, self.micro_batch_size):
            batch = collate([teacher_rows[k] for k in micro], pad, device, share=self.share)
            logits = response_logits(model, batch)
            vocab_size = logits.shape[-1]
            logp, entropy = logprobs_of(logits, batch, self.temperature, entropy_grad=False)
            for j, k in enumerate(micro):
                length = len(rows[k].response)
                logprobs[k], entropies[k] = logp[j, :length].float().cpu(), entropy[j, :length].float().cpu()
        return logprobs, entropies, vocab_size


class TeacherWeights(SidePass):
    """CrEST's side pass: before the update, the self-teacher reads the step rows (:meth:`SelfTeacher.read`) and the
    estimator's ``teacher_weights`` scale their advantages against θ_old's log-probs (the update's):
    :func:`teacher_weighted_advantages` on the actor's device."""

    phase = "teacher"

    def __init__(self, teacher: SelfTeacher, estimator: Estimator, credit: CreditConfig):
        self.teacher, self.estimator, self.credit = teacher, estimator, credit

    def token_advantages(self, batch: UpdateBatch) -> dict[str, float]:
        logprobs, entropies, vocab_size = self.teacher.read(batch.trajectories, batch.rows)
        device = next(self.teacher.policy.model.parameters()).device
        batch.per_token, metrics = teacher_weighted_advantages(
            self.estimator, self.credit, batch.advantages, batch.old_logprobs, logprobs, entropies, vocab_size,
            per_token=batch.per_token, device=device)  # fmt: skip
        return metrics


def self_teacher_pass(setup: Setup) -> TeacherWeights:
    """CrEST's side pass (its record's ``side_pass``): the actor as the self-teacher of each training task."""
    return TeacherWeights(SelfTeacher.from_setup(setup), setup.estimator, setup.config.credit)


def teacher_weighted_advantages(
    estimator: Estimator,
    config: CreditConfig,
    advantages: Tensor,
    student_logprobs: Sequence[Tensor],
    teacher_logprobs: Sequence[Tensor],
    teacher_entropies: Sequence[Tensor],
    vocab_size: int,
    *,
    per_token: Sequence[Tensor] | None = None,
    device: torch.device | str = "cpu",
) -> tuple[list[Tensor], dict[str, float]]:
    """Each row's per-token advantages Ã_k·w_k, w from the estimator's ``teacher_weights`` over every response token of
    the batch at once, and ``<name>/weight_mean``, ``_min``, ``_max``, ``_std`` (population), ``<name>/amplified`` and
    ``<name>/damped`` (shares of tokens with w > 1, w < 1), ``<name>/teacher_logratio`` (mean log π_T − log π_S) and
    ``<name>/teacher_entropy`` (mean H_T / log|V|) over those tokens. ``advantages``: one per row (Ã of its step);
    ``per_token``: each row's own per-token advantages instead, where another hook set them. The lists hold one 1-D
    tensor per row, all of the row's response length."""
    if estimator.teacher_weights is None:
        raise ValueError(f"estimator {estimator.name!r} has no teacher weights")
    lengths = [len(lp) for lp in student_logprobs]
    for name, values in (("teacher log-probs", teacher_logprobs), ("teacher entropies", teacher_entropies),
                         ("per-token advantages", per_token)):  # fmt: skip
        if values is not None and [len(v) for v in values] != lengths:
            raise ValueError(f"{name}: one value per response token of every row, as the student's log-probs")
    if not lengths:
        return [], {}
    student = torch.cat([lp.float() for lp in student_logprobs]).to(device)[None]  # every token as one row: [1, M]
    advantage = token_advantage_row(advantages, lengths, per_token, student)
    teacher = TeacherTokens(torch.cat(list(teacher_logprobs)).to(student)[None],
                            torch.cat(list(teacher_entropies)).to(student)[None], vocab_size)  # fmt: skip
    weight = estimator.teacher_weights(teacher, student, advantage, torch.ones_like(student, dtype=torch.bool),
                                       config)[0]  # fmt: skip
    out = (advantage[0] * weight).to("cpu", advantages.dtype)
    name = estimator.name
    metrics = {} if weight.numel() == 0 else {
        f"{name}/weight_mean": weight.mean().item(), f"{name}/weight_min": weight.min().item(),
        f"{name}/weight_max": weight.max().item(), f"{name}/weight_std": weight.std(correction=0).item(),
        f"{name}/amplified": (weight > 1).float().mean().item(), f"{name}/damped": (weight < 1).float().mean().item(),
        f"{name}/teacher_logratio": (teacher.logprob - student).mean().item(),
        f"{name}/teacher_entropy": teacher.entropy.mean().item() / math.log(max(vocab_size, 2)),
    }  # fmt: skip
    return list(out.split(lengths)), metrics
