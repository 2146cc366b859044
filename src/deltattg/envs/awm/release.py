"""Agent World Model's released files (AgentWorldModel-1K, Snowflake-Labs/agent-world-model), read as released.

A release folder holds combined JSONL files, one record per scenario (per task for the verifiers), joined on the
scenario's normalised name (:func:`normalize_scenario_name`, AWM's own):

    gen_scenario.jsonl            {"name", "description"}
    gen_tasks.jsonl               {"scenario", "tasks": [str, ...]}            task id = index in the list
    gen_db.jsonl                  {"scenario", "db_schema": {"tables": [{"name", "ddl", "indexes": [sql]}]}}
    gen_sample.jsonl              {"scenario", "sample_data": {"tables": [{"table_name", "insert_statements": [sql]}]}}
    gen_envs.jsonl                {"scenario", "full_code"}                    a FastAPI app (SQLAlchemy over SQLite)
    gen_verifier.pure_code.jsonl  {"scenario", "task_idx", "task", "verification": {"code", "raw_response"}}

(``gen_spec.jsonl`` and the LLM-judged ``gen_verifier.jsonl`` are not read: the reward here is the code-mode
verifier's verdict.) deltattg adds one optional file of its own, ``deltattg_gold.jsonl``: ``{"scenario", "task_idx",
"calls": [{"tool_name", "arguments"}], "answer"}``, a task's gold tool calls and final answer (what the expert plays),
and ``deltattg_split.json``, ``{"test": [scenario, ...]}``, the scenarios held out (else a fixed share by a hash of
each scenario's name); the released set has neither.

A task is playable when its scenario has a database, sample data, code and a code verifier for it; the others are
counted (:attr:`Release.unplayable`), never silently dropped. Bad records are ``InputError`` naming file and line.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deltattg.data.jsonl import read_jsonl
from deltattg.data.sources import held_out_by_hash
from deltattg.errors import InputError

FILES = {"tasks": "gen_tasks.jsonl", "db": "gen_db.jsonl", "sample": "gen_sample.jsonl", "envs": "gen_envs.jsonl",
         "verifier": "gen_verifier.pure_code.jsonl"}  # fmt: skip
OPTIONAL = {"scenario": "gen_scenario.jsonl", "gold": "deltattg_gold.jsonl", "split": "deltattg_split.json"}
TEST_SHARE = 0.2


def normalize_scenario_name(scenario: str) -> str:
    """AWM's key for a scenario (``awm/tools.py``): lower case, non-alphanumerics to ``_``, runs of ``_`` merged."""
    name = re.sub(r"[^a-z0-9_]", "_", scenario.lower())
    return re.sub(r"_+", "_", name).strip("_").strip()


@dataclass(frozen=True)
class Scenario:
    name: str  # normalised
    description: str
    db_schema: dict[str, Any]
    sample_data: dict[str, Any] | list[Any]  # {"tables": [...]} as released, or the list of tables
    code: str
    tasks: tuple[str, ...]
    verifiers: dict[int, str]  # task_idx -> code-mode verifier source
    gold: dict[int, dict[str, Any]] = field(default_factory=dict)  # task_idx -> {"calls", "answer"}
    split: str = "train"  # train or test (see the module doc)


def hashed_split(name: str) -> str:
    """``test`` for a fixed share of scenarios (by a hash of the name), else ``train``."""
    return "test" if held_out_by_hash(name, TEST_SHARE) else "train"


@dataclass(frozen=True)
class Release:
    folder: str
    scenarios: dict[str, Scenario]
    unplayable: int  # tasks without a database, sample data, code or code verifier


def _field(record: dict[str, Any], key: str, kind: type | tuple[type, ...], path: Path, line: int) -> Any:
    value = record.get(key)
    if not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise InputError(f"must be a {names}", path=str(path), line=line, field=key)
    return value


def _by_scenario(path: Path, value_of) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for line, record in read_jsonl(path):
        key = normalize_scenario_name(_field(record, "scenario", str, path, line))
        found[key] = value_of(record, line)
    return found


def read_release(folder: str | os.PathLike) -> Release:
    """The playable scenarios of a release folder (see the module doc)."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise InputError("no such AWM release folder", path=str(folder))
    missing = [name for name in FILES.values() if not (root / name).is_file()]
    if missing:
        raise InputError(f"not an AWM release folder: {', '.join(missing)} missing", path=str(folder))
    paths = {key: root / name for key, name in FILES.items()}
    tasks = _by_scenario(paths["tasks"], lambda r, n: _tasks(r, paths["tasks"], n))
    schemas = _by_scenario(paths["db"], lambda r, n: _db_schema(r, paths["db"], n))
    samples = _by_scenario(paths["sample"], lambda r, n: _sample_data(r, paths["sample"], n))
    codes = _by_scenario(paths["envs"], lambda r, n: _field(r, "full_code", str, paths["envs"], n))
    verifiers: dict[str, dict[int, str]] = {}
    for line, record in read_jsonl(paths["verifier"]):
        scenario = normalize_scenario_name(_field(record, "scenario", str, paths["verifier"], line))
        index = _field(record, "task_idx", int, paths["verifier"], line)
        code = (_field(record, "verification", dict, paths["verifier"], line)).get("code")
        if isinstance(code, str) and code.strip():
            verifiers.setdefault(scenario, {})[index] = code
    descriptions = _descriptions(root / OPTIONAL["scenario"])
    gold = _gold(root / OPTIONAL["gold"])
    held_out = _held_out(root / OPTIONAL["split"])
    scenarios, unplayable = {}, 0
    for name, texts in tasks.items():
        ready = all(name in part for part in (schemas, samples, codes))
        playable = {i: code for i, code in verifiers.get(name, {}).items() if 0 <= i < len(texts)} if ready else {}
        unplayable += len(texts) - len(playable)
        if playable:
            split = hashed_split(name) if held_out is None else ("test" if name in held_out else "train")
            scenarios[name] = Scenario(name, descriptions.get(name, ""), schemas[name], samples[name], codes[name],
                                       tuple(texts), playable, gold.get(name, {}), split)  # fmt: skip
    return Release(str(root.absolute()), scenarios, unplayable)


def _tasks(record: dict[str, Any], path: Path, line: int) -> list[str]:
    texts = _field(record, "tasks", list, path, line)
    if not all(isinstance(t, str) and t.strip() for t in texts):
        raise InputError("must be a list of non-empty strings", path=str(path), line=line, field="tasks")
    return texts


def _db_schema(record: dict[str, Any], path: Path, line: int) -> dict[str, Any]:
    schema = _field(record, "db_schema", dict, path, line)
    tables = schema.get("tables", [])
    if not isinstance(tables, list) or not all(isinstance(table, dict) for table in tables):
        raise InputError('must be a list of tables ({"name", "ddl", "indexes"})', path=str(path), line=line,
                         field="db_schema.tables")
    return schema


def _sample_data(record: dict[str, Any], path: Path, line: int) -> dict[str, Any] | list[Any]:
    sample = _field(record, "sample_data", (dict, list), path, line)
    groups = sample.get("tables", []) if isinstance(sample, dict) else sample
    if not isinstance(groups, list):
        raise InputError('must be a list of tables ({"table_name", "insert_statements"})', path=str(path), line=line,
                         field="sample_data.tables")
    for i, group in enumerate(groups):
        if isinstance(group, dict) and not isinstance(group.get("insert_statements", []), list):
            raise InputError("must be a list of SQL statements", path=str(path), line=line,
                             field=f"sample_data.tables[{i}].insert_statements")
    return sample


def _descriptions(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    found = {}
    for line, record in read_jsonl(path):
        found[normalize_scenario_name(_field(record, "name", str, path, line))] = str(record.get("description") or "")
    return found


def _held_out(path: Path) -> set[str] | None:
    if not path.is_file():
        return None
    try:
        test = json.loads(path.read_text())["test"]
        if not isinstance(test, list) or not all(isinstance(name, str) for name in test):
            raise TypeError
    except (OSError, ValueError, KeyError, TypeError):
        raise InputError('must be {"test": [scenario names]}', path=str(path)) from None
    return {normalize_scenario_name(name) for name in test}


def _gold(path: Path) -> dict[str, dict[int, dict[str, Any]]]:
    if not path.is_file():
        return {}
    found: dict[str, dict[int, dict[str, Any]]] = {}
    for line, record in read_jsonl(path):
        scenario = normalize_scenario_name(_field(record, "scenario", str, path, line))
        calls = _field(record, "calls", list, path, line)
        if not all(isinstance(c, dict) and isinstance(c.get("tool_name"), str)
                   and isinstance(c.get("arguments", {}), dict) for c in calls):  # fmt: skip
            raise InputError("each call is {\"tool_name\": str, \"arguments\": {...}}", path=str(path), line=line,
                             field="calls")
        answer = record.get("answer", "Done.")
        found.setdefault(scenario, {})[_field(record, "task_idx", int, path, line)] = {
            "calls": [{"tool_name": c["tool_name"], "arguments": c.get("arguments", {})} for c in calls],
            "answer": str(answer)}
    return found
