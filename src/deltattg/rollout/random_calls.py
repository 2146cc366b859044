"""Random tool calls for the ``random`` policy in environments whose actions are tool calls (BFCL, τ²-bench).

Household and ALFWorld list their admissible commands, and the random policy draws one. A tool environment has no
such list, but it knows its tools: :class:`HasToolCalls` environments give their tools' JSON schemas, how a call is
written in their action format, and the replies that make no call (BFCL: close the user turn; τ²: a question to the
user, or ending the conversation). :func:`random_reply` draws uniformly among the tools and those replies; a tool's
arguments are drawn from its schema (:func:`sample_arguments`): every required argument and each optional one with
probability 1/2, an ``enum`` member, a word or number the episode's observations have shown for a string or number
(so that an id the user gave may be tried), a random small number or a flag otherwise.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

MAX_DEPTH = 3  # nested arrays / objects deeper than this are drawn empty
WORD = re.compile(r"[\w#@$%.:/+\-]+")


@runtime_checkable
class HasToolCalls(Protocol):
    """Environments whose actions are tool calls: what a random policy can sample (see the module doc)."""

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools the actor may call now, each ``{"name": ..., "parameters": JSON schema}``."""
        ...

    def call_text(self, name: str, arguments: dict[str, Any]) -> str:
        """The reply that makes the call, in the environment's action format."""
        ...

    def plain_replies(self) -> list[str]:
        """Replies that make no call (ending a turn, a message to the user)."""
        ...


@dataclass(frozen=True)
class Seen:
    """The words and numbers the episode has shown (its observations), what string and number arguments draw from."""

    words: tuple[str, ...]
    numbers: tuple[int | float, ...]

    @classmethod
    def of(cls, texts: Sequence[str]) -> Seen:
        words = dict.fromkeys(w.strip(".,:;") for text in texts for w in WORD.findall(text))
        words.pop("", None)
        return cls(tuple(words), tuple(n for n in map(_number, words) if n is not None))


def _number(word: str) -> int | float | None:
    for kind in (int, float):
        try:
            return kind(word)
        except ValueError:
            continue
    return None


def _resolve(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    """``schema`` with a local ``$ref`` (``#/$defs/Name``, as pydantic writes them) followed."""
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return schema
    target: Any = root
    for key in ref[2:].split("/"):
        target = target.get(key, {}) if isinstance(target, Mapping) else {}
    return target if isinstance(target, Mapping) else {}


def _type(schema: Mapping[str, Any], rng: random.Random) -> str | None:
    """The schema's type (one of a list; a non-null one where there is a choice)."""
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"] or kind
        kind = rng.choice(kinds) if kinds else None
    return kind if isinstance(kind, str) else None


def sample_value(schema: Mapping[str, Any], rng: random.Random, seen: Seen, root: Mapping[str, Any],
                 depth: int = 0) -> Any:  # fmt: skip
    """A value of the JSON schema ``schema`` (BFCL's types too: ``dict``, ``float``, ``tuple``, ``any``)."""
    schema = _resolve(schema, root)
    if schema.get("enum"):
        return rng.choice(list(schema["enum"]))
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        kept = [o for o in options if _resolve(o, root).get("type") != "null"] or list(options)
        return sample_value(rng.choice(kept), rng, seen, root, depth)
    kind = _type(schema, rng)
    if kind == "string":
        return rng.choice(seen.words) if seen.words else ""
    if kind in ("integer", "number", "float"):
        integers = [n for n in seen.numbers if isinstance(n, int)] if kind == "integer" else list(seen.numbers)
        if integers and rng.random() < 0.5:
            return rng.choice(integers)
        return rng.randint(0, 10) if kind == "integer" else round(rng.uniform(0, 100), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind in ("array", "tuple"):
        items = schema.get("items") if isinstance(schema.get("items"), Mapping) else {}
        count = rng.randint(1, 2) if depth < MAX_DEPTH else 0
        return [sample_value(items, rng, seen, root, depth + 1) for _ in range(count)]
    if kind in ("object", "dict"):
        return sample_arguments(schema, rng, seen, root, depth + 1) if depth < MAX_DEPTH else {}
    return None


def sample_arguments(schema: Mapping[str, Any], rng: random.Random, seen: Seen,
                     root: Mapping[str, Any] | None = None, depth: int = 0) -> dict[str, Any]:  # fmt: skip
    """Arguments of an object schema: every required property, each optional one with probability 1/2."""
    root = schema if root is None else root
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    return {name: sample_value(sub, rng, seen, root, depth) for name, sub in properties.items()
            if isinstance(sub, Mapping) and (name in required or rng.random() < 0.5)}  # fmt: skip


def random_reply(env: HasToolCalls, observations: Sequence[str], rng: random.Random) -> str:
    """A uniformly drawn tool call (arguments from its schema, :func:`sample_arguments`) or call-free reply of
    ``env``; ``observations``: what the episode has shown so far."""
    tools = env.tool_schemas()
    replies = env.plain_replies()
    pick = rng.randrange(len(tools) + len(replies))
    if pick >= len(tools):
        return replies[pick - len(tools)]
    tool = tools[pick]
    return env.call_text(tool["name"], sample_arguments(tool.get("parameters") or {}, rng, Seen.of(observations)))
