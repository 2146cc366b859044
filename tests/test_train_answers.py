"""The trainer's reference-answer log-probs (IGPO / A²TGPO, ``deltattg.train.answers``): the actor's own teacher-forced
log-probs of the reference answer after every prefix, each distinct (prompt, answer) read once; an environment with
no reference answer is refused naming the method."""

from __future__ import annotations

import pytest
import torch

from deltattg.envs.household import HouseholdConfig, HouseholdEnv
from deltattg.rollout.engine import run_episodes
from deltattg.rollout.policies import LMPolicy, SamplingConfig
from deltattg.rollout.prompts import PromptConfig
from deltattg.tiny import tiny_llama
from deltattg.train.actor import tiny_tokenizer
from deltattg.train.answers import AnswerLogprobs

MAX_TURNS = 3


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def rollouts(layout: str):
    env = HouseholdEnv(HouseholdConfig.short())
    prompt = PromptConfig(layout=layout)  # type: ignore[arg-type]
    tokenizer = tiny_tokenizer(env, prompt, MAX_TURNS)
    model = tiny_llama(tokenizer, hidden=32, layers=1, heads=2, seed=1).eval()
    policy = LMPolicy(model, tokenizer, SamplingConfig(max_new_tokens=4), prompt, name="actor")
    tasks = env.tasks("train")[:2]
    torch.manual_seed(0)
    trajectories = run_episodes(lambda: HouseholdEnv(env.config), tasks, policy, group_size=3, max_turns=MAX_TURNS)
    return env, tasks, policy, trajectories


def teacher_forced(policy: LMPolicy, prompt: list[int], answer: list[int], temperature: float) -> float:
    """The mean log-prob of ``answer`` after ``prompt``, one unpadded pass."""
    with torch.no_grad():
        logits = policy.model(torch.tensor([prompt + answer])).logits[0, len(prompt) - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(answer)[:, None]).mean().item()


@pytest.mark.parametrize("layout", ["window", "chat"])
def test_answer_logprobs_are_the_actors_teacher_forced_mean(layout):
    env, tasks, policy, trajectories = rollouts(layout)
    scorer = AnswerLogprobs(policy, env, tasks, "igpo", temperature=0.7, micro_batch_size=4)
    metrics = scorer.before_credit(trajectories)
    # The answer: the planner's plan rendered as the actor's reply (its words, then the end of turn).
    answer = scorer.answer_ids(tasks[0].id)
    words = policy.tokenizer(env.reference_answer(tasks[0]), add_special_tokens=False)["input_ids"]
    assert answer == words + [policy.eos_ids[0]]
    for trajectory in trajectories:
        values = trajectory.answer_logprobs
        assert len(values) == trajectory.num_steps + 1 and all(v <= 0 for v in values)
        # Before action t (t < T): exactly the prompt the actor read, steps[t].prompt_ids.
        ids = scorer.answer_ids(trajectory.group)
        for t, step in enumerate(trajectory.steps):
            assert values[t] == pytest.approx(teacher_forced(policy, step.prompt_ids, ids, 0.7), abs=1e-5)
        # After the last action: the same layout rebuilt from the chat, without the admissible list.
        last = policy.tokenizer.decode(scorer.prompts(trajectory)[-1])
        final = trajectory.messages[-1]["content"]
        assert final.split()[-1] in last.split() and "Admissible" not in last
        assert "Admissible" in policy.tokenizer.decode(trajectory.steps[-1].prompt_ids)  # what the actor read
        assert values[-1] == pytest.approx(teacher_forced(policy, scorer.prompts(trajectory)[-1], ids, 0.7), abs=1e-5)
    # The G rollouts of a task share their first prompt: read once per task, as every repeated prompt.
    first = {t.group: t.answer_logprobs[0] for t in trajectories}
    assert all(t.answer_logprobs[0] == first[t.group] for t in trajectories)
    distinct = {(tuple(p), t.group) for t in trajectories for p in scorer.prompts(t)}
    assert metrics["answer/rows"] == len(distinct) < sum(t.num_steps + 1 for t in trajectories)
    lengths = [len(scorer.answer_ids(group)) for _, group in distinct]
    assert metrics["answer/tokens"] == pytest.approx(sum(lengths) / len(lengths))
    assert metrics["answer/logprob_first"] == pytest.approx(sum(t.answer_logprobs[0] for t in trajectories) / 6)


def test_an_environment_without_a_reference_answer_is_refused_naming_the_method():
    env, tasks, policy, _ = rollouts("window")

    class NoAnswers:  # the environment protocol, without reference_answer
        name, system_prompt, max_steps = "plain", env.system_prompt, env.max_steps
        tasks, reset, step, admissible_actions = env.tasks, env.reset, env.step, env.admissible_actions

    with pytest.raises(ValueError, match=r"algo\.method a2tgpo .* 'plain' environment has none"):
        AnswerLogprobs(policy, NoAnswers(), tasks, "a2tgpo", temperature=1.0, micro_batch_size=4)
