"""The rollout engine on the built-in household environment: LM, noisy-expert and random policies."""

from __future__ import annotations

import json

import pytest
import torch

from deltattg.data.trajectory import parse_trajectory
from deltattg.envs.household import HouseholdConfig, HouseholdEnv, vocabulary
from deltattg.rollout.engine import run_episodes
from deltattg.rollout.policies import LMPolicy, NoisyExpertPolicy, RandomPolicy, SamplingConfig
from deltattg.tiny import tiny_llama, word_tokenizer

CONFIG = HouseholdConfig.short()


def make_env() -> HouseholdEnv:
    return HouseholdEnv(CONFIG)


@pytest.fixture(scope="module")
def lm_policy():
    tokenizer = word_tokenizer(vocabulary(CONFIG) + ["You", "have", "taken", "step", "s", "The", "most", "recent",
                                                      "Current", "observation", "Admissible", "actions"])
    model = tiny_llama(tokenizer, hidden=64, layers=2, heads=2).eval()
    return LMPolicy(model, tokenizer, SamplingConfig(temperature=1.0, max_new_tokens=8), name="tiny")


def test_lm_rollouts_record_what_the_loss_needs(lm_policy):
    torch.manual_seed(0)
    tasks = make_env().tasks("train")[:3]
    trajectories = run_episodes(make_env, tasks, lm_policy, group_size=2, max_turns=4)
    assert [t.group for t in trajectories] == [task.id for task in tasks for _ in range(2)]
    for traj in trajectories:
        assert 1 <= traj.num_steps <= 4 and traj.policy == "tiny"
        assert traj.step_tokens == [len(step.token_ids) for step in traj.steps]
        roles = [m["role"] for m in traj.messages]
        assert roles[:2] == ["system", "user"] and roles[2::2] == ["assistant"] * traj.num_steps
        # The record survives JSONL validation unchanged.
        assert parse_trajectory(json.loads(json.dumps(traj.to_json()))).to_json() == traj.to_json()
        for step in traj.steps:
            # Log-probs recorded while sampling equal a fresh forward pass over prompt + response.
            ids = torch.tensor([step.prompt_ids + step.token_ids])
            with torch.no_grad():
                logits = lm_policy.model(ids).logits[0, len(step.prompt_ids) - 1 : -1]
            fresh = torch.log_softmax(logits, -1).gather(-1, torch.tensor(step.token_ids)[:, None])[:, 0]
            assert fresh.tolist() == pytest.approx(step.logprobs, abs=1e-4)


@pytest.mark.parametrize("temperature, top_p", [(0.0, 1.0), (0.7, 0.8), (1.3, 1.0)])
@pytest.mark.parametrize("share_prompts", [True, False])
def test_logprobs_taken_while_sampling_equal_a_teacher_forced_pass(lm_policy, temperature, top_p, share_prompts):
    """Whatever is sampled: log softmax(logits / T) of a fresh forward pass at each token (T = 1 greedy), not the
    top-p-truncated distribution — over left padding, repeated prompts and rows that end early."""
    sampling = SamplingConfig(temperature, top_p, max_new_tokens=10, share_prompts=share_prompts)
    policy = LMPolicy(lm_policy.model, lm_policy.tokenizer, sampling)
    policy.eos_ids = list(range(len(policy.tokenizer)))[-12:]  # common enough that rows stop at different lengths
    prompts = [[7, 8, 9, 10, 11], [12, 13], [7, 8, 9, 10, 11], [14, 15, 16], [12, 13]]
    for seed in range(3):
        torch.manual_seed(seed)
        for action, prompt in zip(policy.generate(prompts), prompts):
            ids = torch.tensor([prompt + action.token_ids])
            with torch.no_grad():
                logits = policy.model(ids).logits[0, len(prompt) - 1 : -1] / (temperature or 1.0)
            fresh = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None])[:, 0]
            assert fresh.tolist() == pytest.approx(action.logprobs, abs=1e-5)


def test_greedy_lm_rollouts_are_deterministic(lm_policy):
    greedy = LMPolicy(lm_policy.model, lm_policy.tokenizer, SamplingConfig(temperature=0.0, max_new_tokens=6))
    tasks = make_env().tasks("valid_seen")[:2]
    a = run_episodes(make_env, tasks, greedy, max_turns=3)
    b = run_episodes(make_env, tasks, greedy, max_turns=3)
    assert [t.messages for t in a] == [t.messages for t in b]


def test_expert_wins_and_random_mostly_fails():
    tasks = make_env().tasks("valid_seen")[:20]
    experts = run_episodes(make_env, tasks, NoisyExpertPolicy(0.0))
    assert all(t.success and t.reward == 1.0 for t in experts)
    assert all(t.step_tokens is None and t.num_steps <= CONFIG.max_steps for t in experts)
    randoms = run_episodes(make_env, tasks, RandomPolicy(seed=0))
    assert sum(t.success for t in randoms) < sum(t.success for t in experts)
    noisy = run_episodes(make_env, tasks, NoisyExpertPolicy(0.5, seed=1))
    # Noise costs steps: the noisy expert needs at least as many steps on every task it still solves.
    for clean, dirty in zip(experts, noisy):
        if dirty.success:
            assert dirty.num_steps >= clean.num_steps
    assert sum(d.num_steps for d in noisy) > sum(c.num_steps for c in experts)


class CountingExpertEnv(HouseholdEnv):
    """The household environment counting how often its expert is asked (a planner call on ALFWorld)."""

    asked = 0

    def expert_action(self):
        CountingExpertEnv.asked += 1
        return super().expert_action()


def test_the_noisy_expert_asks_its_expert_only_when_it_follows_it():
    tasks = make_env().tasks("valid_seen")[:10]
    for epsilon in (1.0, 0.5):
        CountingExpertEnv.asked = 0
        played = run_episodes(lambda: CountingExpertEnv(CONFIG), tasks, NoisyExpertPolicy(epsilon, seed=3), max_turns=8)
        steps = sum(t.num_steps for t in played)
        assert CountingExpertEnv.asked == 0 if epsilon == 1.0 else 0 < CountingExpertEnv.asked < steps


def prefilled_tokens(model) -> list[int]:
    """A list that records how many input positions each forward pass of ``model`` reads."""
    seen: list[int] = []
    model.model.embed_tokens.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[1]))
    return seen


def test_prefix_cache_plays_the_same_greedy_episodes_and_prefills_only_what_is_new(lm_policy):
    """Greedy rollouts with ``prefix_cache`` equal those without it, their log-probs still match a fresh forward pass,
    and a later turn is prefilled only past the prefix it shares with the cached conversation."""
    tokenizer = lm_policy.tokenizer
    model = tiny_llama(tokenizer, hidden=64, layers=2, heads=2, seed=1).eval()
    tasks = make_env().tasks("valid_seen")[:3]
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=6)
    plain = run_episodes(make_env, tasks, LMPolicy(model, tokenizer, sampling), max_turns=3)
    cached_policy = LMPolicy(model, tokenizer, SamplingConfig(temperature=0.0, max_new_tokens=6, prefix_cache=4))
    reads = prefilled_tokens(model)
    cached = run_episodes(make_env, tasks, cached_policy, max_turns=3)
    assert [t.messages for t in cached] == [t.messages for t in plain]
    for traj in cached:
        for step in traj.steps:
            ids = torch.tensor([step.prompt_ids + step.token_ids])
            with torch.no_grad():
                logits = model(ids).logits[0, len(step.prompt_ids) - 1 : -1]
            fresh = torch.log_softmax(logits, -1).gather(-1, torch.tensor(step.token_ids)[:, None])[:, 0]
            assert fresh.tolist() == pytest.approx(step.logprobs, abs=1e-4)
    # a prompt extending a cached conversation: only what follows the cached tokens is prefilled
    policy = LMPolicy(model, tokenizer, SamplingConfig(temperature=0.0, max_new_tokens=5, prefix_cache=2))
    policy.eos_ids = [-1]  # never stop early: the reply has all 5 tokens
    first = policy.generate([list(range(7, 30))])[0]
    follow_up = list(range(7, 30)) + first.token_ids + [31, 32, 33]
    reads.clear()
    again = policy.generate([follow_up])[0]
    assert reads[0] == len(follow_up) - (23 + 5 - 1)  # the cache held the prompt and all but the last reply token
    plain_policy = LMPolicy(model, tokenizer, SamplingConfig(temperature=0.0, max_new_tokens=5))
    plain_policy.eos_ids = [-1]
    assert again.token_ids == plain_policy.generate([follow_up])[0].token_ids


def test_prefix_cache_finds_the_longest_shared_prefix_and_keeps_the_most_recent():
    from deltattg.rollout.policies import PrefixCache, common_prefix

    class Cache:  # the two calls PrefixCache makes of a transformers cache
        def __init__(self, n):
            self.n = n

        def get_seq_length(self):
            return self.n

        def crop(self, delta):
            assert delta <= 0
            self.n += delta

    cache = PrefixCache(size=2)
    cache.store([1, 2, 3, 4], Cache(4))
    cache.store([1, 2, 9], Cache(3))
    found, length = cache.lookup([1, 2, 3, 4, 5, 6])
    assert length == 4 and found.n == 4
    found, length = cache.lookup([1, 2, 3])  # the prompt's last token is always left for generate to read
    assert length == 2 and found.n == 2
    assert cache.lookup([7, 8]) == (None, 0)
    cache.store([5, 6], Cache(2))  # [1, 2, 9] was used least recently: dropped
    assert list(cache.entries) == [(1, 2, 3, 4), (5, 6)]
    assert common_prefix([1, 2, 3], [1, 2]) == 2 and common_prefix([], [1]) == 0
