"""The search environment's files: question sets (one split per file) and passage corpora, in Search-R1's formats.

**Questions**: JSONL or Parquet, one question a record, as Search-R1 / FlashRAG and verl's search recipes write them:
``question`` (a string; in the rows verl's ``preprocess_search_r1_dataset.py`` writes, ``extra_info.question``) and
the golden answers under ``golden_answers``, ``ground_truth.target`` (AgentProcessBench) or
``reward_model.ground_truth.target`` (verl's parquet rows), a string or a list of strings. Optional: ``id`` (the
task id; else ``SPLIT-N``, N the record's 0-based position), ``queries``, a list of search queries known to find
the evidence (what the expert tries first), and ``data_source`` (what ``evaluate`` breaks results down by). A folder of such files has one split per file, named by the file's stem
(``train.jsonl`` → ``train``).

**Corpus**: JSONL, one passage a line, ``{"id": ..., "contents": "Title\\ntext"}`` (Search-R1's ``wiki-18.jsonl``
layout; a passage's title is its first line, as Search-R1 shows it, quotes kept).

Bad records are ``InputError`` naming the file, the line (Parquet: the row) and the field.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deltattg.data.jsonl import read_jsonl
from deltattg.envs.base import Task
from deltattg.errors import InputError

QUESTION_SUFFIXES = (".jsonl", ".parquet")


@dataclass(frozen=True)
class Passage:
    """One corpus passage: ``contents`` is ``Title\\ntext``."""

    id: str
    contents: str

    @property
    def title(self) -> str:
        """The first line of ``contents``, as Search-R1 shows it (``"Westminster School, Adelaide"``, quotes kept)."""
        return self.contents.split("\n", 1)[0].strip()

    @property
    def text(self) -> str:
        parts = self.contents.split("\n", 1)
        return parts[1].strip() if len(parts) > 1 else ""

    def as_json(self) -> dict[str, str]:
        return {"id": self.id, "contents": self.contents}


def question_files(path: str | os.PathLike) -> dict[str, Path]:
    """``{split: file}`` for a question file (its stem is the split) or a folder of them."""
    root = Path(path).expanduser()
    if root.is_file():
        return {root.stem: root}
    if not root.is_dir():
        raise InputError("no such question file or folder", path=str(path))
    files = {f.stem: f for f in sorted(root.iterdir()) if f.suffix in QUESTION_SUFFIXES and f.is_file()}
    if not files:
        raise InputError(f"no question files ({' or '.join(QUESTION_SUFFIXES)}) in this folder", path=str(path))
    return files


def _records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line or 1-based row, record)`` of a JSONL or Parquet file."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except (OSError, ValueError) as exc:  # pyarrow's errors derive from these
            raise InputError(f"not a readable Parquet file: {exc}", path=str(path)) from None
        return list(enumerate(rows, start=1))
    return list(read_jsonl(path))


def _answers(record: dict[str, Any]) -> tuple[Any, str]:
    """The record's golden answers as written, and the field they came from (for error messages)."""
    if "golden_answers" in record:
        return record["golden_answers"], "golden_answers"
    truth = record.get("ground_truth")
    if truth is None and isinstance(record.get("reward_model"), dict):
        truth, field = record["reward_model"].get("ground_truth"), "reward_model.ground_truth.target"
    else:
        field = "ground_truth.target"
    return (truth.get("target") if isinstance(truth, dict) else None), field


def _strings(value: Any, field: str, *, path: str, line: int) -> list[str]:
    values = [value] if isinstance(value, str) else value
    if hasattr(values, "tolist"):  # a numpy array from Parquet
        values = values.tolist()
    if not isinstance(values, list) or not values or not all(isinstance(v, str) and v.strip() for v in values):
        raise InputError("must be a non-empty string or list of non-empty strings", path=path, line=line, field=field)
    return [v.strip() for v in values]


def question_task(record: dict[str, Any], split: str, index: int, *, path: str, line: int) -> Task:
    """The task of one question record (see the module doc)."""
    extra = record.get("extra_info") if isinstance(record.get("extra_info"), dict) else {}
    question, field = (record.get("question"), "question") if "question" in record else \
        (extra.get("question"), "extra_info.question")  # fmt: skip
    if not isinstance(question, str) or not question.strip():
        raise InputError("a question record needs a non-empty string 'question' (verl's rows: 'extra_info.question')",
                         path=path, line=line, field=field)  # fmt: skip
    answers, field = _answers(record)
    if answers is None:
        raise InputError("no golden answers: give golden_answers, ground_truth.target or "
                         "reward_model.ground_truth.target", path=path, line=line)
    queries = record.get("queries")
    task_id = record.get("id", f"{split}-{index}")
    if not isinstance(task_id, (str, int)) or isinstance(task_id, bool):
        raise InputError("must be a string or an integer", path=path, line=line, field="id")
    source = record.get("data_source")
    data = {"question": question.strip(), "answers": _strings(answers, field, path=path, line=line),
            "queries": [] if queries is None else _strings(queries, "queries", path=path, line=line),
            "source": source if isinstance(source, str) else None}
    return Task(id=str(task_id), split=split, data=data)


def read_questions(path: str | os.PathLike, split: str) -> list[Task]:
    """The tasks of one question file; duplicate ids are refused (a task id is a trajectory group)."""
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for index, (line, record) in enumerate(_records(Path(path))):
        task = question_task(record, split, index, path=str(path), line=line)
        if task.id in seen:
            raise InputError(f"duplicate id {task.id!r} (first on line {seen[task.id]})", path=str(path), line=line,
                             field="id")
        seen[task.id] = line
        tasks.append(task)
    if not tasks:
        raise InputError("no questions in this file", path=str(path))
    return tasks


def read_corpus(path: str | os.PathLike) -> list[Passage]:
    """The passages of a corpus JSONL file; a line without a string ``contents`` or with a repeated id is refused."""
    passages: list[Passage] = []
    seen: dict[str, int] = {}
    for line, record in read_jsonl(Path(path).expanduser()):
        contents, pid = record.get("contents"), record.get("id", str(len(passages)))
        if not isinstance(contents, str) or not contents.strip():
            raise InputError("a passage needs a non-empty string 'contents'", path=str(path), line=line,
                             field="contents")
        if not isinstance(pid, (str, int)) or isinstance(pid, bool):
            raise InputError("must be a string or an integer", path=str(path), line=line, field="id")
        if str(pid) in seen:
            raise InputError(f"duplicate passage id {pid!r} (first on line {seen[str(pid)]})", path=str(path),
                             line=line, field="id")
        seen[str(pid)] = line
        passages.append(Passage(str(pid), contents))
    if not passages:
        raise InputError("no passages in this corpus", path=str(path))
    return passages


def passages_text(results: Sequence[Sequence[Passage]]) -> str:
    """Retrieved passages as the agent reads them (Search-R1's ``Doc i(Title: ...) text`` lines; one block per
    query, blocks separated by ``---`` as in verl's search tool)."""
    blocks = []
    for passages in results:
        lines = [f"Doc {i}(Title: {p.title}) {p.text}" for i, p in enumerate(passages, start=1)]
        blocks.append("\n".join(lines) if lines else "No results.")
    return "\n---\n".join(blocks)
