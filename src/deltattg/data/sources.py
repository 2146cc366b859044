"""Where trajectories come from: our JSONL format, or AgentProcessBench records (converted on the fly)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from deltattg.data.jsonl import read_jsonl
from deltattg.data.trajectory import Trajectory, assistant_indices, parse_trajectory
from deltattg.errors import InputError


def is_agentprocessbench(record: dict) -> bool:
    return "final_label" in record and "messages" in record and "success" not in record


def from_agentprocessbench(record: dict) -> dict:
    """An AgentProcessBench record in our format: steps = assistant messages, success = ``final_label == 1``.

    ``id`` is ``total_index`` (the key of ``split.json``), ``group`` is ``<data_source>/<query_index>`` (samples of
    one question), ``reward`` is ``final_label`` (−1 / 0 / +1). Everything else (``step_labels``, ``question``, ...)
    is kept as it is.
    """
    for name in ("total_index", "final_label"):
        if name not in record:
            raise InputError("missing required field (AgentProcessBench record)", field=name)
    label = record["final_label"]
    if isinstance(label, bool) or label not in (-1, 0, 1):
        raise InputError(f"must be -1, 0 or 1, got {label!r}", field="final_label")
    out = dict(record)
    out.update(
        id=str(record["total_index"]),
        group=f"{record.get('data_source', 'agentprocessbench')}/{record.get('query_index', record['total_index'])}",
        reward=float(label),
        success=label == 1,
    )
    return out


@dataclass
class Located:
    """A trajectory with where it came from, so later errors can still name the file and line."""

    path: str
    line: int
    trajectory: Trajectory
    record: dict  # the record as read (converted to our format for AgentProcessBench input)


def read_trajectories(path: str | os.PathLike, *, skip_invalid: bool = False) -> tuple[list[Located], int]:
    """Read and validate every trajectory of a JSONL file (ours or AgentProcessBench).

    Returns the trajectories and how many invalid records were skipped (always 0 unless ``skip_invalid``; without it
    the first bad record raises ``InputError`` with file, line and field).
    """
    path = str(path)
    out: list[Located] = []
    skipped = 0
    for line, record in read_jsonl(path):
        try:
            if is_agentprocessbench(record):
                record = from_agentprocessbench(record)
            out.append(Located(path, line, parse_trajectory(record), record))
        except InputError as exc:
            if not skip_invalid:
                raise exc.located(path=path, line=line) from None
            skipped += 1
    return out, skipped


def load_split(path: str | os.PathLike, subset: str) -> set[str]:
    """The trajectory ids of one subset of a split file (``{"train": [ids], "val": [...], "test": [...]}``)."""
    from deltattg.data.jsonl import loads_strict

    try:
        with open(path, encoding="utf-8") as handle:
            split = loads_strict(handle.read())
    except OSError as exc:
        raise InputError(f"cannot open: {exc.strerror}", path=str(path)) from exc
    except ValueError as exc:
        raise InputError(f"malformed JSON: {exc}", path=str(path)) from exc
    if not isinstance(split, dict) or subset not in split or not isinstance(split[subset], list):
        names = sorted(k for k, v in split.items() if isinstance(v, list)) if isinstance(split, dict) else []
        raise InputError(f"has no subset {subset!r} (subsets: {', '.join(names)})", path=str(path), field=subset)
    return {str(i) for i in split[subset]}


__all__ = ["Located", "assistant_indices", "from_agentprocessbench", "load_split", "read_trajectories"]
