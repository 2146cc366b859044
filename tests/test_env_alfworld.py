"""ALFWorld (text) on the official game files from ../shared/data/alfworld: walkthroughs win, bad play does not, the
planner expert recovers from detours and replaying actions reproduces the branch."""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from deltattg.envs.alfworld import (
    DATA_ENV_VAR,
    SPLITS,
    SYSTEM_PROMPT,
    TASK_TYPES,
    ALFWorldEnv,
    data_root,
    find_tasks,
    goal_of,
    parse_action,
    split_dir,
    task_type_of,
)
from deltattg.envs import alfworld
from deltattg.envs.base import Environment, HasExpert, StepResult, Task, replay

INTRO = (
    "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see a "
    "desk 1.\n\nYour task is to: look at alarmclock under the desklamp."
)


@pytest.fixture(scope="session")
def make_env(alfworld_data: Path) -> Callable[..., ALFWorldEnv]:
    """``ALFWorldEnv`` on the extracted data; skips without the [alfworld] extra."""
    pytest.importorskip("alfworld", reason="ALFWorld tests need the [alfworld] extra (pip install alfworld)")
    return partial(ALFWorldEnv, alfworld_data)


@pytest.fixture(scope="module")
def env(make_env: Callable[..., ALFWorldEnv]) -> ALFWorldEnv:
    """One env shared by the module's tests (a game stays loaded between resets of its task)."""
    return make_env()


def first_of_type(tasks: list[Task], task_type: str) -> Task:
    return next(t for t in tasks if t.data["task_type"] == task_type)


def play(env: ALFWorldEnv, actions: list[str]) -> list[StepResult]:
    return [env.step(action) for action in actions]


def test_parse_action_takes_the_last_action_tag_or_the_whole_reply():
    assert parse_action("<think>go to bed 1?</think><action>Go to  desk 1</action>") == "go to desk 1"
    assert (
        parse_action("<action>look</action> then <action>take mug 1 from desk 1</action>") == "take mug 1 from desk 1"
    )
    assert parse_action("  Open Drawer 2\n") == "open drawer 2"
    assert "<action>" in SYSTEM_PROMPT and "</think>" in SYSTEM_PROMPT


def test_goal_and_task_type_come_from_the_game_text_and_folder():
    assert goal_of(INTRO) == "look at alarmclock under the desklamp."
    assert task_type_of("pick_two_obj_and_place-Newspaper-None-Drawer-224") == "pick_two_obj_and_place"
    with pytest.raises(ValueError):
        goal_of("You are in the middle of a room.")
    with pytest.raises(ValueError):
        task_type_of("pick_everything-Mug-None-Desk-1")


def test_data_root_needs_an_existing_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(DATA_ENV_VAR, raising=False)
    with pytest.raises(FileNotFoundError, match=DATA_ENV_VAR):
        data_root()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        data_root(tmp_path / "missing")
    monkeypatch.setenv(DATA_ENV_VAR, str(tmp_path))
    assert data_root() == tmp_path
    with pytest.raises(FileNotFoundError, match="valid_seen"):
        split_dir(tmp_path, "valid_seen")
    with pytest.raises(ValueError, match="unknown"):
        split_dir(tmp_path, "test")


def test_splits_list_every_game_with_its_task_type(alfworld_data: Path):
    seen, unseen = find_tasks(alfworld_data, "valid_seen"), find_tasks(alfworld_data, "valid_unseen")
    assert (len(seen), len(unseen)) == (140, 134)
    assert {t.data["task_type"] for t in seen} == set(TASK_TYPES)
    assert len({t.id for t in seen}) == 140 and all(t.split == "valid_seen" for t in seen)
    assert seen == find_tasks(alfworld_data / "json_2.1.1", "valid_seen")  # the layout folder itself works too
    assert "valid_train" in SPLITS


@pytest.mark.slow
@pytest.mark.parametrize(
    "task_type", ["look_at_obj_in_light", "pick_heat_then_place_in_recep", "pick_two_obj_and_place"]
)
def test_walkthrough_wins(env: ALFWorldEnv, task_type: str):
    task = first_of_type(list(env.tasks("valid_seen")), task_type)
    observation = env.reset(task)
    assert env.goal in observation and env.observation == observation
    assert observation.endswith("\n" + env.task_text(task))  # the task's text, read without loading the game
    walkthrough = env.walkthrough()
    results = []
    for command in walkthrough:
        assert command in env.admissible_actions()
        assert env.expert_action() == command  # on the walkthrough, the expert follows it
        results.append(env.step(f"<think>next</think><action>{command}</action>"))
    assert [r.done for r in results] == [False] * (len(walkthrough) - 1) + [True]
    assert results[-1].won and results[-1].reward == 1.0 and not results[-1].info["truncated"]
    assert all(r.info["valid"] and r.reward == 0.0 for r in results[:-1])
    with pytest.raises(RuntimeError, match="over"):
        env.step("look")


@pytest.mark.slow
def test_bad_actions_do_not_win_and_truncate_at_max_steps(make_env: Callable[..., ALFWorldEnv]):
    env = make_env(max_steps=4)
    task = first_of_type(list(env.tasks("valid_unseen")), "pick_cool_then_place_in_recep")
    env.reset(task)
    walkthrough = env.walkthrough()
    results = play(env, ["fly to the moon", "look", walkthrough[0], "inventory"])
    assert results[0].observation == "Nothing happens." and not results[0].info["valid"]
    assert all(r.info["valid"] for r in results[1:])
    assert [r.done for r in results] == [False, False, False, True]
    assert results[-1].info["truncated"] and not results[-1].won and results[-1].reward == 0.0


PLAN_WITHIN = alfworld.plan_within


@pytest.mark.slow
def test_expert_recovers_after_random_detours(make_env: Callable[..., ALFWorldEnv], monkeypatch):
    env = make_env()
    assert isinstance(env, Environment) and isinstance(env, HasExpert)
    task = first_of_type(list(env.tasks("valid_unseen")), "pick_and_place_simple")
    env.reset(task)
    rng = random.Random(0)
    detour = play(env, [rng.choice(env.admissible_actions()) for _ in range(2)])
    assert [r.info["action"] for r in detour] != env.walkthrough()[:2]  # off the walkthrough: the expert plans
    assert not any(r.done for r in detour)
    plans = []
    monkeypatch.setattr(alfworld, "plan_within", lambda game, seconds: plans.append(1) or PLAN_WITHIN(game, seconds))
    result = detour[-1]
    while not result.done:
        assert env.expert_action() == env.expert_action()  # asking twice (K candidates of one state) plans once
        result = env.step(env.expert_action())
    assert result.won and len(plans) == 1  # one plan after the detour, then followed to the end


@pytest.mark.slow
def test_a_plan_that_runs_out_of_time_leaves_the_game_as_it_was(make_env: Callable[..., ALFWorldEnv]):
    env = make_env(plan_seconds=1e-6)  # no plan can finish in a microsecond
    task = first_of_type(list(env.tasks("valid_seen")), "pick_and_place_simple")
    env.reset(task)
    detour = [a for a in env.admissible_actions() if a != env.walkthrough()[0]][0]
    env.step(detour)
    assert alfworld.plan_within(env._game, 1e-6) is None
    assert env.expert_action() is None and env.expert_action() is None  # no plan for this state, asked once
    in_time = alfworld.plan_within(env._game, 60.0)
    assert in_time and in_time == alfworld.plan_from_here(env._game)  # the forked planner's answer, and the game
    result = env.step(in_time[0])                                    # still plays from where it was
    for command in in_time[1:]:
        result = env.step(command)
    assert result.won


@pytest.mark.slow
def test_replay_reproduces_the_branch(env: ALFWorldEnv, make_env: Callable[..., ALFWorldEnv]):
    task = first_of_type(list(env.tasks("valid_seen")), "pick_and_place_simple")
    env.reset(task)
    walkthrough = env.walkthrough()
    main_last = play(env, walkthrough[:2])[-1]
    branch, branch_last = replay(make_env, task, walkthrough[:2])
    assert branch_last is not None and branch_last.observation == main_last.observation
    assert branch.admissible_actions() == env.admissible_actions()
    main_next, branch_next = env.step(walkthrough[2]), branch.step(walkthrough[2])
    assert (branch_next.observation, branch_next.info) == (main_next.observation, main_next.info)
