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
    from deltattg.hf import common_prefix_length
    from deltattg.rollout.policies import PrefixCache

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
    assert common_prefix_length([1, 2, 3], [1, 2]) == 2 and common_prefix_length([], [1]) == 0


# ---- the random policy in tool environments (BFCL, τ²): tool calls, not "look" ---------------------------------------
def called_names(env_name: str, reply: str) -> list[str] | None:
    """The tools a reply calls in its environment's action format (None: a call-free reply)."""
    if env_name == "bfcl":
        from deltattg.envs.bfcl import parse_calls

        return [call.func.id for call in parse_calls(reply)] or None
    from deltattg.envs.tau2 import requested_user_calls, user_tools
    from deltattg.envs.tool_calls import parse_tool_calls

    return [name for name, _ in parse_tool_calls(reply) or requested_user_calls(reply, user_tools("telecom"))] or None


@pytest.mark.parametrize("env_name, split, package", [("bfcl", "base", "bfcl_eval"), ("bfcl", "miss_func", "bfcl_eval"),
                                                      ("tau2", "retail", "tau2"), ("tau2", "telecom", "tau2")])
def test_random_calls_the_tools_of_a_tool_environment(env_name, split, package):
    """No admissible list there: the random policy calls the task's tools with arguments drawn from their schemas (some
    run, some fail) and sometimes replies without a call (closes the turn, talks to the user); it never says "look"
    (which BFCL took as the end of every turn and τ² as a message to the user). Deterministic given its seed."""
    pytest.importorskip(package)
    from deltattg.envs.registry import env_factory

    make_tool_env = env_factory(env_name)
    tasks = list(make_tool_env().tasks(split))[:4]
    trajectories = run_episodes(make_tool_env, tasks, RandomPolicy(seed=0), max_turns=12, progress=False)
    again = run_episodes(make_tool_env, tasks, RandomPolicy(seed=0), max_turns=12, progress=False)
    assert [t.messages for t in trajectories] == [t.messages for t in again]
    probe = make_tool_env()
    for trajectory, task in zip(trajectories, tasks):
        probe.reset(task)
        tools = {tool["name"] for tool in probe.tool_schemas()}
        if split == "miss_func":  # the tools a later turn adds count once they are shown
            tools |= {doc["name"] for docs in task.data["entry"]["missed_function"].values() for doc in docs}
        replies = [m["content"] for m in trajectory.messages if m["role"] == "assistant"]
        calls = [called_names(env_name, reply) for reply in replies]
        assert "look" not in replies
        assert all(reply in probe.plain_replies() for reply, names in zip(replies, calls) if names is None)
        assert {name for names in calls if names for name in names} <= tools
    verified = [step.verified for t in trajectories for step in t.steps]
    assert True in verified and False in verified and None in verified


def test_arguments_follow_the_schema():
    import random

    from deltattg.rollout.random_calls import Seen, sample_arguments

    schema = {"type": "object", "required": ["order_id", "count", "kind", "items", "maybe"],
              "properties": {"order_id": {"type": "string"}, "count": {"type": "integer"},
                             "kind": {"enum": ["a", "b"]}, "items": {"type": "array", "items": {"$ref": "#/$defs/I"}},
                             "maybe": {"anyOf": [{"type": "null"}, {"type": "boolean"}]},
                             "extra": {"type": "number"}},
              "$defs": {"I": {"type": "object", "required": ["x"],
                              "properties": {"x": {"type": "number"}}}}}  # fmt: skip
    seen = Seen.of(["Your order #W123 has 3 items."])
    assert "#W123" in seen.words and 3 in seen.numbers
    drawn = [sample_arguments(schema, random.Random(k), seen) for k in range(50)]
    for args in drawn:
        assert {"order_id", "count", "kind", "items", "maybe"} <= set(args) <= set(schema["properties"])
        assert args["order_id"] in seen.words and isinstance(args["count"], int) and args["kind"] in ("a", "b")
        assert isinstance(args["maybe"], bool) and all(isinstance(item["x"], (int, float)) for item in args["items"])
    assert any("extra" in args for args in drawn) and any("extra" not in args for args in drawn)
    assert any(args["order_id"] == "#W123" for args in drawn)
