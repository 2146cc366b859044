"""The reference answer's log-probability after every turn, read by the actor itself: what IGPO and A²TGPO read
(``Reads.ANSWER_PROBS``; ``deltattg.credit.information_gain``).

For trajectory i with T_i actions and each prefix h_t, t = 0..T_i, the actor teacher-forces the task's reference
answer as its own reply after the prompt it would read at h_t, and the mean token log-probability of that reply is
``answer_logprobs[t]`` (p_t = exp of it; IG_t = p_{t+1} − p_t). Choices, all ours:

* **the answer** is the environment's ``reference_answer(task)`` (household: the planner's optimal plan from the
  start, one command per line — the expert's plan stands in for a QA answer; BFCL: the ground-truth calls), rendered
  as an assistant reply exactly as the actor's own actions are: its tokens without special tokens, then the
  end-of-turn token (as ``deltattg.train.actor.Demonstrator`` renders an expert action). Every token, the end of
  turn included, counts in the mean;
* **the prompt** at h_t for t < T_i is the one the actor read before action t (``steps[t].prompt_ids``: same layout,
  history window, admissible list and truncation). After the last action (t = T_i) no prompt was read; it is rebuilt
  in the same layout from the recorded messages, without the admissible list (the rollout does not record the
  last one). Column T_i only enters IG of the answer turn, which neither IGPO nor A²TGPO uses (the outcome takes
  its place), so this difference never reaches an advantage;
* **log-probs** are log softmax(logits / T) at the rollout temperature T (1 when greedy), as the old log-probs of
  the update are; no gradient. Each distinct (prompt, answer) pair is read once (the G rollouts of a task share
  their first prompt), in micro-batches of ``optim.micro_batch_size`` rows, each distinct prompt of a micro-batch
  read once (``run.share_prompts``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

import torch

from deltattg.credit.information_gain import mean_token_logprob
from deltattg.data.trajectory import Trajectory, assistant_indices, text_of
from deltattg.envs.base import Environment, HasReferenceAnswer, Task, reference_answer
from deltattg.rollout.policies import LMPolicy
from deltattg.rollout.prompts import chat_prompt, window_prompt
from deltattg.train.rows import Row, chunks, collate, response_logprobs
from deltattg.train.side_passes import Setup, SidePass


def check_reference_answers(env: Environment, method: str, reads: str) -> None:
    """Refuse an environment without ``reference_answer`` for estimator ``method``, which reads ``reads``."""
    if not isinstance(env, HasReferenceAnswer):
        raise ValueError(f"algo.method {method} reads {reads}, and the {env.name!r} environment has none (no "
                         "reference_answer(task)); use an environment with one (household, bfcl)")  # fmt: skip


def reference_text(env: Environment, tasks: Mapping[str, Task], task_id: str, method: str) -> str:
    """The reference answer of task ``task_id`` (one of ``tasks``, by id) as text (``ValueError`` without one)."""
    task = tasks.get(task_id)
    if task is None:
        raise ValueError(f"algo.method {method}: no task {task_id!r} to take the reference answer from")
    text = reference_answer(env, task)
    if text is None:
        raise ValueError(f"algo.method {method}: the {env.name!r} environment gives task {task_id!r} no reference "
                         "answer")  # fmt: skip
    return text


Pass = TypeVar("Pass", bound="ReferencePass")


class ReferencePass:
    """A no-grad pass of ``policy``'s actor that reads each task's reference answer (IGPO / A²TGPO's answer
    log-probs, CrEST's self-teacher). ``tasks``: the tasks the trajectories were rolled out on (a trajectory's
    ``group`` is its task's id). Refuses, at construction, an environment with no ``reference_answer`` (``method``
    names the estimator, ``READS`` what it reads). :meth:`task_tokens` caches each task's token ids."""

    READS = "each task's reference answer"

    def __init__(self, policy: LMPolicy, env: Environment, tasks: Sequence[Task], method: str, *,
                 temperature: float, micro_batch_size: int, share: bool = True):  # fmt: skip
        check_reference_answers(env, method, self.READS)
        self.policy, self.env, self.method = policy, env, method
        self.tasks = {task.id: task for task in tasks}
        self.temperature, self.micro_batch_size, self.share = temperature, micro_batch_size, share
        self._tokens: dict[str, list[int]] = {}

    @classmethod
    def from_setup(cls: type[Pass], setup: Setup) -> Pass:
        """The pass of a training run (a side pass's :class:`~deltattg.train.side_passes.Setup`): the actor reads each
        training task's reference answer at the rollout temperature, in micro-batches of ``optim.micro_batch_size``,
        each distinct prompt once per micro-batch as ``run.share_prompts`` says."""
        config = setup.config
        return cls(setup.policy, setup.env, setup.tasks, config.algo.method, temperature=config.rollout.temperature,
                   micro_batch_size=config.optim.micro_batch_size, share=config.run.share_prompts)  # fmt: skip

    def task_tokens(self, task_id: str) -> list[int]:
        """:meth:`render` of task ``task_id``'s reference answer, computed once per task."""
        found = self._tokens.get(task_id)
        if found is None:
            found = self._tokens[task_id] = self.render(reference_text(self.env, self.tasks, task_id, self.method))
        return found

    def render(self, reference: str) -> list[int]:
        raise NotImplementedError


class AnswerLogprobs(ReferencePass, SidePass):
    """Sets ``answer_logprobs`` (T + 1 numbers) on every trajectory of a batch with ``policy``'s actor
    (:class:`ReferencePass`), before the credit reads them: IGPO / A²TGPO's side pass
    (:meth:`before_credit`; ``deltattg.train.side_passes``)."""

    READS = "the probability of each task's reference answer after every turn"
    phase = "answer"

    def render(self, reference: str) -> list[int]:
        """The reference answer as the actor's reply: its tokens, then the end-of-turn token."""
        return self.policy.tokenizer(reference, add_special_tokens=False)["input_ids"] + [self.policy.eos_ids[0]]

    def answer_ids(self, task_id: str) -> list[int]:
        """The reference answer of task ``task_id`` as the actor's reply (:meth:`render`)."""
        return self.task_tokens(task_id)

    def prompts(self, trajectory: Trajectory) -> list[list[int]]:
        """The actor's prompt ids at h_0..h_T (see the module doc)."""
        steps = trajectory.steps or []
        if any(step.prompt_ids is None for step in steps):
            raise ValueError(f"trajectory {trajectory.id} lacks the prompt ids of its steps (not an LM rollout)")
        before = [list(step.prompt_ids) for step in steps]  # type: ignore[arg-type]
        return before + [self.policy.encode(self.last_prompt(trajectory))]

    def last_prompt(self, trajectory: Trajectory) -> list[dict]:
        """The prompt messages after the last action, in the policy's layout, from the recorded chat
        (system, first observation, then action / observation pairs)."""
        messages = trajectory.messages or []
        if len(messages) < 2:
            raise ValueError(f"trajectory {trajectory.id} has no recorded chat to rebuild its last prompt from")
        layout = self.policy.prompt
        if layout.layout == "chat":
            return chat_prompt(messages, None, layout)
        actions = assistant_indices(messages)
        history = [(text_of(messages[k].get("content")),
                    text_of(messages[k + 1].get("content")) if k + 1 < len(messages) else "") for k in actions]
        observation = text_of(messages[-1].get("content")) if actions else text_of(messages[1].get("content"))
        return window_prompt(text_of(messages[0].get("content")), text_of(messages[1].get("content")), history,
                             observation, None, layout)  # fmt: skip

    @torch.no_grad()
    def before_credit(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """Read and set every trajectory's ``answer_logprobs``; return ``answer/*`` metrics (distinct (prompt,
        answer) rows read, mean answer tokens, mean log-prob before the first and after the last action)."""
        index: dict[tuple[tuple[int, ...], str], int] = {}
        rows: list[Row] = []
        where: list[list[int]] = []
        for i, trajectory in enumerate(trajectories):
            answer = self.answer_ids(trajectory.group)
            slots = []
            for t, prompt in enumerate(self.prompts(trajectory)):
                key = (tuple(prompt), trajectory.group)
                if key not in index:
                    index[key] = len(rows)
                    rows.append(Row(prompt, answer, i, t))
                slots.append(index[key])
            where.append(slots)
        model = self.policy.model
        model.eval()
        device = next(model.parameters()).device
        pad = self.policy.tokenizer.pad_token_id
        pad = self.policy.eos_ids[0] if pad is None else pad
        means = torch.zeros(len(rows))
        for micro in chunks(range(len(rows)), self.micro_batch_size):
            batch = collate([rows[k] for k in micro], pad, device, share=self.share)
            logprobs, _ = response_logprobs(model, batch, self.temperature, entropy_grad=False)
            means[micro] = mean_token_logprob(logprobs.float(), batch.response_mask).cpu()
        for trajectory, slots in zip(trajectories, where):
            trajectory.answer_logprobs = means[slots].tolist()
        first = [t.answer_logprobs[0] for t in trajectories]  # type: ignore[index]
        last = [t.answer_logprobs[-1] for t in trajectories]  # type: ignore[index]
        return {
            "answer/rows": len(rows),
            "answer/tokens": sum(len(r.response) for r in rows) / max(len(rows), 1),
            "answer/logprob_first": sum(first) / max(len(first), 1),
            "answer/logprob_last": sum(last) / max(len(last), 1),
        }


def answer_logprobs_pass(setup: Setup) -> AnswerLogprobs:
    """IGPO / A²TGPO's side pass (their records' ``side_pass``)."""
    return AnswerLogprobs.from_setup(setup)
