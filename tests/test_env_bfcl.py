"""BFCL v3 multi-turn: ground-truth replay passes BFCL's own checker, corrupted call sequences fail it, episodes are
isolated from each other, and decoding refuses what must not reach BFCL's ``eval``."""

from __future__ import annotations

import ast

import pytest

pytest.importorskip(
    "bfcl_eval", reason="BFCL tests need bfcl-eval (pip install --no-deps bfcl-eval && pip install mpmath)"
)

from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT  # noqa: E402
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils  # noqa: E402

from conftest import expert_episode, play_actions as play  # noqa: E402
from deltattg.envs.base import Environment, HasExpert, Task, replay  # noqa: E402
from deltattg.envs.bfcl import (  # noqa: E402
    CATEGORIES,
    END_OF_TURN,
    BFCLEnv,
    load_tasks,
    parse_calls,
    system_prompt,
    why_not_runnable,
)


def task(task_id: str) -> Task:
    return next(t for t in load_tasks(task_id.removeprefix("multi_turn_").rsplit("_", 1)[0]) if t.id == task_id)


def turn_by_turn(t: Task) -> list[list[str]]:
    """The ground truth as replies: every turn's calls in one list, then a closing reply."""
    return [["[" + ", ".join(calls) + "]", END_OF_TURN] if calls else [END_OF_TURN] for calls in t.data["ground_truth"]]


def our_globals() -> int:
    return sum(key.startswith("deltattg_") for key in vars(multi_turn_utils))


def test_categories_hold_200_entries_with_ground_truth_per_turn():
    for category in CATEGORIES:
        tasks = load_tasks(category)
        assert len(tasks) == 200
        assert len({t.id for t in tasks}) == 200
        assert all(t.split == category for t in tasks)
        assert all(len(t.data["ground_truth"]) == len(t.data["entry"]["question"]) for t in tasks)
    with pytest.raises(ValueError, match="base"):
        load_tasks("train")


def test_env_satisfies_the_protocols_and_lists_the_tasks_tools_in_its_system_prompt():
    env = BFCLEnv()
    assert isinstance(env, Environment) and isinstance(env, HasExpert)
    assert "[func_name1(params_name1=params_value1" in env.system_prompt
    t = task("multi_turn_base_0")  # GorillaFileSystem + TwitterAPI
    observation = env.reset(t)
    assert observation == t.data["entry"]["question"][0][0]["content"]
    assert '"name": "mkdir"' in env.system_prompt and '"name": "post_tweet"' in env.system_prompt
    assert '"name": "get_stock_info"' not in env.system_prompt
    assert env.admissible_actions() is None


@pytest.mark.slow
@pytest.mark.parametrize("category", CATEGORIES)
def test_ground_truth_replay_passes_the_checker_for_every_entry(category):
    env = BFCLEnv(max_steps=100)
    before = our_globals()
    for t in load_tasks(category):
        _, result = expert_episode(env, t)
        assert result.won and result.reward == 1.0, (t.id, result.info)
        assert result.info["check"]["valid"] is True
    assert our_globals() == before  # finished episodes release their backends


def test_ground_truth_in_one_reply_per_turn_also_passes():
    env = BFCLEnv()
    for task_id in ("multi_turn_base_0", "multi_turn_miss_param_5", "multi_turn_long_context_38"):
        t = task(task_id)
        env.reset(t)
        result = play(env, [reply for turn in turn_by_turn(t) for reply in turn])
        assert result.done and result.won, (task_id, result.info)


def test_steps_with_calls_report_results_and_stay_in_the_turn():
    env = BFCLEnv()
    env.reset(task("multi_turn_base_0"))
    result = env.step("[cd(folder='document'), mkdir(dir_name='temp')]")
    assert not result.done and result.reward == 0.0
    assert result.info["turn"] == 0
    assert result.info["calls"] == ["cd(folder='document')", "mkdir(dir_name='temp')"]
    assert '"current_working_directory": "document"' in result.info["results"][0]
    assert result.observation.splitlines()[0].startswith("cd(folder='document') -> ")
    listing = env.step("```\n[ls()]\n```")  # BFCL strips backticks
    assert "temp" in listing.observation
    ended = env.step("The folder is ready.")
    assert ended.info["turn"] == 1 and ended.info["calls"] == []
    assert ended.observation == task("multi_turn_base_0").data["entry"]["question"][1][0]["content"]


def reverse_calls(reply: str) -> str:
    return "[" + ", ".join(reversed([ast.unparse(call) for call in parse_calls(reply)])) + "]"


@pytest.mark.parametrize(
    ("task_id", "corrupt"),
    [
        (
            "multi_turn_base_0",
            lambda turns: [["[cd(folder='document'), mkdir(dir_name='tmp')]", END_OF_TURN], *turns[1:]],
        ),
        ("multi_turn_base_0", lambda turns: [[END_OF_TURN], *turns[1:]]),  # the first turn's calls never made
        ("multi_turn_base_1", lambda turns: [*turns[:-1], [END_OF_TURN]]),  # the last turn's calls never made
        ("multi_turn_base_1", lambda turns: [turns[0], [reverse_calls(turns[1][0]), END_OF_TURN], *turns[2:]]),
    ],
    ids=["wrong-argument", "skipped-first-turn", "skipped-last-turn", "calls-out-of-order"],
)
def test_corrupted_call_sequences_fail_the_checker(task_id, corrupt):
    env = BFCLEnv()
    t = task(task_id)
    env.reset(t)
    result = play(env, [reply for turn in corrupt(turn_by_turn(t)) for reply in turn])
    assert result.done and not result.won and result.reward == 0.0
    assert result.info["check"]["valid"] is False
    assert result.info["check"]["error_type"].startswith("multi_turn:")


def test_episodes_of_the_same_task_do_not_share_backend_state():
    t = task("multi_turn_base_0")
    before = our_globals()
    first, second = BFCLEnv(), BFCLEnv()
    first.reset(t)
    second.reset(t)
    first.step("[cd(folder='document'), mkdir(dir_name='only_in_first')]")
    second.step("[cd(folder='document')]")
    assert "only_in_first" not in second.step("[ls()]").observation
    first.reset(t)  # a new episode starts from the initial state again
    first.step("[cd(folder='document')]")
    assert "only_in_first" not in first.step("[ls()]").observation
    assert our_globals() > before
    first.close()
    del second  # freed envs release their instances too
    assert our_globals() == before


def test_unknown_functions_and_expressions_are_refused_without_running(tmp_path):
    tools = frozenset({"cd", "ls"})
    refused = {
        "open(file='/tmp/x', mode='w')": "open is not an available function",
        "os.system(command='ls')": "os.system is not an available function",
        "cd(folder=__import__('os').getcwd())": "is not a literal",
        "cd(folder='a' + 'b')": "is not a literal",
    }
    for source, reason in refused.items():
        [call] = parse_calls(source)
        assert reason in (why_not_runnable(call, tools) or "")
    for source in ("cd(folder='x')", "ls(a=True)", "cd('x')", "cd(folder=-1)"):
        [call] = parse_calls(source)
        assert why_not_runnable(call, tools) is None
    env = BFCLEnv()
    env.reset(task("multi_turn_base_0"))
    target = tmp_path / "created"
    result = env.step(f"[open(file={str(target)!r}, mode='w'), cd(folder='document')]")
    assert result.info["results"][0] == "Error during execution: open is not an available function"
    assert "document" in result.info["results"][1]
    assert not target.exists()


@pytest.mark.parametrize("reply", ["I moved the file.", "[]", "", "[1, 2]", "cd(folder='x'"])
def test_replies_without_calls_decode_to_nothing(reply):
    assert parse_calls(reply) == []


def test_a_turn_with_too_many_call_steps_is_force_quit():
    env = BFCLEnv()
    env.reset(task("multi_turn_base_0"))
    results = [env.step("[pwd()]") for _ in range(MAXIMUM_STEP_LIMIT + 1)]
    assert not any(r.done for r in results[:-1])
    assert results[-1].done and not results[-1].won and not results[-1].info["truncated"]
    with pytest.raises(RuntimeError, match="over"):
        env.step("[pwd()]")


def test_max_steps_truncates():
    env = BFCLEnv(max_steps=3)
    env.reset(task("multi_turn_base_0"))
    results = [env.step("[pwd()]") for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].info["truncated"] and results[-1].reward == 0.0


def test_miss_func_turn_announces_the_held_out_tools():
    t = task("multi_turn_miss_func_0")
    held_turn = int(next(iter(t.data["entry"]["missed_function"])))
    names = [doc["name"] for docs in t.data["entry"]["missed_function"].values() for doc in docs]
    assert all(f'"name": "{name}"' not in system_prompt(t.data["entry"]["function"]) for name in names)
    env = BFCLEnv()
    env.reset(t)
    replies = [reply for turn in turn_by_turn(t)[:held_turn] for reply in turn]
    observation = play(env, replies).observation
    assert "I have updated some more functions" in observation
    assert all(f"'name': '{name}'" in observation for name in names)


def test_replay_branches_to_the_same_observation():
    t = task("multi_turn_base_3")
    actions, _ = expert_episode(BFCLEnv(), t)
    branch, last = replay(BFCLEnv, t, actions[:3])
    main = BFCLEnv()
    main.reset(t)
    assert play(main, actions[:3]).observation == last.observation
    assert main.step(actions[3]).observation == branch.step(actions[3]).observation


def test_reference_answer_is_the_ground_truth_one_turn_per_line():
    from deltattg.envs.base import HasReferenceAnswer, reference_answer

    env, entry = BFCLEnv(), task("multi_turn_base_0")
    assert isinstance(env, HasReferenceAnswer)
    lines = reference_answer(env, entry).split("\n")
    assert lines[0] == ("[cd(folder='document'), mkdir(dir_name='temp'), "
                        "mv(source='final_report.pdf', destination='temp')]")  # fmt: skip
    assert lines == ["[" + ", ".join(calls) + "]" for calls in entry.data["ground_truth"] if calls]
    assert all(parse_calls(line) for line in lines)  # each line is a reply in the action format
