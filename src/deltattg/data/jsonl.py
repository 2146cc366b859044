"""JSONL reading with file:line errors, and atomic writing (never a half-written output file)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from deltattg.errors import InputError


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (non-finite numbers are not allowed)")


def loads_strict(text: str) -> Any:
    """``json.loads`` that refuses NaN / Infinity (Python's json accepts them by default)."""
    return json.loads(text, parse_constant=_reject_constant)


def read_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, record)`` for every non-blank line; a malformed line raises ``InputError``."""
    path = str(path)
    try:
        handle = open(path, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot open: {exc.strerror}", path=path) from exc
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = loads_strict(line)
            except ValueError as exc:
                raise InputError(f"malformed JSON: {exc}", path=path, line=number) from exc
            if not isinstance(record, dict):
                raise InputError(f"expected a JSON object, got {type(record).__name__}", path=path, line=number)
            yield number, record


def dumps(record: dict) -> str:
    """One JSONL line; refuses non-finite floats so we never write what we would refuse to read."""
    return json.dumps(record, ensure_ascii=False, allow_nan=False)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[IO[str]]:
    """Write to a temporary file next to ``path`` and move it into place only on success.

    On any exception the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            yield handle
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> int:
    """Write records atomically; return how many were written."""
    count = 0
    with atomic_output(path) as handle:
        for record in records:
            handle.write(dumps(record) + "\n")
            count += 1
    return count


def require_finite(value: float, field: str) -> float:
    if not math.isfinite(value):
        raise InputError(f"must be finite, got {value!r}", field=field)
    return value
