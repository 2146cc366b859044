"""Outputs written by one run at a time (whether a target can be written at all is
:func:`deltattg.data.jsonl.check_writable`, asked before any work).

* :func:`held_folder` holds an output folder for one process (``evaluate``, ``bench_train``): ``fcntl.flock`` on
  ``FOLDER/.evaluate.lock``, taken without waiting. A second run on the same folder is refused (``InputError`` naming
  the holder's pid) instead of appending its episodes to the first one's.
* :func:`held_file` does the same for one output file that a run appends to (a label file): the lock is
  ``.NAME.lock`` beside it.

The operating system releases a flock when its process ends, however it ends, so the lock file a killed run leaves
behind blocks nobody.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from deltattg.data.jsonl import cannot_write, missing_folders
from deltattg.errors import InputError

LOCK_FILE = ".evaluate.lock"


def _holder(lock: Path) -> str:
    """The pid the holder of ``lock`` wrote in it, as text (``unknown`` when unreadable or not yet written)."""
    try:
        text = lock.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        text = ""
    return text if text.isdigit() else "unknown"


def _lock(lock: Path, folder: Path, what: str = "folder") -> int:
    """An open descriptor of ``lock`` holding its exclusive flock, our pid written in it. Retries when the file was
    replaced between opening and locking it (a holder removes it on leaving), so the lock held is always the file
    now at ``lock``. Another holder, or a file that cannot be opened, raise ``InputError``."""
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise cannot_write(folder, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise cannot_write(folder, exc) from None
            raise InputError(f"another run (pid {_holder(lock)}) is writing to this {what}: wait for it to end, or "
                             "use another --out", path=str(folder)) from None  # fmt: skip
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock))
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)


@contextlib.contextmanager
def held_folder(folder: str | os.PathLike) -> Iterator[Path]:
    """Hold ``folder`` (created with its missing parents) for this process until the block ends (see the module
    doc); ``InputError`` when it cannot be created or written, or another process holds it. On leaving, the lock
    file is removed, and so are the folders this call created if nothing else was written in them (a run refused or
    failed before its first episode leaves no trace)."""
    folder = Path(folder).expanduser()
    with _holding(folder / LOCK_FILE, folder, "folder"):
        yield folder


@contextlib.contextmanager
def held_file(path: str | os.PathLike) -> Iterator[Path]:
    """Hold the output file ``path`` for this process until the block ends: the flock of ``.NAME.lock`` beside it
    (its folder created with its missing parents); ``InputError`` naming the file when another process holds it. As
    :func:`held_folder`, the lock file and the folders this call created and left empty are removed on leaving."""
    path = Path(path).expanduser()
    with _holding(path.with_name(f".{path.name}.lock"), path, "file"):
        yield path


@contextlib.contextmanager
def _holding(lock: Path, target: Path, what: str) -> Iterator[None]:
    """Hold ``lock`` (its folder created with its missing parents) for ``target`` until the block ends."""
    created = missing_folders(lock.parent)
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _remove_empty(created)
        raise InputError(f"cannot create the folder: {exc.strerror or exc}", path=str(target)) from None
    try:
        fd = _lock(lock, target, what)
    except InputError:
        _remove_empty(created)
        raise
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
        os.close(fd)
        _remove_empty(created)


def _remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) while they are empty."""
    for path in folders:
        try:
            path.rmdir()
        except OSError:
            return
