"""Test-time guidance (E.5): the meter's choice among K candidates, branches that leave the episode untouched."""

from __future__ import annotations

import pytest
import torch

from deltattg.data.trajectory import MeterOutput
from deltattg.envs.household import HouseholdConfig, HouseholdEnv, vocabulary
from deltattg.guidance import Branches, GuidedPolicy, pick_lowest_cost, try_action
from deltattg.meter.step_quality import state_cost
from deltattg.rollout.engine import run_episodes, start_episode
from deltattg.rollout.policies import LMPolicy, SamplingConfig
from deltattg.tiny import tiny_llama, word_tokenizer
from test_meter_regression import tiny_meter

CONFIG = HouseholdConfig.short()
PROMPT_WORDS = ["You", "have", "taken", "step", "s", "The", "most", "recent", "Current", "observation", "Admissible", "actions"]


class ReplayOnly:
    """The household environment without snapshot/restore, so branches must replay (as for ALFWorld)."""

    def __init__(self):
        self.inner = HouseholdEnv(CONFIG)
        self.name, self.system_prompt, self.max_steps = "replay-only", self.inner.system_prompt, self.inner.max_steps

    def tasks(self, split):
        return self.inner.tasks(split)

    def reset(self, task):
        return self.inner.reset(task)

    def step(self, action):
        return self.inner.step(action)

    def admissible_actions(self):
        return self.inner.admissible_actions()


@pytest.fixture(scope="module")
def actor():
    tokenizer = word_tokenizer(vocabulary(CONFIG) + PROMPT_WORDS)
    return LMPolicy(tiny_llama(tokenizer, hidden=64, layers=2, heads=2).eval(), tokenizer,
                    SamplingConfig(temperature=1.0, max_new_tokens=8), name="tiny")


def test_pick_lowest_cost():
    assert pick_lowest_cost([30.0, 10.0, 10.0]) == 1  # ties go to the first
    assert pick_lowest_cost([None, 25600.0]) == 1  # an invalid reading never wins over a valid one


@pytest.mark.parametrize("make_env", [lambda: HouseholdEnv(CONFIG), ReplayOnly])
def test_branches_do_not_move_the_episode(make_env):
    env = make_env()
    episode = start_episode(env, env.tasks("train")[0], 0)
    action = env.admissible_actions()[0]
    seen = try_action(episode, action, Branches(make_env))
    assert isinstance(seen, str) and seen
    # The main environment is where it was: the same action now gives the same observation.
    assert env.step(action).observation == seen


def test_a_branch_environment_is_reused_and_replayed_from_the_start():
    made = []

    def make_env():
        made.append(ReplayOnly())
        return made[-1]

    env = make_env()
    episode = start_episode(env, env.tasks("train")[0], 0)
    branches = Branches(make_env)
    first, second = env.admissible_actions()[:2]
    alone = [try_action(episode, a, Branches(lambda: ReplayOnly())) for a in (first, second)]
    # the second candidate runs in the environment the first one moved, yet sees the episode's state, not the first's
    assert [try_action(episode, a, branches) for a in (first, second)] == alone
    episode.history.append((first, env.step(first).observation))
    after = try_action(episode, second, branches)
    assert len(made) == 2  # the episode's own environment and one branch environment for the task
    assert after == env.step(second).observation  # the branch replayed the episode's first action


def test_meter_guided_choice_is_the_lowest_predicted_cost(actor):
    meter = tiny_meter(seed=3)
    policy = GuidedPolicy(actor, meter, candidates=4)
    env = HouseholdEnv(CONFIG)
    episodes = [start_episode(HouseholdEnv(CONFIG), task, 0) for task in env.tasks("train")[:3]]
    torch.manual_seed(0)
    chosen = policy.act(episodes)
    torch.manual_seed(0)
    proposals = actor.act([e for e in episodes for _ in range(4)])
    for k, (episode, action) in enumerate(zip(episodes, chosen)):
        options = list(dict.fromkeys(a.text for a in proposals[4 * k : 4 * k + 4]))
        histories = [episode.messages + [{"role": "assistant", "content": t},
                                         {"role": "user", "content": try_action(episode, t, None)}] for t in options]
        costs = [state_cost(r, policy.failure_cost) for r in meter.score(histories)]
        assert action.text == options[pick_lowest_cost(costs)]


def test_guided_and_random_rollouts_run(actor):
    make_env = lambda: HouseholdEnv(CONFIG)  # noqa: E731
    tasks = make_env().tasks("valid_seen")[:2]
    for select, meter in (("meter", tiny_meter()), ("random", None)):
        trajectories = run_episodes(make_env, tasks, GuidedPolicy(actor, meter, select=select), max_turns=3)
        assert len(trajectories) == 2 and all(t.num_steps == 3 or t.success for t in trajectories)
    with pytest.raises(ValueError):
        GuidedPolicy(actor, None, select="meter")
    assert state_cost(MeterOutput(False), 7.0) == 7.0
