"""Search QA behind the environment protocol, in Search-R1's setting (the paper's PaperSearchQA domain).

    env = SearchEnv("questions/", corpus="corpus.jsonl")          # or retriever="http://127.0.0.1:8000"
    task = env.tasks("train")[0]                                   # one split per question file
    observation = env.reset(task)                                  # "Question: ..."
    result = env.step("<search> Adelaide boarding school </search>")   # <information>Doc 1(Title: ...) ...
    result = env.step("<answer> Adelaide </answer>")               # done; reward 1.0 iff exact match

**Actions.** A reply holds one of (the first found wins, as in Search-R1):

* ``<search> QUERY </search>`` — Search-R1's text form; or a tool call ``{"name": "search", "arguments":
  {"query_list": [...]}}`` (or ``"query": "..."``), bare or inside ``<tool_call>`` tags, as the AgentProcessBench
  trajectories call it. Each query's top-``topk`` passages come back as ``<information>Doc i(Title: ...) text
  </information>`` (queries separated by ``---``); at most :data:`MAX_QUERIES` queries a step;
* ``<answer> TEXT </answer>`` — or the call ``{"name": "answer", "arguments": {"answer": "..."}}``: the episode ends,
  reward 1.0 and ``won`` iff the answer matches a golden answer exactly after SQuAD's normalisation (``info``: ``em``,
  ``f1``, ``answer``).

Anything else is an invalid step (Search-R1's "My previous action is invalid..." observation); a malformed tool call, an
unknown tool or missing queries say what was wrong. A retrieval that fails (server down, timed out, a bad answer) is a
failed step whose observation gives the reason; the episode goes on. After ``max_steps`` replies without an answer:
done, reward 0, ``truncated``. ``info["verified"]`` (CrEST): the search returned passages / the answer was right.

**Expert** (``expert_action``, what noisy-expert pools play): the task's known ``queries`` in order, then the question
itself, until a retrieved passage contains a golden answer (or one step is left); then that answer. **Mistakes**
(``mistaken_action``, :data:`MISTAKES`): an off-topic query (another question of the split), or a premature wrong
answer (the title of a retrieved passage that does not hold the answer, else another question's answer).
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from deltattg.envs.base import StepResult, Task
from deltattg.envs.search.answers import exact_match, f1_score, mentions
from deltattg.envs.search.data import Passage, passages_text, question_files, read_questions
from deltattg.envs.search.retrieval import BM25Index, RetrievalClient, RetrievalError, Retriever, bm25_index
from deltattg.envs.tool_calls import TOOL_CALL_TAG, Malformed, embedded_tool_calls

MAX_STEPS = 6  # Table 4's PaperSearchQA turn limit
TOPK = 3  # Search-R1's and the AgentProcessBench trajectories'
MAX_QUERIES = 8
MISTAKES = ("off_topic_query", "wrong_answer")

SYSTEM_PROMPT = (
    "Answer the given question. You must reason inside <think> and </think> first every time you get new "
    "information. If you lack some knowledge, you can call a search engine by <search> query </search> and it will "
    "return the top searched results between <information> and </information>. You can search as many times as you "
    "want. If you find no further external knowledge needed, you can directly provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. A tool call "
    '{"name": "search", "arguments": {"query_list": ["..."]}} inside <tool_call> and </tool_call> also searches.'
)  # Search-R1's instruction (its `make_prefix`), with the tool-call form the AgentProcessBench agents used
INVALID = ("My previous action is invalid. If I want to search, I should put the query between <search> and "
           "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
           "Let me try again.")  # Search-R1's observation for an invalid action

_TAG = re.compile(r"<\s*(search|answer)\s*>(.*?)<\s*/\s*\1\s*>", re.S)  # "< search >": word-level decoders

TOOL_SCHEMAS = [
    {"name": "search", "description": "Searches for relevant information based on queries.",
     "parameters": {"type": "object", "properties": {"query_list": {"type": "array", "items": {"type": "string"},
                                                                     "description": "List of search queries"}},
                    "required": ["query_list"]}},
    {"name": "answer", "description": "Gives the final answer and ends the episode.",
     "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}},
]  # fmt: skip


@dataclass(frozen=True)
class Action:
    """A parsed reply: ``kind`` is search, answer or invalid (``error`` says why)."""

    kind: str
    queries: tuple[str, ...] = ()
    answer: str = ""
    error: str = ""


def parse_search_action(reply: str) -> Action:
    """What a reply asks for (see the module doc)."""
    tagged = _TAG.search(reply)
    tool = TOOL_CALL_TAG.search(reply)
    if tagged and not (tool and tool.start() < tagged.start()):
        kind, body = tagged.group(1), tagged.group(2).strip()
        if not body:
            return Action("invalid", error=f"an empty <{kind}>")
        return Action("search", queries=(body,)) if kind == "search" else Action("answer", answer=body)
    try:
        calls = embedded_tool_calls(reply)
    except Malformed as error:
        return Action("invalid", error=f"malformed tool call: {error}")
    if not calls:
        return Action("invalid")
    name, arguments = calls[0]
    if name == "answer":
        answer = arguments.get("answer")
        if not isinstance(answer, str) or not answer.strip():
            return Action("invalid", error="the answer call needs a non-empty string 'answer'")
        return Action("answer", answer=answer.strip())
    if name != "search":
        return Action("invalid", error=f"unknown tool {name!r}: the tools are search and answer")
    queries = arguments.get("query_list", arguments.get("query"))
    queries = [queries] if isinstance(queries, str) else queries
    if not isinstance(queries, list) or not queries or not all(isinstance(q, str) and q.strip() for q in queries):
        return Action("invalid", error="search needs 'query_list', a non-empty list of non-empty strings")
    if len(queries) > MAX_QUERIES:
        return Action("invalid", error=f"at most {MAX_QUERIES} queries a search")
    return Action("search", queries=tuple(q.strip() for q in queries))


@dataclass
class _State:
    task: Task | None = None
    steps: int = 0
    done: bool = False
    queries: list[str] = field(default_factory=list)  # every query issued, in order
    seen: list[Passage] = field(default_factory=list)  # every passage retrieved, in order


class SearchEnv:
    """Search QA over a local BM25 corpus or a retrieval server (see the module doc)."""

    name = "search"
    system_prompt = SYSTEM_PROMPT

    def __init__(self, questions: str | os.PathLike, *, corpus: str | os.PathLike | None = None,
                 retriever: str | None = None, topk: int = TOPK, max_steps: int = MAX_STEPS,
                 retriever_timeout: float = 30.0):  # fmt: skip
        if (corpus is None) == (retriever is None):
            raise ValueError("the search environment needs exactly one of corpus (a JSONL file, searched with BM25 "
                             "here) and retriever (the URL of a Search-R1 retrieval server)")
        if not 1 <= topk <= 100 or max_steps < 1:
            raise ValueError(f"topk must be 1 to 100 and max_steps at least 1, got {topk} and {max_steps}")
        self.questions = str(Path(questions).expanduser().absolute())
        self.corpus = None if corpus is None else str(Path(corpus).expanduser().absolute())
        self.retriever_url = retriever
        self.topk = topk
        self.max_steps = max_steps
        self.retriever_timeout = retriever_timeout
        self._files = question_files(self.questions)
        self._retriever: Retriever = (bm25_index(self.corpus) if self.corpus is not None
                                      else RetrievalClient(retriever, timeout_s=retriever_timeout))
        self._tasks: dict[str, list[Task]] = {}
        self._state = _State()

    # protocol --------------------------------------------------------------------------------------------------
    def tasks(self, split: str) -> Sequence[Task]:
        if split not in self._files:
            raise ValueError(f"no split {split!r} in {self.questions}: the splits are {', '.join(self._files)}")
        if split not in self._tasks:
            self._tasks[split] = read_questions(self._files[split], split)
        return self._tasks[split]

    def describe(self) -> dict[str, Any]:
        """``{"name": "search", "options": {...}}`` (``Describable``): paths absolute, so any folder rebuilds it."""
        return {"name": self.name, "options": {"data": self.questions, "corpus": self.corpus,
                                               "retriever": self.retriever_url, "topk": self.topk,
                                               "max_steps": self.max_steps}}  # fmt: skip

    def admissible_actions(self) -> None:
        return None

    def reset(self, task: Task) -> str:
        self._state = _State(task=task)
        return f"Question: {task.data['question']}"

    def step(self, action: str) -> StepResult:
        state = self._live()
        state.steps += 1
        parsed = parse_search_action(action)
        info: dict[str, Any] = {"kind": parsed.kind, "won": False, "truncated": False, "admissible": None}
        reward = 0.0
        if parsed.kind == "answer":
            golden = state.task.data["answers"]
            won = exact_match(parsed.answer, golden)
            info.update(answer=parsed.answer, em=won, f1=f1_score(parsed.answer, golden), won=won, verified=won)
            state.done, reward, observation = True, float(won), ""
        elif parsed.kind == "search":
            observation, info["verified"] = self._search(parsed.queries, info)
        else:
            observation = f"{INVALID} ({parsed.error})" if parsed.error else INVALID
            info["verified"] = False
        if not state.done and state.steps >= self.max_steps:
            state.done, info["truncated"] = True, True
        return StepResult(observation, reward, state.done, info)

    def _search(self, queries: Sequence[str], info: dict[str, Any]) -> tuple[str, bool]:
        state = self._state
        state.queries.extend(queries)
        info["queries"] = list(queries)
        try:
            results = self._retriever.search(queries, self.topk)
        except RetrievalError as error:
            info["error"] = str(error)
            return f"Search failed: {error}", False
        state.seen.extend(p for hits in results for p in hits)
        info["passages"] = [p.id for hits in results for p in hits]
        return f"<information>{passages_text(results)}</information>", any(results)

    def snapshot(self) -> _State:
        return replace(self._state, queries=list(self._state.queries), seen=list(self._state.seen))

    def restore(self, state: _State) -> None:
        self._state = replace(state, queries=list(state.queries), seen=list(state.seen))

    # expert, mistakes, tools ---------------------------------------------------------------------------------------
    def expert_action(self) -> str:
        state = self._live()
        golden = state.task.data["answers"]
        found = any(mentions(p.contents, golden) for p in state.seen)
        untried = [q for q in [*state.task.data["queries"], state.task.data["question"]] if q not in state.queries]
        if found or not untried or state.steps >= self.max_steps - 1:
            return f"<answer> {golden[0]} </answer>"
        return f"<search> {untried[0]} </search>"

    def mistaken_action(self, rng: random.Random) -> str:
        """An off-topic query or a premature wrong answer (:data:`MISTAKES`)."""
        state = self._live()
        golden = state.task.data["answers"]
        others = [t for t in self.tasks(state.task.split) if t.id != state.task.id] or [state.task]
        if rng.choice(MISTAKES) == "off_topic_query":
            return f"<search> {rng.choice(others).data['question']} </search>"
        titles = sorted({p.title for p in state.seen if p.title and not mentions(p.title, golden)})
        wrong = rng.choice(titles) if titles else rng.choice(others).data["answers"][0]
        return f"<answer> {wrong} </answer>"

    def reference_answer(self, task: Task) -> str:
        """The first golden answer as the agent would give it (what IGPO and A²TGPO track)."""
        return f"<answer> {task.data['answers'][0]} </answer>"

    def tool_schemas(self) -> list[dict[str, Any]]:
        """search and answer (``HasToolCalls``: what the random policy calls)."""
        return TOOL_SCHEMAS

    def call_text(self, name: str, arguments: dict[str, Any]) -> str:
        if name == "answer":
            return f"<answer> {arguments.get('answer', '')} </answer>"
        return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"

    def plain_replies(self) -> list[str]:
        return []

    def vocabulary(self) -> list[str]:
        """Every word the environment's text can contain: the prompt, the messages, every question, answer and
        passage (what ``actor.model=tiny`` builds its word-level tokenizer from); a local corpus only."""
        from deltattg.envs.household.catalog import split_words

        if not isinstance(self._retriever, BM25Index):
            raise ValueError("the search environment lists its vocabulary only over a local corpus (corpus=...)")
        texts = [SYSTEM_PROMPT, INVALID, "Question: <information> </information> Doc 1(Title: ) --- No results. "
                 "Search failed: <answer> </answer> <search> </search>", *map(str, range(MAX_QUERIES + 1))]
        texts += [p.contents for p in self._retriever.passages]
        texts += [text for split in self._files for task in self.tasks(split)
                  for text in [task.data["question"], *task.data["answers"], *task.data["queries"]]]
        return sorted({word for text in texts for word in split_words(text)})

    def _live(self) -> _State:
        if self._state.task is None:
            raise RuntimeError("call reset(task) before step()")
        if self._state.done:
            raise RuntimeError("the episode is over; call reset(task)")
        return self._state
