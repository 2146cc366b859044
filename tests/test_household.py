"""The built-in household environment: episodes, text, branching, splits, vocabulary, and the planner's optimality
(against breadth-first search on small houses, Bellman consistency on full-size ones)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltattg.envs.base import Branchable, Environment, HasExpert, StepResult, replay
from deltattg.envs.household import (
    SPLITS,
    TASK_TYPES,
    Goal,
    HouseholdConfig,
    HouseholdEnv,
    HouseholdSnapshot,
    State,
    World,
    admissible_commands,
    best_route,
    generate,
    is_held_out,
    is_won,
    optimal_remaining,
    plan,
    split_words,
    transition,
    vocabulary,
)
from deltattg.errors import InputError

DEFAULT = HouseholdConfig(n_train=60, n_valid_seen=12, n_valid_unseen=12, n_test=20)
SHORT = HouseholdConfig.short(n_train=30)
SMALL = HouseholdConfig(  # few receptacle types, so destinations and appliances often come in twos
    receptacles=(3, 5), targets=(1, 3), distractors=(0, 2), max_per_receptacle=3,
    receptacle_types=("cabinet", "countertop", "desk", "fridge", "microwave", "sinkbasin"),
)  # fmt: skip

seeds = st.integers(0, 10**6)
walks = st.lists(st.integers(0, 10**6), max_size=40)  # each entry picks one admissible command


def random_state(world: World, state: State, walk: list[int]) -> State:
    """The state a random walk of admissible commands reaches (stopping at the goal)."""
    for pick in walk:
        if is_won(world, state):
            break
        cmds = list(admissible_commands(world, state).values())
        state = transition(state, cmds[pick % len(cmds)])
    return state


def bfs_distance(world: World, state: State, limit: int = 40) -> int:
    """Shortest number of commands to the goal, by breadth-first search over states."""
    frontier, seen = [state], {state}
    for depth in range(limit + 1):
        if any(is_won(world, s) for s in frontier):
            return depth
        successors = (transition(s, c) for s in frontier for c in admissible_commands(world, s).values())
        frontier = [t for t in successors if not (t in seen or seen.add(t))]
    raise AssertionError("no plan within the limit")


def play(env: HouseholdEnv, actions: list[str]) -> list[StepResult]:
    return [env.step(a) for a in actions]


# A hand-built heat task: apple 1 and mug 1 in the closed cabinet 1; shortest plan 7 commands.
HEAT_GOAL = Goal("pick_heat_then_place_in_recep", "apple", "countertop")
HEAT = World(
    goal=HEAT_GOAL,
    goal_text=HEAT_GOAL.text(0),
    receptacles=("cabinet 1", "countertop 1", "desk 1", "fridge 1", "microwave 1"),
    objects=("apple 1", "mug 1"),
    lamp_at=2,
)
HEAT_START = State(at=-1, held=-1, where=(0, 0), flags=(0, 0), opened=0, lamp_on=False)


def heat_env() -> HouseholdEnv:
    env = HouseholdEnv()
    env.restore(HouseholdSnapshot(HEAT, HEAT_START, 0, False))
    return env


# ----------------------------------------------------------------------------------------------------------------------
# Episodes
# ----------------------------------------------------------------------------------------------------------------------


def test_satisfies_the_environment_protocols():
    env = HouseholdEnv(DEFAULT)
    assert isinstance(env, Environment) and isinstance(env, Branchable) and isinstance(env, HasExpert)
    assert env.max_steps == 50 and "admissible" in env.system_prompt


@pytest.mark.parametrize("config", [DEFAULT, SHORT], ids=["default", "short"])
def test_planner_wins_every_task_type_optimally(config):
    env = HouseholdEnv(config)
    by_type = {t.data["task_type"]: t for t in reversed(env.tasks("train"))}
    assert set(by_type) == set(TASK_TYPES)
    for task in by_type.values():
        observation = env.reset(task)
        assert observation.endswith(f"Your task is to: {task.data['goal']}")
        commands, start = env.plan(), env.optimal_remaining()
        assert env.expert_action() == commands[0]
        results = play(env, commands)
        assert len(commands) == start
        assert [r.info["optimal_remaining"] for r in results] == list(range(start - 1, -1, -1))
        assert [r.done for r in results] == [False] * (start - 1) + [True]
        assert results[-1].reward == 1.0 and results[-1].won and not results[-1].info["truncated"]
        assert all(r.reward == 0.0 for r in results[:-1]) and env.expert_action() is None


def test_failing_episode_is_truncated_at_max_steps_with_reward_zero():
    env = HouseholdEnv(DEFAULT)
    env.reset(env.tasks("train")[0])
    results = play(env, ["look"] * 50)
    assert [r.done for r in results] == [False] * 49 + [True]
    assert results[-1].reward == 0.0 and not results[-1].won and results[-1].info["truncated"]
    with pytest.raises(RuntimeError, match="over"):
        env.step("look")


def test_random_policy_cannot_win_when_every_plan_exceeds_the_budget():
    env = HouseholdEnv(HouseholdConfig.short(max_steps=4, plan_length=(5, 10), n_train=10))
    rng = random.Random(0)
    for task in env.tasks("train"):
        env.reset(task)
        results = [env.step(rng.choice(env.admissible_actions())) for _ in range(4)]
        assert results[-1].done and results[-1].info["truncated"] and sum(r.reward for r in results) == 0.0


def test_invalid_command_says_nothing_happens_and_costs_a_step():
    env = heat_env()
    before = env.snapshot()
    for action in ("fly to the moon", "go to cabinet 7", "take apple 1 from cabinet 1", "move apple 1 to desk 1"):
        result = env.step(action)
        assert result.observation == "Nothing happens." and result.reward == 0.0 and not result.info["valid"]
    assert env.state == before.state and env.snapshot().steps == 4
    env.step("go to cabinet 1")
    assert env.step("go to cabinet 1").observation == "Nothing happens."  # not admissible where one already is
    assert env.step("  OPEN   Cabinet 1 ").info["valid"]  # matched after lower-casing and collapsing spaces


def test_observations_read_like_alfworld():
    env = heat_env()
    script = {
        "go to cabinet 1": "You arrive at cabinet 1. The cabinet 1 is closed.",
        "open cabinet 1": "You open the cabinet 1. The cabinet 1 is open. In it, you see a apple 1, and a mug 1.",
        "take apple 1 from cabinet 1": "You pick up the apple 1 from the cabinet 1.",
        "examine apple 1": "There's nothing special about apple 1.",
        "go to desk 1": "You arrive at desk 1. On the desk 1, you see a desklamp 1.",
        "use desklamp 1": "You turn on the desklamp 1.",
        "look": "You are facing the desk 1. Next to it, you see nothing.",
        "go to microwave 1": "You arrive at microwave 1. The microwave 1 is closed.",
        "heat apple 1 with microwave 1": "You heat the apple 1 using the microwave 1.",
        "inventory": "You are carrying: a apple 1.",
        "go to countertop 1": "You arrive at countertop 1. On the countertop 1, you see nothing.",
        "move apple 1 to countertop 1": "You move the apple 1 to the countertop 1.",
    }
    results = play(env, list(script))
    assert [r.observation for r in results] == list(script.values())
    assert results[-1].won and HEAT.goal_text == "put a hot apple on countertop."


def test_admissible_commands_follow_the_state():
    env = heat_env()
    assert env.admissible_actions() == [f"go to {r}" for r in HEAT.receptacles] + ["inventory", "look"]
    play(env, ["go to cabinet 1", "open cabinet 1"])
    opened = {"close cabinet 1", "take apple 1 from cabinet 1", "take mug 1 from cabinet 1"}
    assert opened <= set(env.admissible_actions())
    play(env, ["take apple 1 from cabinet 1", "go to microwave 1"])
    actions = env.admissible_actions()
    assert "heat apple 1 with microwave 1" in actions and "move apple 1 to microwave 1" not in actions  # closed
    assert "go to microwave 1" not in actions and "examine apple 1" in actions


# ----------------------------------------------------------------------------------------------------------------------
# Harmful actions
# ----------------------------------------------------------------------------------------------------------------------


def test_harmful_actions_lengthen_the_optimal_plan():
    env = heat_env()
    assert env.optimal_remaining() == 7
    play(env, ["go to cabinet 1", "open cabinet 1"])
    assert env.plan_length_change("close cabinet 1") == 1
    assert env.plan_length_change("take mug 1 from cabinet 1") == 1  # a wrong object blocks the only hand
    assert env.plan_length_change("go to desk 1") == 1  # walking away from where the next step happens
    assert env.plan_length_change("take apple 1 from cabinet 1") == -1
    play(env, ["take apple 1 from cabinet 1"])
    assert env.is_harmful("move apple 1 to cabinet 1")  # putting it back
    play(env, ["go to microwave 1", "heat apple 1 with microwave 1", "go to fridge 1"])
    assert env.plan_length_change("cool apple 1 with fridge 1") == 2  # undoes the heating
    play(env, ["open fridge 1"])
    assert env.plan_length_change("move apple 1 to fridge 1") == 1  # the wrong receptacle
    for neutral in ("look", "inventory", "examine apple 1", "close fridge 1", "fly away"):
        assert env.plan_length_change(neutral) == 0 and not env.is_harmful(neutral)


def test_switching_the_lit_lamp_off_is_harmful():
    goal = Goal("look_at_obj_in_light", "book", None)
    world = World(goal, goal.text(0), receptacles=("desk 1",), objects=("book 1",), lamp_at=0)
    env = HouseholdEnv()
    env.restore(HouseholdSnapshot(world, State(0, -1, (0,), (0,), 0, True), 0, False))
    assert env.plan() == ["take book 1 from desk 1"] and env.is_harmful("use desklamp 1")
    assert env.step("take book 1 from desk 1").won


def test_full_size_tasks_offer_harmful_actions_along_the_optimal_path():
    env = HouseholdEnv(DEFAULT)
    states_with_harm = states = 0
    for task in env.tasks("train")[:24]:
        env.reset(task)
        assert not any(env.is_harmful(a) for a in env.admissible_actions())  # every first walk is needed anyway
        for action in env.plan()[:-1]:
            env.step(action)
            states += 1
            states_with_harm += any(env.is_harmful(a) for a in env.admissible_actions())
    assert states_with_harm >= 0.85 * states


# ----------------------------------------------------------------------------------------------------------------------
# Planner optimality
# ----------------------------------------------------------------------------------------------------------------------


def test_planner_drops_what_it_holds_where_the_target_is_and_cleans_it_at_the_nearest_sink():
    goal = Goal("pick_clean_then_place_in_recep", "mug", "countertop")
    world = World(goal, goal.text(1), ("countertop 1", "desk 1", "sinkbasin 1", "sinkbasin 2"), ("mug 1", "knife 1"), 1)
    holding_the_knife = State(at=1, held=1, where=(3, -1), flags=(0, 0), opened=0, lamp_on=False)
    assert plan(world, holding_the_knife) == [
        "go to sinkbasin 2", "move knife 1 to sinkbasin 2", "take mug 1 from sinkbasin 2",
        "clean mug 1 with sinkbasin 2", "go to countertop 1", "move mug 1 to countertop 1",
    ]  # fmt: skip


def test_planner_matches_breadth_first_search_on_small_houses():
    rng = random.Random(0)
    checked = 0
    for seed in range(100):
        world, start = generate(SMALL, seed)
        for _ in range(3):
            state = random_state(world, start, [rng.randrange(10**6) for _ in range(rng.randrange(25))])
            assert optimal_remaining(world, state) == bfs_distance(world, state), (world.goal, state)
            checked += 1
    assert checked == 300


@settings(max_examples=300, deadline=None)
@given(config=st.sampled_from([DEFAULT, SMALL]), seed=seeds, walk=walks)
def test_planner_is_bellman_consistent_and_its_plan_wins_from_any_reachable_state(config, seed, walk):
    world, start = generate(config, seed)
    state = random_state(world, start, walk)
    remaining = optimal_remaining(world, state)
    if is_won(world, state):
        assert remaining == 0
        return
    successors = [optimal_remaining(world, transition(state, c)) for c in admissible_commands(world, state).values()]
    assert remaining == 1 + min(successors)  # with d(goal) = 0 this makes d the true shortest distance
    for cmd in best_route(world, state):
        assert not is_won(world, state) and cmd in admissible_commands(world, state).values()
        state = transition(state, cmd)
    assert is_won(world, state)


# ----------------------------------------------------------------------------------------------------------------------
# Robustness, determinism, branching
# ----------------------------------------------------------------------------------------------------------------------

# An index into the admissible list, free text, or a command that is valid only somewhere.
actions = st.one_of(
    st.integers(0, 10**6), st.text(max_size=30), st.sampled_from(["look", "go to cabinet 1", "use desklamp 1"])
)


@settings(max_examples=150, deadline=None)
@given(seed=seeds, script=st.lists(actions, max_size=60))
def test_random_action_sequences_never_crash_and_keep_info_consistent(seed, script):
    env = HouseholdEnv(DEFAULT)
    env.reset(env.tasks("train")[seed % 60])
    for entry in script:
        admissible = env.admissible_actions()
        action = admissible[entry % len(admissible)] if isinstance(entry, int) else entry
        before = env.state
        result = env.step(action)
        assert result.info["valid"] == (" ".join(action.lower().split()) in admissible)
        assert result.info["valid"] or (env.state == before and result.observation == "Nothing happens.")
        assert result.info["admissible"] == env.admissible_actions() and 1 <= len(result.info["admissible"]) <= 45
        remaining = result.info["optimal_remaining"]
        assert remaining == optimal_remaining(env.world, env.state) and (remaining == 0) == result.won
        if result.done:
            break


def test_same_task_and_actions_give_the_same_episode():
    task = HouseholdEnv(DEFAULT).tasks("train")[5]
    rng = random.Random(1)
    first, second = HouseholdEnv(DEFAULT), HouseholdEnv(DEFAULT)
    transcripts = [[first.reset(task)], [second.reset(task)]]
    for _ in range(30):
        action = rng.choice(first.admissible_actions())
        transcripts[0].append(first.step(action))
        transcripts[1].append(second.step(action))
        if transcripts[0][-1].done:
            break
    assert transcripts[0] == transcripts[1] and len(transcripts[0]) > 10
    fresh_world, fresh_state = generate.__wrapped__(DEFAULT, 5)  # bypass the cache
    cached_world, cached_state = generate(DEFAULT, 5)
    assert fresh_state == cached_state
    assert (fresh_world.receptacles, fresh_world.objects, fresh_world.goal_text, fresh_world.lamp_at) == (
        cached_world.receptacles, cached_world.objects, cached_world.goal_text, cached_world.lamp_at
    )  # fmt: skip
    assert generate(DEFAULT, 6)[1] != cached_state


def test_snapshot_restore_and_replay_reproduce_the_next_observation():
    env = HouseholdEnv(DEFAULT)
    task = env.tasks("train")[7]
    env.reset(task)
    rng = random.Random(2)
    prefix = []
    for _ in range(6):
        prefix.append(rng.choice(env.admissible_actions()))
        env.step(prefix[-1])
    branch_point = env.snapshot()
    candidates = env.admissible_actions()
    outcomes = []
    for action in candidates:
        env.restore(branch_point)
        outcomes.append(env.step(action))
    env.restore(branch_point)
    assert env.step(candidates[0]) == outcomes[0]
    replayed, last = replay(lambda: HouseholdEnv(DEFAULT), task, [*prefix, candidates[-1]])
    assert last == outcomes[-1]
    env.restore(branch_point)
    env.step(candidates[-1])
    assert (replayed.state, replayed.snapshot().steps) == (env.state, env.snapshot().steps)


# ----------------------------------------------------------------------------------------------------------------------
# Splits, config, vocabulary
# ----------------------------------------------------------------------------------------------------------------------


def test_splits_are_fixed_disjoint_and_valid_unseen_holds_out_pairings():
    from deltattg.envs.household.generation import content_key

    env = HouseholdEnv(DEFAULT)
    tasks = {split: env.tasks(split) for split in SPLITS}
    assert [len(tasks[s]) for s in SPLITS] == [60, 12, 12, 20]
    assert tasks["train"] == HouseholdEnv(DEFAULT).tasks("train")
    seeds_of = [{t.data["seed"] for t in ts} for ts in tasks.values()]
    assert sum(map(len, seeds_of)) == len(set().union(*seeds_of)) == 104
    contents = {split: {content_key(*generate(DEFAULT, t.data["seed"], split == "valid_unseen")) for t in ts}
                for split, ts in tasks.items()}  # fmt: skip
    assert not contents["test"] & (contents["train"] | contents["valid_seen"])  # the report's split is new
    assert not (contents["valid_seen"] | contents["valid_unseen"]) & contents["train"]
    for split, ts in tasks.items():
        for task in ts:
            goal = generate(DEFAULT, task.data["seed"], split == "valid_unseen")[0].goal
            assert is_held_out(goal.object_type, goal.receptacle_type) == (split == "valid_unseen")
    with pytest.raises(InputError, match="split"):
        env.tasks("valid_train")


@pytest.mark.parametrize(
    "knobs",
    [{"receptacles": (5, 2)}, {"task_types": ("fly",)}, {"receptacle_types": ("cabinet", "fridge")}, {"max_steps": 0}],
)
def test_config_rejects_impossible_knobs(knobs):
    with pytest.raises(InputError):
        HouseholdConfig(**knobs)


def test_a_house_that_cannot_pose_its_goal_is_rejected():
    two_mugs = Goal("pick_two_obj_and_place", "mug", "shelf")
    with pytest.raises(InputError, match="cannot pose"):
        World(two_mugs, two_mugs.text(0), ("desk 1", "shelf 1"), ("mug 1", "book 1"), lamp_at=0)
    with pytest.raises(InputError, match="cannot pose"):
        World(two_mugs, two_mugs.text(0), ("desk 1", "shelf 1"), ("mug 1", "mug 2"), lamp_at=1)  # no lamp on a shelf


def test_knobs_shape_the_houses():
    config = HouseholdConfig(receptacles=(5, 5), targets=(2, 2), distractors=(3, 3), start_closed=False,
                             task_types=("pick_cool_then_place_in_recep",), plan_length=(6, 8), n_train=10)  # fmt: skip
    for seed in range(10):
        world, state = generate(config, seed)
        assert len(world.receptacles) == 5 and len(world.targets) == 2 and len(world.objects) == 5
        assert world.goal.task_type == "pick_cool_then_place_in_recep" and 6 <= optimal_remaining(world, state) <= 8
        assert all(state.opened >> r & 1 for r, openable in enumerate(world.openable) if openable)


@pytest.mark.parametrize("config", [DEFAULT, SHORT], ids=["default", "short"])
def test_vocabulary_covers_every_word_of_many_episodes(config):
    env = HouseholdEnv(config)
    words = set(env.vocabulary())
    rng = random.Random(3)
    texts = [env.system_prompt]
    for split in SPLITS:
        for task in env.tasks(split)[:12]:
            texts.append(env.reset(task))
            done = False
            while not done:
                admissible = env.admissible_actions()
                texts += admissible
                result = env.step(rng.choice([*admissible, *env.plan()[:1]]))
                texts.append(result.observation)
                done = result.done
    assert {w for text in texts for w in split_words(text)} <= words
    narrow = vocabulary(HouseholdConfig(object_types=("apple", "mug", "book")))
    assert "apple" in narrow and "tomato" not in narrow


def test_a_word_level_tokenizer_built_from_the_vocabulary_knows_every_word():
    pytest.importorskip("tokenizers")
    from conftest import make_tiny_tokenizer

    env = HouseholdEnv(SHORT)
    tokenizer = make_tiny_tokenizer(env.vocabulary())
    texts = [env.system_prompt, env.reset(env.tasks("valid_unseen")[0]), *env.admissible_actions()]
    texts += [env.step(action).observation for action in env.plan()]
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.unk_token_id not in ids and len(ids) == len(split_words(text))


# ---- the reference answer (IGPO / A²TGPO) ----------------------------------------------------------------------------
def test_reference_answer_is_the_planners_plan_from_the_start():
    env = HouseholdEnv(HouseholdConfig.short())
    task = env.tasks("train")[0]  # "put some remotecontrol on toilet."
    assert env.reference_answer(task) == ("go to dresser 1\ntake remotecontrol 2 from dresser 1\ngo to toilet 1\n"
                                          "move remotecontrol 2 to toilet 1")  # fmt: skip
    env.reset(task)
    assert env.reference_answer(task).split("\n") == env.plan() == plan(*generate(env.config, 0))
    env.step("go to toilet 1")  # asking mid-episode neither depends on nor changes the episode
    before = env.snapshot()
    assert env.reference_answer(task).split("\n")[0] == "go to dresser 1" and env.snapshot() is before
    other = HouseholdEnv(HouseholdConfig.short())
    for t in other.tasks("valid_unseen")[:3]:  # held-out pairings come from their own split's generator
        other.reset(t)
        answer = other.reference_answer(t).split("\n")
        assert answer == other.plan()
        for action in answer:
            result = other.step(action)
        assert result.won
