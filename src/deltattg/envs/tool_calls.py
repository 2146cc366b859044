"""Tool calls written as text, the way chat agents write them (τ², the search environment, AWM).

A reply is a tool call when the whole of it (optionally inside a Markdown code fence or ``<tool_call>…</tool_call>``
tags) is a JSON object ``{"name": TOOL, "arguments": {...}}``, or a JSON list of them; ``arguments`` may be a JSON
string, as OpenAI's ``tool_calls`` carry them. A reply that starts like one (``{``, ``[``, ``<tool_call>``) but is not
one is :class:`Malformed`.
"""

from __future__ import annotations

import json
import re
from typing import Any

_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n?(.*?)\n?```$", re.S)
_TAGS = re.compile(r"^<tool_call>\s*(.*?)\s*(?:</tool_call>)?$", re.S)
TOOL_CALL_TAG = re.compile(r"<tool_call>.*?(?:</tool_call>|$)", re.S)  # anywhere in a reply; left open at the end too


class Malformed(ValueError):
    """A reply that starts like a tool call but is not one."""


def tool_call(value: Any) -> tuple[str, dict[str, Any]]:
    """``(name, arguments)`` of a decoded ``{"name": ..., "arguments": {...}}`` (arguments also as a JSON string, as
    OpenAI sends them, or omitted / null: none); :class:`Malformed` otherwise."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        raise Malformed('a tool call is a JSON object with a "name" (a string) and "arguments" (an object)')
    arguments = value.get("arguments")
    if arguments is None:  # omitted, or null as AWM's prompt shows for list_tools
        arguments = {}
    if isinstance(arguments, str):  # OpenAI-style arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise Malformed(f'the "arguments" of {value["name"]} are not a JSON object') from None
    if not isinstance(arguments, dict):
        raise Malformed(f'the "arguments" of {value["name"]} must be a JSON object')
    return value["name"], arguments


def parse_tool_calls(reply: str) -> list[tuple[str, dict[str, Any]]] | None:
    """The tool calls of a reply as ``(name, arguments)``, or None for a reply without one (a message). Raises
    :class:`Malformed` for a reply that starts like a tool call (``{``, ``[``, ``<tool_call>``) but is not one, or
    an empty reply."""
    body = reply.strip()
    if not body:
        raise Malformed("empty reply")
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    tagged = _TAGS.match(body)
    if tagged:
        body = tagged.group(1).strip()
    if not (tagged or body.startswith(("{", "["))):
        return None
    try:
        value = json.loads(body)
    except ValueError as error:
        raise Malformed(f"invalid JSON ({error})") from None
    calls = [tool_call(item) for item in value] if isinstance(value, list) else [tool_call(value)]
    if not calls:
        raise Malformed("an empty list of tool calls")
    return calls


def embedded_tool_calls(reply: str) -> list[tuple[str, dict[str, Any]]] | None:
    """:func:`parse_tool_calls` of a reply that may carry text around its call (reasoning first, as chat agents
    write): the first ``<tool_call>`` span wherever it is, else the whole reply."""
    tagged = TOOL_CALL_TAG.search(reply)
    return parse_tool_calls(tagged.group(0) if tagged else reply)
