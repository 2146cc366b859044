"""The meter prompt: serialization, the token budget (task always kept, oldest turns dropped first) and the cache key."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

from deltattg.data.tokens import tool_call_text
from deltattg.meter.prompt import (
    HISTORY_END,
    INSTRUCTION,
    compose,
    count_prompt_tokens,
    meter_messages,
    prefix_hash,
    serialize_message,
    split_task,
)
from conftest import needs_smollm2

TASK = [
    {"role": "system", "content": "You answer questions with a search tool."},
    {"role": "user", "content": "TASKSTART Which city hosts the oldest university of Australia? TASKEND"},
]
N_TURNS = 8


@pytest.fixture
def tokenizer(tiny_tokenizer):
    """conftest's offline word-level tokenizer with its ChatML template."""
    return tiny_tokenizer


def turn(i: int) -> list[dict]:
    """Turn i: an assistant action with a tool call (marked ``ACTION{i}``) and the tool's result, of growing size."""
    call = {"id": f"c{i}", "type": "function", "function": {"name": "search", "arguments": json.dumps({"q": f"q{i}"})}}
    return [
        {"role": "assistant", "content": f"ACTION{i} " + "thinking " * (i + 1), "tool_calls": [call]},
        {"role": "tool", "name": "search", "content": f"RESULT{i} " + "evidence " * (3 * i)},
    ]


HISTORY = TASK + [m for i in range(N_TURNS) for m in turn(i)]


def kept_turns(messages: list[dict]) -> list[int]:
    text = messages[0]["content"]
    return [i for i in range(N_TURNS) if f"ACTION{i} " in text]


def test_serialize_message_shows_role_content_tool_calls_and_tool_name():
    action, result = turn(3)
    text = serialize_message(action)
    assert text.splitlines()[0] == "### assistant"
    assert "ACTION3 thinking" in text
    assert tool_call_text(action["tool_calls"][0]) in text
    assert '"arguments": {"q": "q3"}' in text  # arguments decoded, not a JSON string inside JSON
    assert serialize_message(result).splitlines()[0] == "### tool (search)"
    parts = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    assert serialize_message(parts) == "### user\nab"
    assert "(reasoning) because" in serialize_message({"role": "assistant", "content": "x", "reasoning_content": "because"})


def test_split_task_keeps_everything_up_to_the_first_user_message_and_cuts_turns_at_actions():
    task, turns = split_task(HISTORY)
    assert task == TASK
    assert turns == [turn(i) for i in range(N_TURNS)]
    follow_up = {"role": "user", "content": "and then?"}
    assert split_task(TASK + [follow_up] + turn(0)) == (TASK, [[follow_up], turn(0)])
    assert split_task([TASK[0]] + turn(0)) == ([TASK[0]], [turn(0)])  # no user message: the system prompt is the task


def test_without_a_budget_the_whole_history_is_one_user_message(tokenizer):
    messages = meter_messages(HISTORY)
    assert messages == meter_messages(HISTORY, tokenizer, None)
    assert [m["role"] for m in messages] == ["user"]
    text = messages[0]["content"]
    assert text.startswith(INSTRUCTION) and text.endswith(HISTORY_END)
    assert kept_turns(messages) == list(range(N_TURNS)) and "omitted" not in text
    positions = [text.index(serialize_message(m)) for m in HISTORY]
    assert positions == sorted(positions)  # in history order


def test_the_turns_left_close_the_task_and_every_turn_so_each_prompt_prefixes_the_next(tokenizer):
    """With a 10-turn limit the task ends ``(turns left: 10)`` and turn k ``(turns left: 9 − k)``; the prompt of
    h_t is the prompt of h_{t+1} up to the end of h_t's history (only the end delimiter is its own)."""
    prompts = [meter_messages(HISTORY[: 2 + 2 * t], tokenizer, None, 10)[0]["content"] for t in range(4)]
    assert prompts[0].endswith(f"TASKEND\n\n(turns left: 10)\n{HISTORY_END}")
    assert [p.rsplit("(turns left: ", 1)[1].split(")")[0] for p in prompts] == ["10", "9", "8", "7"]
    for shorter, longer in zip(prompts, prompts[1:]):
        assert longer.startswith(shorter[: -len(HISTORY_END)])
    assert "turns left" not in meter_messages(HISTORY, tokenizer, None)[0]["content"]


def test_budget_keeps_the_task_and_the_newest_turns_that_fit(tokenizer):
    full = count_prompt_tokens(meter_messages(HISTORY), tokenizer)
    task_blocks = [serialize_message(m) for m in TASK]
    turn_blocks = ["\n\n".join(map(serialize_message, turn(i))) for i in range(N_TURNS)]
    smallest = count_prompt_tokens(compose(task_blocks, [], N_TURNS), tokenizer)
    seen = set()
    for budget in range(smallest, full + 2):
        messages = meter_messages(HISTORY, tokenizer, budget)
        assert count_prompt_tokens(messages, tokenizer) <= budget
        text = messages[0]["content"]
        assert all(block in text for block in task_blocks)
        kept = kept_turns(messages)
        dropped = N_TURNS - len(kept)
        assert kept == list(range(dropped, N_TURNS))  # a suffix: the oldest turns go first
        if dropped:
            assert f"[... {dropped} earlier turn{'s' if dropped > 1 else ''} omitted ...]" in text
            one_more = compose(task_blocks, turn_blocks[dropped - 1 :], dropped - 1)
            assert count_prompt_tokens(one_more, tokenizer) > budget  # no more was dropped than needed
        seen.add(dropped)
    assert seen == set(range(N_TURNS + 1))


def test_a_task_longer_than_the_budget_is_cut_in_the_middle(tokenizer):
    long_task = [TASK[0], {"role": "user", "content": "TASKSTART " + "detail " * 2000 + "TASKEND"}]
    messages = meter_messages(long_task + turn(0) + turn(1), tokenizer, 300)
    text = messages[0]["content"]
    assert count_prompt_tokens(messages, tokenizer) <= 300
    assert "TASKSTART" in text and "TASKEND" in text and "characters omitted" in text
    assert TASK[0]["content"] in text  # the short system message is not cut
    assert "[... 2 earlier turns omitted ...]" in text and kept_turns(messages) == []


def test_a_budget_below_the_instruction_or_without_a_tokenizer_is_an_error(tokenizer):
    with pytest.raises(ValueError, match="cannot hold"):
        meter_messages(HISTORY, tokenizer, 20)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        meter_messages(HISTORY, None, 10_000)


def test_a_tokenizer_without_chat_template_counts_plain_text(tokenizer):
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    budget = count_prompt_tokens(meter_messages(HISTORY), plain) * 3 // 4
    messages = meter_messages(HISTORY, plain, budget)
    assert count_prompt_tokens(messages, plain) == len(plain(messages[0]["content"])["input_ids"]) <= budget
    assert 0 < len(kept_turns(messages)) < N_TURNS


def test_prefix_hash_is_sha256_of_canonical_json():
    history = [{"role": "user", "content": "héllo"}]
    canonical = b'[{"content":"h\\u00e9llo","role":"user"}]'
    assert prefix_hash(history) == hashlib.sha256(canonical).hexdigest()
    assert prefix_hash([{"content": "héllo", "role": "user"}]) == prefix_hash(history)  # key order is irrelevant
    assert prefix_hash(HISTORY) != prefix_hash(HISTORY[:-1])
    assert prefix_hash([{"role": "user", "content": "\ud800"}])  # a lone surrogate still hashes


@pytest.mark.slow
def test_budget_holds_with_the_real_smollm2_chat_template():
    needs_smollm2()
    from deltattg.hf import load_tokenizer

    smol = load_tokenizer("smollm2")
    full = count_prompt_tokens(meter_messages(HISTORY), smol)
    for budget in (full // 2, full - 1):
        messages = meter_messages(HISTORY, smol, budget)
        ids = smol.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
        assert len(ids) == count_prompt_tokens(messages, smol) <= budget
        assert 0 < len(kept_turns(messages)) < N_TURNS
