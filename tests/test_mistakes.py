"""Noisy experts on tool environments (BFCL, τ²): the three mistakes are what they say, each is a real deviation that
the environment notices, the expert resumes after one, and ε dials success down."""

from __future__ import annotations

import ast
import json
import random

import pytest
from hypothesis import given, strategies as st

from deltattg.envs.base import HasMistakes
from deltattg.envs.mistakes import MISTAKES, other_tool, perturbed_arguments, perturbed_value
from deltattg.rollout.engine import run_episodes
from deltattg.rollout.policies import NoisyExpertPolicy


@pytest.mark.parametrize(
    ("value", "wrong"),
    [("#W2378156", "#W2378157"), ("order_9", "order_0"), ("document", "documents"), (3, 4), (2.5, 3.5),
     (True, False), (["a", "b"], ["a"])],
)  # fmt: skip
def test_perturbed_value_is_a_near_miss(value, wrong):
    assert perturbed_value(value) == wrong


@pytest.mark.parametrize("value", [None, "", [], {"k": 1}])
def test_values_without_a_neighbour_are_left_alone(value):
    assert perturbed_value(value) == value
    assert perturbed_arguments({"x": value}, random.Random(0)) is None


@given(st.dictionaries(st.text(min_size=1, max_size=5), st.one_of(st.integers(), st.text(), st.booleans(), st.none()),
                       min_size=1), st.integers(0, 99))  # fmt: skip
def test_perturbed_arguments_change_exactly_one_value(arguments, seed):
    changed = perturbed_arguments(arguments, random.Random(seed))
    differing = [] if changed is None else [k for k in arguments if changed[k] != arguments[k]]
    assert changed is None or (changed.keys() == arguments.keys() and len(differing) == 1)
    assert (changed is None) == all(perturbed_value(v) == v for v in arguments.values())


def test_other_tool_never_returns_the_same_tool():
    rng = random.Random(0)
    assert {other_tool("cd", ["cd", "ls", "mkdir"], rng) for _ in range(50)} == {"ls", "mkdir"}
    assert other_tool("cd", ["cd"], rng) is None


def kinds_seen(env, task, n: int = 60) -> dict[str, str]:
    """Mistakes drawn at the task's first step, by what they are."""
    env.reset(task)
    expert = env.expert_action()
    rng = random.Random(0)
    return {mistake: reply for reply in (env.mistaken_action(rng) for _ in range(n))
            for mistake in [classify(expert, reply)]}  # fmt: skip


def classify(expert: str, reply: str) -> str:
    """Which mistake ``reply`` is, against the expert's ``expert``."""
    if "###STOP###" in reply or reply == "I have completed your request.":
        return "give_up"
    parse = (lambda text: ast.parse(text.strip("[]"), mode="eval").body) if expert.startswith("[") else json.loads
    a, b = parse(expert), parse(reply)
    same_name = ast.unparse(a.func) == ast.unparse(b.func) if expert.startswith("[") else a["name"] == b["name"]
    return "wrong_argument" if same_name else "wrong_tool"



def test_bfcl_mistakes_are_the_three_kinds_and_the_expert_resumes_after_them():
    pytest.importorskip("bfcl_eval")
    from deltattg.envs.bfcl import END_OF_TURN, BFCLEnv, load_tasks

    env, task = BFCLEnv(), load_tasks("base")[0]
    assert isinstance(env, HasMistakes)
    seen = kinds_seen(env, task)
    assert set(seen) == set(MISTAKES) and seen["give_up"] == END_OF_TURN
    assert seen["wrong_argument"] != env.expert_action()
    # a call to the wrong tool runs and fails; the gold call is still pending, and the expert finishes the task
    env.reset(task)
    gold = env.expert_action()
    failed = env.step(seen["wrong_tool"])
    assert failed.info["verified"] is False and env.expert_action() == gold
    while not (result := env.step(env.expert_action())).done:
        pass
    assert result.won
    # the first gold call is cd(folder='document'): a wrong folder fails and changes nothing
    env.reset(task)
    assert env.step(seen["wrong_argument"]).info["verified"] is False and env.expert_action() == gold
    # the second is mkdir(dir_name='temp'): a wrong name runs, the backend drifts from the ground truth, and the
    # checker fails the episode although the expert makes every gold call after it
    env.step(gold)
    wrong_dir = next(r for r in (env.mistaken_action(random.Random(i)) for i in range(50)) if r.startswith("[mkdir("))
    assert wrong_dir == "[mkdir(dir_name='temps')]" and env.step(wrong_dir).info["verified"] is True
    while not (result := env.step(env.expert_action())).done:
        pass
    assert not result.won and result.info["check"]["error_type"] == "multi_turn:instance_state_mismatch"


def test_tau2_mistakes_are_the_three_kinds_and_a_wrong_id_is_an_error():
    pytest.importorskip("tau2")
    from deltattg.envs.tau2 import Tau2Env, load_tasks

    env = Tau2Env()
    task = next(t for t in load_tasks("retail") if t.id == "retail/9")
    seen = kinds_seen(env, task)
    assert set(seen) == set(MISTAKES)
    env.reset(task)
    gold = env.expert_action()
    result = env.step(seen["wrong_argument"])
    assert result.info["kind"] == "tool" and result.info["verified"] is False  # no such user / order
    assert env.expert_action() == gold
    stopped = env.step(seen["give_up"])
    assert stopped.done and not stopped.won


@pytest.mark.parametrize("env_name", ["bfcl", "tau2"])
def test_noise_dials_the_noisy_experts_success_down(env_name):
    pytest.importorskip({"bfcl": "bfcl_eval", "tau2": "tau2"}[env_name])
    from deltattg.envs.registry import env_factory

    make_env = env_factory(env_name)
    tasks = make_env().tasks({"bfcl": "base", "tau2": "retail/train"}[env_name])[:12]
    won = {eps: {t.group for t in run_episodes(make_env, tasks, NoisyExpertPolicy(eps, seed=0), max_turns=40)
                 if t.success} for eps in (0.0, 1.0)}  # fmt: skip
    assert len(won[0.0]) == 12
    # at ε = 1 nothing the task needs gets done; retail/10 passes anyway: its right outcome is an unchanged database
    # (the refund the user asks for is not allowed), and failed calls change nothing
    assert won[1.0] <= {"retail/10"}
