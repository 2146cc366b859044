"""JSONL reading with file:line errors, and atomic writing (never a half-written output file)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
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


MAX_DEPTH = 100  # nesting levels of one record (real records have under 10); deeper is refused, never a RecursionError


def nesting_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` nests objects / arrays deeper than ``limit`` levels (checked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def _has_lone_surrogate(value: Any) -> bool:
    """Whether a string (key or value) of ``value`` holds a lone UTF-16 surrogate (JSON ``"\\ud800"``): valid JSON
    text, but not Unicode; it could not be written back as UTF-8."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def parse_line(raw: bytes) -> dict:
    """One JSONL line (bytes) as a JSON object; anything else raises ``InputError`` (no location: callers add it)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"not valid UTF-8 (byte {exc.start + 1}: {raw[exc.start:exc.start + 1]!r})") from None
    try:
        record = loads_strict(text)
    except RecursionError:
        raise InputError(f"malformed JSON: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise InputError(f"malformed JSON: {exc}") from None
    if not isinstance(record, dict):
        raise InputError(f"expected a JSON object, got {_json_type(record)}")
    if nesting_exceeds(record, MAX_DEPTH):
        raise InputError(f"malformed JSON: nested deeper than {MAX_DEPTH} levels")
    if ("\\ud" in text or "\\uD" in text) and _has_lone_surrogate(record):
        raise InputError("not valid Unicode: a string holds a lone surrogate escape (\\ud800-\\udfff)")
    return record


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict | InputError]]:
    """``(line_number, record)`` for every non-blank line, or ``(line_number, InputError)`` for a line that is not
    a UTF-8 JSON object (so callers may skip it); a file that cannot be opened raises ``InputError``."""
    path = str(path)
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise InputError(f"cannot open: {exc.strerror}", path=path) from exc
    with handle:
        for number, raw in enumerate(_lines(handle, path), start=1):
            if not raw.strip():
                continue
            try:
                yield number, parse_line(raw)
            except InputError as exc:
                yield number, exc.located(path=path, line=number)


def _lines(handle: IO[bytes], path: str) -> Iterator[bytes]:
    try:
        yield from handle
    except OSError as exc:  # e.g. a folder passed as the input file
        raise InputError(f"cannot read: {exc.strerror}", path=path) from None


def read_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, record)`` for every non-blank line; a malformed line raises ``InputError``."""
    for number, record in iter_jsonl(path):
        if isinstance(record, InputError):
            raise record
        yield number, record


LINE_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def dumps(record: dict) -> str:
    """One JSONL line; refuses non-finite floats so we never write what we would refuse to read. The characters
    Python's ``str.splitlines`` (and JavaScript) take for line breaks are written escaped, so one record stays one
    line for every reader (they can only occur inside JSON strings, where the escape means the same)."""
    return json.dumps(record, ensure_ascii=False, allow_nan=False).translate(LINE_BREAKS)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def output_mode(path: str | os.PathLike) -> int:
    """The permission bits an output written to ``path`` gets: those of the file it replaces, else the umask's default
    for a new file (0666 & ~umask), as ``open(path, "w")`` would give."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~_umask()


def check_output_file(path: str | os.PathLike) -> Path:
    """``path`` as a file that can be written: not a folder, and no file in the way of its folder (``InputError``)."""
    path = Path(path)
    if path.is_dir():
        raise InputError("is a folder: name a file to write", path=str(path))
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(f"cannot write: {parent} is not a folder", path=str(path))
            break
    return path


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and its ancestors that do not exist yet, deepest first (what ``mkdir(parents=True)`` creates)."""
    missing = []
    for path in [folder, *folder.parents]:
        if path.exists() or path.is_symlink():
            break
        missing.append(path)
    return missing


def cannot_write(path: str | os.PathLike, exc: OSError) -> InputError:
    """The ``InputError`` of an ``OSError`` met writing ``path``."""
    return InputError(f"cannot write: {exc.strerror or exc}", path=str(path))


def check_writable(path: str | os.PathLike, *, folder: bool = False) -> None:
    """Refuse (``InputError``) an output that could not be written: a file (``folder=False``: written in its parent
    folder) or a folder (written in itself), probed by creating and removing a temporary file in the nearest existing
    folder on its way. Nothing is left behind."""
    target = Path(path).expanduser()
    where = target if folder else target.parent
    missing = missing_folders(where)
    existing = missing[-1].parent if missing else where
    if not existing.is_dir():
        raise InputError(f"cannot write: {existing} is not a folder", path=str(path))
    try:
        fd, probe = tempfile.mkstemp(prefix=".deltattg-probe.", suffix=".tmp", dir=existing)
    except OSError as exc:
        raise cannot_write(path, exc) from None
    os.close(fd)
    os.unlink(probe)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, *, binary: bool = False) -> Iterator[IO[Any]]:
    """Write to a temporary file next to ``path`` and move it into place only on success.

    On any exception the temporary file is removed and ``path`` is left as it was. The file keeps the permission bits
    of the one it replaces (a new one gets 0666 & ~umask); a folder at ``path`` or an unwritable folder raise
    ``InputError`` before anything is written. The handle is UTF-8 text, or bytes with ``binary`` (parquet).
    """
    path = check_output_file(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise cannot_write(path, exc) from None
    try:
        with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8") as handle:
            yield handle
        os.chmod(tmp, output_mode(path))
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


def finite_or_null(value: Any) -> Any:
    """``value`` (JSON-like) with every non-finite float replaced by ``None``, so it is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(item) for item in value]
    return value


def write_json(path: str | os.PathLike, value: Any) -> None:
    """``value`` as one indented strict-JSON document at ``path``, written atomically; a non-finite number (an
    undefined statistic) is ``null`` (:func:`finite_or_null`)."""
    with atomic_output(path) as handle:
        json.dump(finite_or_null(value), handle, indent=2, allow_nan=False)
        handle.write("\n")
