"""How many tokens the actor generated for each action (n_{i,t} of Eq. 1), counted with any HF tokenizer.

The count is the assistant turn as the tokenizer's chat template renders it after the generation prompt: content,
reasoning and tool calls, plus the end-of-turn marker — never the prompt, observations or earlier turns. Templates
that do not render tool calls or reasoning (SmolLM2's, for one) would undercount an action that is only a tool call,
so whatever the template left out is counted from its canonical JSON form.
"""

from __future__ import annotations

import json
from typing import Any

from deltattg.data.jsonl import MAX_DEPTH, nesting_exceeds
from deltattg.data.trajectory import Trajectory, assistant_indices, text_of
from deltattg.errors import InputError


def tool_call_text(call: dict) -> str:
    """The canonical JSON of one OpenAI tool call: ``{"name": ..., "arguments": ...}``."""
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except (ValueError, RecursionError):
            parsed = arguments
        arguments = arguments if nesting_exceeds(parsed, MAX_DEPTH) else parsed
    return json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)


def _template_ready(message: dict) -> dict:
    """A copy that every chat template can render (string content, never None)."""
    out = dict(message)
    out["content"] = text_of(message.get("content"))
    return out


def _missing_parts(message: dict, rendered: str) -> str:
    """The reasoning and tool calls of ``message`` that ``rendered`` does not contain."""
    parts = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning and str(reasoning) not in rendered:
        parts.append(str(reasoning))
    for call in message.get("tool_calls") or []:
        name = (call.get("function") or call).get("name")
        if not name or name not in rendered:
            parts.append(tool_call_text(call))
    return "\n".join(parts)


def assistant_turn_text(tokenizer: Any, messages: list[dict], index: int) -> str:
    """The text the actor generated for ``messages[index]`` (an assistant message), as its chat template renders it."""
    message = messages[index]
    if getattr(tokenizer, "chat_template", None):
        history = [_template_ready(m) for m in messages[: index + 1]]
        prompt = tokenizer.apply_chat_template(history[:-1], tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(history, tokenize=False)
        if full.startswith(prompt):
            rendered = full[len(prompt) :]
            missing = _missing_parts(message, rendered)
            return rendered + ("\n" + missing if missing else "")
    plain = text_of(message.get("content"))
    return "\n".join(p for p in (plain, _missing_parts(message, plain)) if p)


def count_step_tokens(messages: list[dict], tokenizer: Any) -> list[int]:
    """n_{i,t} for every assistant message of ``messages``."""
    return [
        len(tokenizer(assistant_turn_text(tokenizer, messages, index), add_special_tokens=False)["input_ids"])
        for index in assistant_indices(messages)
    ]


def resolve_step_tokens(traj: Trajectory, tokenizer: Any | None) -> list[int]:
    """The trajectory's token counts: ``step_tokens`` if given, else the recorded token ids, else counted."""
    if traj.step_tokens is not None:
        return traj.step_tokens
    if traj.steps is not None and all(s.token_ids is not None for s in traj.steps):
        return [len(s.token_ids) for s in traj.steps]  # type: ignore[arg-type]
    if traj.messages is None:
        raise InputError("no step_tokens and no messages to count them from", field="step_tokens")
    if tokenizer is None:
        raise InputError("no step_tokens: pass --tokenizer NAME_OR_PATH to count them", field="step_tokens")
    return count_step_tokens(traj.messages, tokenizer)


class ActionTokens:
    """n of one action given as text: its assistant turn as ``tokenizer``'s chat template renders it after a user turn
    (:func:`count_step_tokens` of that two-message chat), memoised per text — how the oracle counts the expert's
    remaining actions and completions count a completer's actions that carry no token ids."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._counts: dict[str, int] = {}

    def __call__(self, action: str) -> int:
        if action not in self._counts:
            turn = [{"role": "user", "content": ""}, {"role": "assistant", "content": action}]
            self._counts[action] = count_step_tokens(turn, self.tokenizer)[0]
        return self._counts[action]


def located_step_tokens(item: Any, tokenizer: Any | None) -> list[int]:
    """:func:`resolve_step_tokens` of a read record (``data.sources.Located``); an error names its file and line."""
    try:
        return resolve_step_tokens(item.trajectory, tokenizer)
    except InputError as exc:
        raise exc.located(path=item.path, line=item.line) from None
