"""A closed search-QA set from recorded Search-R1 trajectories (AgentProcessBench hotpotqa): every passage the
recorded searches returned becomes the corpus, and each question whose golden answer some recorded passage contains
becomes a task, its queries those of a successful recorded trajectory (else of any). Small enough for CPU tests and
recipes, and built from the user's copy of the data at run time (``deltattg search-data``), never shipped.

    corpus.jsonl                                {"id", "contents"} per passage (Search-R1's layout)
    questions/train.jsonl, questions/test.jsonl {"id", "question", "golden_answers", "queries", "data_source"}

Splits: a fixed share of the questions (``test_share``) goes to ``test`` by a hash of the question text, so the split
does not depend on the file's order. (AgentProcessBench's own ``split.json`` splits trajectories, not questions.)
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deltattg.data.jsonl import read_jsonl, write_jsonl
from deltattg.data.sources import held_out_by_hash
from deltattg.envs.search.answers import exact_match, mentions
from deltattg.errors import InputError


@dataclass(frozen=True)
class ClosedSet:
    corpus: list[dict[str, str]]
    splits: dict[str, list[dict[str, Any]]]
    dropped: int  # questions whose answer no recorded passage contains


def _text(content: Any) -> str:
    """A message's text: a string, or the ``text`` of each part of an OpenAI-style list of content parts."""
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""


def _search_results(message: dict[str, Any]) -> list[dict[str, str]]:
    """The documents of one recorded ``search`` tool message (none for an error message)."""
    try:
        result = json.loads(_text(message.get("content")) or "")["result"]
    except (ValueError, KeyError, TypeError):
        return []
    docs = []
    for hits in result if isinstance(result, list) else []:
        for hit in hits if isinstance(hits, list) else []:
            doc = hit.get("document", hit) if isinstance(hit, dict) else None
            if isinstance(doc, dict) and isinstance(doc.get("contents"), str) and "id" in doc:
                docs.append({"id": str(doc["id"]), "contents": doc["contents"]})
    return docs


def _queries(message: dict[str, Any], field: str) -> list[str]:
    """The queries of an assistant message's ``search`` tool calls (``field`` names the message in errors); the
    arguments may be a JSON string (OpenAI's format) or an object. A call whose arguments do not parse is skipped, as
    the recorded environment answered it with an error."""
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise InputError("must be a list of tool calls", field=f"{field}.tool_calls")
    queries = []
    for k, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise InputError("must be an object with 'name' and 'arguments'", field=f"{field}.tool_calls[{k}].function")
        if function.get("name") != "search":
            continue
        arguments = function.get("arguments") or "{}"
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                continue
        found = arguments.get("query_list", arguments.get("query")) if isinstance(arguments, dict) else None
        found = [found] if isinstance(found, str) else found
        queries += [q.strip() for q in found or [] if isinstance(q, str) and q.strip()]
    return queries


def _golden(record: dict[str, Any]) -> list[str]:
    """The golden answers of a record: ``ground_truth.target`` (a string or a list), or ``ground_truth`` itself."""
    truth = record.get("ground_truth")
    truth = truth.get("target") if isinstance(truth, dict) else truth
    if isinstance(truth, str):
        return [truth]
    if isinstance(truth, list) and truth and all(isinstance(t, (str, int, float)) for t in truth):
        return [str(t) for t in truth]
    raise InputError("the golden answers: a string or a list of strings, at ground_truth.target or ground_truth",
                     field="ground_truth")  # fmt: skip


def _record_contents(record: Any, corpus: dict[str, str], found: dict[str, set[str]]) -> tuple[str, list[str], list[str]]:
    """One record's question, golden answers and queries; its recorded passages go into ``corpus`` and ``found``
    (``InputError`` naming the field of a shape it cannot read)."""
    if not isinstance(record, dict) or not isinstance(record.get("question"), str):
        raise InputError("an AgentProcessBench record needs a 'question' string", field="question")
    if not isinstance(record.get("messages"), list):
        raise InputError("must be a list of chat messages", field="messages")
    question, golden, asked = record["question"], _golden(record), []
    for k, message in enumerate(record["messages"]):
        if not isinstance(message, dict):
            raise InputError("must be a chat message object ({'role': ..., 'content': ...})", field=f"messages[{k}]")
        if message.get("role") == "tool":
            for doc in _search_results(message):
                corpus.setdefault(doc["id"], doc["contents"])
                found[question].add(doc["id"])
        elif message.get("role") == "assistant":
            asked += _queries(message, f"messages[{k}]")
    return question, golden, asked


def closed_set(trajectories: str | os.PathLike, test_share: float = 0.25) -> ClosedSet:
    """The closed set of an AgentProcessBench-style JSONL file (see the module doc)."""
    corpus: dict[str, str] = {}
    found: dict[str, set[str]] = defaultdict(set)
    answers: dict[str, list[str]] = {}
    queries: dict[str, list[str]] = {}
    sources: dict[str, str] = {}
    for line, record in read_jsonl(trajectories):
        try:
            question, golden, asked = _record_contents(record, corpus, found)
        except InputError as error:
            raise error.located(path=str(trajectories), line=line) from None
        answers.setdefault(question, golden)
        sources.setdefault(question, str(record.get("data_source") or "recorded"))
        won = exact_match(str(record.get("answer_text") or ""), golden)
        if asked and (won or question not in queries):  # a successful trajectory's queries, else the first's
            queries[question] = list(dict.fromkeys(asked))
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "test": []}
    dropped = 0
    for index, (question, golden) in enumerate(answers.items()):
        if not any(mentions(corpus[i], golden) for i in found[question]):
            dropped += 1
            continue
        row = {"id": f"q{index}", "question": question, "golden_answers": golden, "queries": queries.get(question, []),
               "data_source": sources[question]}
        splits["test" if held_out_by_hash(question, test_share) else "train"].append(row)
    return ClosedSet([{"id": i, "contents": c} for i, c in corpus.items()], splits, dropped)


def write_closed_set(closed: ClosedSet, out: str | os.PathLike) -> dict[str, int]:
    """Write ``corpus.jsonl`` and ``questions/SPLIT.jsonl`` into ``out`` (each whole or not at all); the counts
    written."""
    counts = {"corpus": write_jsonl(Path(out) / "corpus.jsonl", closed.corpus)}
    counts.update({name: write_jsonl(Path(out) / "questions" / f"{name}.jsonl", rows)
                   for name, rows in closed.splits.items()})
    return counts
