"""Where trajectories come from: our JSONL format, or AgentProcessBench records (converted on the fly)."""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from deltattg.data.jsonl import iter_jsonl
from deltattg.data.trajectory import Trajectory, assistant_indices, parse_trajectory
from deltattg.errors import InputError

T = TypeVar("T")


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


@dataclass
class TrajectoryFile:
    """What :func:`read_trajectory_file` read: the valid trajectories, and how many records it skipped as invalid and
    as later copies of an id already read (both 0 unless ``skip_invalid``)."""

    items: list[Located]
    invalid: int = 0
    duplicates: int = 0

    @property
    def skipped(self) -> int:
        return self.invalid + self.duplicates


def read_trajectory_file(path: str | os.PathLike, *, skip_invalid: bool = False) -> TrajectoryFile:
    """Read and validate every trajectory of a JSONL file (ours or AgentProcessBench).

    Without ``skip_invalid`` the first bad record raises ``InputError`` with file, line and field: a line that is not
    UTF-8 JSON, not an object, not a valid trajectory, or a trajectory whose ``id`` an earlier line already has
    (duplicates would skew the group statistics). With it, those records are skipped and counted (the first copy of
    an id is kept). A file with no records, or none left after skipping, is an error either way.
    """
    path = str(path)
    out = TrajectoryFile([])
    seen: dict[str, int] = {}
    for line, record in iter_jsonl(path):
        try:
            if isinstance(record, InputError):
                raise record
            if is_agentprocessbench(record):
                record = from_agentprocessbench(record)
            trajectory = parse_trajectory(record)
        except InputError as exc:
            if not skip_invalid:
                raise exc.located(path=path, line=line) from None
            out.invalid += 1
            continue
        if trajectory.id in seen:
            if not skip_invalid:
                raise InputError(f"duplicate trajectory id {trajectory.id!r} (first on line {seen[trajectory.id]})",
                                 path=path, line=line, field="id")
            out.duplicates += 1
            continue
        seen[trajectory.id] = line
        out.items.append(Located(path, line, trajectory, record))
    if not out.items:
        if out.skipped:
            raise InputError(f"no valid records ({out.invalid} invalid, {out.duplicates} duplicate ids skipped)",
                             path=path)
        raise InputError("no records: the file is empty", path=path)
    return out


def read_trajectories(path: str | os.PathLike, *, skip_invalid: bool = False) -> tuple[list[Located], int]:
    """:func:`read_trajectory_file` as ``(trajectories, records skipped)``."""
    read = read_trajectory_file(path, skip_invalid=skip_invalid)
    return read.items, read.skipped


def load_split(path: str | os.PathLike, subset: str) -> set[str]:
    """The trajectory ids of one subset of a split file (``{"train": [ids], "val": [...], "test": [...]}``)."""
    from deltattg.data.jsonl import loads_strict

    try:
        with open(path, encoding="utf-8") as handle:
            split = loads_strict(handle.read())
    except OSError as exc:
        raise InputError(f"cannot open: {exc.strerror}", path=str(path)) from exc
    except RecursionError:
        raise InputError("malformed JSON: nested too deeply", path=str(path)) from None
    except ValueError as exc:
        raise InputError(f"malformed JSON: {exc}", path=str(path)) from None
    if not isinstance(split, dict) or subset not in split or not isinstance(split[subset], list):
        names = sorted(k for k, v in split.items() if isinstance(v, list)) if isinstance(split, dict) else []
        raise InputError(f"has no subset {subset!r} (subsets: {', '.join(names)})", path=str(path), field=subset)
    return {str(i) for i in split[subset]}


__all__ = ["Located", "TrajectoryFile", "assistant_indices", "from_agentprocessbench", "load_split", "read_trajectories",
           "read_trajectory_file"]


def held_out_by_hash(key: str, share: float) -> bool:
    """Whether ``key`` falls in a fixed ``share`` of all keys, by its SHA-256 (a split that depends on nothing but the
    key: not on file order, seeds or the other keys)."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < share


def split_by_task(items: Sequence[T], heldout_fraction: float, seed: int) -> tuple[list[T], list[T]]:
    """(kept, held out): a random ``heldout_fraction`` of the tasks (groups), with all their trajectories, held out.
    ``items`` are trajectories or ``Located`` records."""
    def group(item: Any) -> str:
        return (item.trajectory if isinstance(item, Located) else item).group

    groups = sorted({group(item) for item in items})
    random.Random(seed).shuffle(groups)
    heldout = set(groups[: round(heldout_fraction * len(groups))])
    return [i for i in items if group(i) not in heldout], [i for i in items if group(i) in heldout]
