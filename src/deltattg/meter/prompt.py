"""The progress meter's prompt: a fixed instruction plus the serialized decision prefix h (§3.1).

The meter sees ONE user message: :data:`INSTRUCTION` (with the answer format, :mod:`deltattg.meter.answer`), then the
history between fixed delimiters, ending the message; where episodes have a turn limit, the task and every turn end
with the turns left after them. So a decision state's prompt is a prefix of the next state's up to the end of its
history, and only the end delimiter and the chat template's end of turn are its own (version 1 closed with the turns
left and a reminder of the format: 37 tokens per state on SmolLM2 instead of 10). One user message, rather than a
system + user pair, goes through every chat template (some reject a system role) and keeps the instruction at the
start, shared by all prompts, where prefix caching (vLLM, SGLang) can reuse it.

Fitting a token budget (``max_prompt_tokens``, counted on the prompt as the chat template renders it with the
generation prompt): the *task* — every message up to and including the first user message — is always kept; later
messages are grouped into *turns* (an assistant action and the observations after it) and the oldest turns are dropped
first, leaving a marker that says how many were omitted. Only if the task alone does not fit are the longest task
messages cut in the middle (the ends are kept, the cut is marked); an instruction that alone exceeds the budget is a
configuration error (``ValueError``).

Everything is deterministic: the same history, tokenizer and budget always give the same prompt. Change
:data:`PROMPT_VERSION` whenever the text a meter sees changes, so that cached scores (keyed by meter id) go stale.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from deltattg.data.tokens import text_of, tool_call_text

PROMPT_VERSION = 2

INSTRUCTION = (
    "You are a progress meter for an AI agent. Below is the agent's task and its interaction history so far: the "
    "agent's actions and what the environment or tools returned (where episodes have a turn limit, also the turns the "
    "agent has left). Predict whether the agent will go on to complete the task from the state at the end of the "
    "history and, if it will, how many more tokens the agent will generate before it completes it (its Token-to-Go).\n"
    'Answer with one JSON object and nothing else: {"can_complete": true, "tokens_to_go": N} with N a non-negative '
    'integer if the task will be completed, or {"can_complete": false, "tokens_to_go": null} if it will not.'
)
HISTORY_START = "=== history ==="
HISTORY_END = "=== end ==="


def serialize_message(message: dict) -> str:
    """One chat message as text: a role header, then reasoning, content and tool calls (canonical JSON)."""
    role = str(message.get("role", "unknown"))
    name = message.get("name")
    lines = [f"### {role} ({name})" if role == "tool" and name else f"### {role}"]
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        lines.append(f"(reasoning) {reasoning}")
    content = text_of(message.get("content"))
    if content:
        lines.append(content)
    lines.extend(f"(tool call) {tool_call_text(call)}" for call in message.get("tool_calls") or [])
    return "\n".join(lines)


def split_task(history: Sequence[dict]) -> tuple[list[dict], list[list[dict]]]:
    """``(task, turns)``: the messages up to and including the first user message (all leading system messages when
    there is no user message), and the rest grouped into turns that each start at an assistant message."""
    roles = [m.get("role") for m in history]
    if "user" in roles:
        task_end = roles.index("user") + 1
    else:
        task_end = next((i for i, role in enumerate(roles) if role != "system"), len(roles))
    turns: list[list[dict]] = []
    for message in history[task_end:]:
        if not turns or message.get("role") == "assistant":
            turns.append([])
        turns[-1].append(message)
    return list(history[:task_end]), turns


def shorten(text: str, max_chars: int) -> str:
    """``text`` with its middle replaced by a marker when it is longer than ``max_chars`` (both ends are kept)."""
    if len(text) <= max_chars:
        return text
    head = max_chars - max_chars // 2
    tail = text[len(text) - max_chars // 2 :]
    return f"{text[:head]}\n[... {len(text) - max_chars} characters omitted ...]\n{tail}"


def turns_left_note(turns_left: int) -> str:
    """How a meter is told the turns the agent has left at a decision state (where episodes have a turn limit): the
    one text both meters use, so a time-out is predictable from the input (the generative meter's prompt, the
    regression meter's boundary marker)."""
    return f"turns left: {max(turns_left, 0)}"


def compose(task_blocks: Sequence[str], turn_blocks: Sequence[str], omitted: int) -> list[dict]:
    """The meter's chat messages for the given serialized task and kept turns, after ``omitted`` dropped turns. The
    history comes last, so that a state's prompt is a prefix of the next state's up to the end of its history (what
    the shared-prefix reader and a server's prefix cache reuse)."""
    marker = [f"[... {omitted} earlier turn{'s' if omitted != 1 else ''} omitted ...]"] if omitted else []
    history = "\n\n".join([*task_blocks, *marker, *turn_blocks])
    return [{"role": "user", "content": f"{INSTRUCTION}\n\n{HISTORY_START}\n{history}\n{HISTORY_END}"}]


def render_prompt(messages: list[dict], tokenizer: Any) -> str:
    """The prompt text the meter model reads: its chat template with the generation prompt, or plain text when the
    tokenizer has no template."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n\n".join(text_of(m.get("content")) for m in messages) + "\n\n"


def count_prompt_tokens(messages: list[dict], tokenizer: Any) -> int:
    """Length in tokens of :func:`render_prompt` (the template already holds any special tokens it wants)."""
    return len(tokenizer(render_prompt(messages, tokenizer), add_special_tokens=False)["input_ids"])


def meter_messages(history: Sequence[dict], tokenizer: Any = None, max_prompt_tokens: int | None = None,
                   turn_limit: int | None = None) -> list[dict]:
    """The meter's chat messages for the decision prefix ``history``, fitted to ``max_prompt_tokens`` as counted by
    ``tokenizer`` (see module doc for what is kept); with ``turn_limit``, the task and every turn end with the turns
    left after them (``(turns left: 7)``), so the history's last line states them at this state."""
    task, turns = split_task(history)
    task_blocks = [serialize_message(m) for m in task]
    turn_blocks = ["\n\n".join(serialize_message(m) for m in turn) for turn in turns]
    if turn_limit is not None:
        task_blocks.append(f"({turns_left_note(turn_limit)})")
        taken = 0
        for k, turn in enumerate(turns):
            taken += sum(m.get("role") == "assistant" for m in turn)
            turn_blocks[k] += f"\n\n({turns_left_note(turn_limit - taken)})"
    if max_prompt_tokens is None:
        return compose(task_blocks, turn_blocks, 0)
    if tokenizer is None:
        raise ValueError("max_prompt_tokens needs a tokenizer to count with")
    n, longest = len(turn_blocks), max(map(len, task_blocks), default=0)

    def fits(messages: list[dict]) -> bool:
        return count_prompt_tokens(messages, tokenizer) <= max_prompt_tokens

    def dropping(k: int) -> list[dict]:  # the oldest k turns omitted
        return compose(task_blocks, turn_blocks[k:], k)

    def cutting(c: int) -> list[dict]:  # every turn omitted, and task messages cut to longest − c characters
        return compose([shorten(block, longest - c) for block in task_blocks], [], n)

    omitted = _least(lambda k: fits(dropping(k)), 0, n)
    if omitted is not None:
        return dropping(omitted)
    cut = _least(lambda c: fits(cutting(c)), 0, longest)
    if cut is None:
        raise ValueError(f"max_prompt_tokens={max_prompt_tokens} cannot hold even the meter instruction")
    return cutting(cut)


def _least(ok: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """The least ``k`` in ``[lo, hi]`` with ``ok(k)`` (exact when ``ok`` is monotone), or ``None`` when ``ok(hi)`` is
    false. A returned ``k`` always satisfies ``ok``.

    The search gallops down from ``hi`` (hi−1, hi−2, hi−4, …) before it bisects, so it never probes far below the
    answer: here a probe renders a prompt, and prompts below the answer are the long ones.
    """
    if not ok(hi):
        return None
    good, bad, step = hi, lo - 1, 1
    while good > lo:
        probe = max(good - step, lo)
        if not ok(probe):
            bad = probe
            break
        good, step = probe, 2 * step
    while good - bad > 1:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


def prefix_hash(messages: Sequence[dict]) -> str:
    """A stable SHA-256 of a decision prefix (canonical JSON: sorted keys, no spaces, ASCII): the score-cache key."""
    canonical = json.dumps(list(messages), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()
