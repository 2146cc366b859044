"""Token-to-Go labels (Eq. 1–2), the E.6 alternatives, token counting and AgentProcessBench reading."""

from __future__ import annotations

import copy

import pytest

from deltattg.data.labels import action_units, prefix_labels, remaining_sums
from deltattg.data.sources import load_split, read_trajectories
from deltattg.data.tokens import count_step_tokens
from deltattg.data.trajectory import parse_trajectory
from conftest import needs_smollm2


def chat(actions, success=True):
    messages = [{"role": "system", "content": "act"}, {"role": "user", "content": "put the mug"}]
    for a in actions:
        messages += [{"role": "assistant", "content": a}, {"role": "user", "content": "ok"}]
    return {"id": "t", "group": "g", "reward": float(success), "success": success, "messages": messages}


def test_remaining_sums_is_eq1():
    # TTG_t = Σ_{u≥t} n_u: n = [3, 5, 2] -> [10, 7, 2] and 0 at the terminal prefix.
    assert remaining_sums([3, 5, 2]) == [10, 7, 2, 0]


def test_prefix_labels_successful_and_failed():
    traj = parse_trajectory(chat(["go to mug", "take mug"]))
    rows = list(prefix_labels(traj, [3, 5], terminal=True))
    assert [(r["step"], r["can_complete"], r["tokens_to_go"]) for r in rows] == [(0, True, 8), (1, True, 5), (2, True, 0)]
    # The prefix of step t ends right before assistant message t; the terminal prefix is the whole trajectory.
    assert [len(r["messages"]) for r in rows] == [2, 4, 6]
    failed = parse_trajectory(chat(["go to mug"], success=False))
    rows = list(prefix_labels(failed, [3], terminal=True))
    assert [(r["can_complete"], r["tokens_to_go"]) for r in rows] == [(False, None), (False, None)]


def test_step_and_score_targets():
    record = chat(["thinking", ""])
    record["messages"][4]["tool_calls"] = [{"function": {"name": "a", "arguments": "{}"}}] * 2
    traj = parse_trajectory(record)
    # E.6 units: message 0 = its text block (1); message 1 = no text + two tool calls (2). Remaining: [3, 2].
    assert [action_units(m) for m in (record["messages"][2], record["messages"][4])] == [1, 2]
    assert [r["steps_to_go"] for r in prefix_labels(traj, None, target="steps")] == [3, 2]
    assert [r["score"] for r in prefix_labels(traj, None, target="score", terminal=True)] == [1.0, 1.0, 1.0]


def test_token_counts_cover_the_assistant_turn_only(tiny_tokenizer):
    record = chat(["go to the mug", "take mug"])
    # ChatML renders an assistant turn as "go to the mug<|im_end|>\n": 4 words + the end-of-turn token.
    assert count_step_tokens(record["messages"], tiny_tokenizer) == [5, 3]
    changed = copy.deepcopy(record)
    changed["messages"][3]["content"] = "a much longer observation from the environment " * 5
    assert count_step_tokens(changed["messages"], tiny_tokenizer) == [5, 3]


def test_tool_calls_the_template_drops_are_still_counted(tiny_tokenizer):
    record = chat([""])
    plain = count_step_tokens(record["messages"], tiny_tokenizer)[0]
    record["messages"][2]["tool_calls"] = [{"type": "function", "function": {"name": "search", "arguments": '{"query": "mug"}'}}]
    with_call = count_step_tokens(record["messages"], tiny_tokenizer)[0]
    # The tiny ChatML template ignores tool_calls; their JSON {"name": "search", "arguments": {"query": "mug"}} counts.
    assert with_call > plain + 5


def test_agentprocessbench_records(hotpotqa_path, shared_dir):
    items, skipped = read_trajectories(hotpotqa_path)
    assert skipped == 0 and len(items) == 250
    assert sum(i.trajectory.success for i in items) == 163
    first = items[0].trajectory
    assert first.id == "0" and first.reward in (-1.0, 1.0) and first.group.startswith("searchR1_hotpotqa/")
    assert first.num_steps == 4 and "step_labels" in first.extra
    split = shared_dir / "data" / "agentprocessbench" / "split.json"
    assert len(load_split(split, "train")) == 187 and len(load_split(split, "test")) == 50


@pytest.mark.slow
def test_smollm2_counts_on_real_trajectories(hotpotqa_path):
    needs_smollm2()
    from deltattg.hf import load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    items, _ = read_trajectories(hotpotqa_path)
    trajectory = items[0].trajectory
    counts = count_step_tokens(trajectory.messages, tokenizer)
    assert len(counts) == trajectory.num_steps and all(n > 5 for n in counts)
    # Observation (tool) tokens never count: replacing every tool result leaves the counts unchanged.
    messages = [dict(m, content="x") if m["role"] == "tool" else m for m in trajectory.messages]
    assert count_step_tokens(messages, tokenizer) == counts
