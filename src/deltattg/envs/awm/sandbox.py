"""An AWM scenario's episode sandbox: its SQLite database built from the released SQL, its FastAPI code patched to
that database and served as MCP over streamable HTTP in a subprocess, and its code-mode verifier run in another
subprocess with a time limit. All of it is the dataset's code: AWM environments are trusted code (docs/environments.md).

Following AWM (``awm/core/{db,sample,server,verify}.py``): tables' DDL, then their indexes, then every sample INSERT
one at a time, failures skipped and reported (:class:`BuildReport`); the working database is copied to ``initial.db`` before the episode;
each line of the code that calls ``create_engine(`` is rewritten to the episode's database, and the app gets
``FastApiMCP(app).mount_http()``. The code runs under :mod:`.run_server`, which imports it, mounts MCP on its ``app``
and serves that on a free loopback port itself (the code's own ``uvicorn.run`` never runs, however it is written).
The verifier ``verify_task_completion(initial_db_path, final_db_path, final_answer)`` runs under
:mod:`.run_verifier` with read-only copies of both databases, only the arguments its signature names, and
``timeout_s`` seconds (OpenEnv's AWM port allows 20 s).

Both children get a minimal environment (:func:`child_environment`: no API token of the caller's), run in their own
process group (ended as a whole: :func:`end_group`) and end with their parent (:func:`die_with_parent`, Linux: the
kernel signals them when the thread that started them ends, so start episodes from a long-lived thread); the servers
still running when the interpreter exits are ended by an ``atexit`` hook.

Every temporary folder (the template databases, each episode's) carries its process's PID in its name
(:func:`owned_temp_folder`): a process killed with SIGKILL cannot remove its own, so the next one to start removes
those of processes that are gone (:func:`remove_orphans`), never a live one's. ``deltattg collect`` turns SIGTERM
into Ctrl-C's exception (:func:`sigterm_as_interrupt`), so a terminated run cleans up as an interrupted one does.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import site
import socket
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

READY_TIMEOUT_S = 60.0
VERIFY_TIMEOUT_S = 20.0
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
KEPT_VARIABLES = ("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL")
OWNED = re.compile(r"deltattg-awm-pid([0-9]{1,10})-")  # the start of owned_prefix's names


def owned_prefix(kind: str, pid: int | None = None) -> str:
    """The name prefix of a temporary folder of the process ``pid`` (default: this one), holding ``kind``."""
    return f"deltattg-awm-pid{os.getpid() if pid is None else pid}-{kind}-"


def owned_temp_folder(kind: str) -> Path:
    """A new temporary folder whose name says this process owns it, so a later process can tell it is left over."""
    return Path(tempfile.mkdtemp(prefix=owned_prefix(kind)))


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (another user's counts: signal 0 is refused, not unanswered)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's, or no pid at all: not ours to judge
        return True
    return True


def remove_orphans(folder: Path) -> list[Path]:
    """Remove the temporary folders in ``folder`` whose owning process is gone (SIGKILL, a power cut) and return
    them; a live process's folders, and anything not named by :func:`owned_prefix`, stay."""
    removed = []
    for path in folder.iterdir():
        owner = OWNED.match(path.name)
        if owner and int(owner[1]) > 0 and not process_alive(int(owner[1])) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within: SIGTERM (what Slurm and Kubernetes send) raises ``KeyboardInterrupt``, so the command unwinds and
    removes its folders as on Ctrl-C. For a command line only (a library must not take an application's signals),
    and only where SIGTERM still has its default action in the main thread: an application's own handler stays."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@dataclass(frozen=True)
class BuildReport:
    """What building a scenario's database ran and skipped: each failed table or insert as ``FIELD: why``."""

    tables: int
    inserts: int
    failed_tables: tuple[str, ...] = ()  # db_schema.tables[i] (NAME): SQLite's reason
    failed_inserts: tuple[str, ...] = ()  # sample_data.tables[i].insert_statements[j]: SQLite's reason


def build_database(path: str | os.PathLike, db_schema: dict[str, Any], sample_data: Any) -> BuildReport:
    """Create the SQLite file ``path`` from a scenario's schema and sample data (AWM's order; failures skipped, and
    reported by the released field that holds them)."""
    Path(path).unlink(missing_ok=True)
    tables = db_schema.get("tables") or []
    failed_tables, failed_inserts = [], []
    statements = insert_statements(sample_data)
    with sqlite3.connect(path) as db:
        for i, table in enumerate(tables):
            try:
                for sql in [table["ddl"], *table.get("indexes", []), *table.get("examples", [])]:
                    db.execute(sql)
            except (sqlite3.Error, KeyError, TypeError) as error:
                why = f"no {error}" if isinstance(error, KeyError) else str(error)
                failed_tables.append(f"db_schema.tables[{i}] ({table.get('name', '?')}): {why}")
        db.execute("PRAGMA foreign_keys = ON")
        for field, sql in statements:
            try:
                db.execute(sql)
            except (sqlite3.Error, TypeError, ValueError) as error:
                failed_inserts.append(f"{field}: {error}")
    return BuildReport(len(tables), len(statements), tuple(failed_tables), tuple(failed_inserts))


def insert_statements(sample_data: Any) -> list[tuple[str, Any]]:
    """A scenario's sample INSERTs in order, each with the released field that holds it (``{"tables": [{
    "insert_statements": [...]}]}`` as released, or the list of tables, or of bare statements)."""
    groups, where = ((sample_data.get("tables", []), "sample_data.tables") if isinstance(sample_data, dict)
                     else (sample_data, "sample_data"))  # fmt: skip
    found: list[tuple[str, Any]] = []
    for i, group in enumerate(groups):
        if isinstance(group, dict):
            found += [(f"{where}[{i}].insert_statements[{j}]", sql)
                      for j, sql in enumerate(group.get("insert_statements", []))]  # fmt: skip
        else:
            found.append((f"{where}[{i}]", group))
    return found


def patched_code(code: str, db_path: str) -> str:
    """The scenario's FastAPI code bound to ``db_path`` (AWM's ``_generate_server_code``, whose ``uvicorn.run``
    rewrite :mod:`.run_server` replaces)."""
    lines = ["import warnings", 'warnings.filterwarnings("ignore", category=DeprecationWarning)']
    for line in code.split("\n"):
        if "create_engine(" in line:
            left = line.split("create_engine(")[0]
            line = f"{left}create_engine({f'sqlite:///{db_path}'!r}, connect_args={{'check_same_thread': False}})"
        lines.append(line)
    return "\n".join(lines)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def child_environment(**extra: str) -> dict[str, str]:
    """The environment of a scenario's server or verifier: only ``PATH``, ``HOME``, ``TMPDIR``, ``LANG`` and
    ``LC_ALL`` of the caller's, ``PYTHONPATH`` where deltattg is found (the caller's, and the folder holding
    deltattg unless that is a site-packages folder, which would then shadow the standard library) and ``extra``."""
    env = {key: os.environ[key] for key in KEPT_VARIABLES if key in os.environ}
    root = Path(__file__).resolve().parents[3]
    sites = {Path(folder).resolve() for folder in site.getsitepackages()}
    paths = [os.environ.get("PYTHONPATH", ""), "" if root in sites else str(root)]
    if any(paths):
        env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    return env | extra


def die_with_parent(parent: int, signum: int) -> None:
    """In a child: have the kernel send ``signum`` when the parent dies (Linux ``PR_SET_PDEATHSIG``), and exit at once
    when the parent ``parent`` is already gone (it died before the request)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signum)
    if os.getppid() != parent:
        os._exit(1)


def end_group(process: subprocess.Popen, grace_s: float = 5.0) -> None:
    """End ``process`` and the rest of its process group: SIGTERM, then SIGKILL after ``grace_s`` seconds (at once
    when ``grace_s`` is 0); nothing when it has already been reaped."""
    if process.poll() is not None:
        return
    try:
        if grace_s > 0:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=grace_s)
                return
            except subprocess.TimeoutExpired:
                pass
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:  # reaped meanwhile (a zombie leader still counts as in its group)
        pass
    process.wait()


_live: set[subprocess.Popen] = set()  # the servers running now


@atexit.register
def _end_live() -> None:
    """End the servers their environments did not close before the interpreter exits."""
    for process in list(_live):
        end_group(process)


def _tail(path: Path, chars: int = 400) -> str:
    """The last ``chars`` characters of a log file, on one line."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return " ".join(text[-chars:].split())


class ServerError(RuntimeError):
    """The scenario's server did not come up, or went away."""


class Server:
    """The patched code served by :mod:`.run_server` in its own process group on a free loopback port; ``stop()``
    ends the group."""

    def __init__(self, code: str, db_path: Path, folder: Path, *, ready_timeout_s: float = READY_TIMEOUT_S):
        self.port = free_port()
        self.log_path = folder / "server.log"
        script = folder / "server.py"
        script.write_text(patched_code(code, str(db_path)))
        env = child_environment(PORT=str(self.port), DATABASE_PATH=f"sqlite:///{db_path}")
        command = [sys.executable, "-m", "deltattg.envs.awm.run_server", str(script), str(self.port), str(os.getpid())]
        with open(self.log_path, "wb") as log:  # a file, not a pipe: a full pipe would block the server
            self.process = subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        _live.add(self.process)
        try:
            self._wait_ready(ready_timeout_s)
        except ServerError:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self) -> str:
        return _tail(self.log_path)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise ServerError(f"the scenario's server exited with status {self.process.returncode} before it "
                                  f"listened: {self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise ServerError(f"the scenario's server did not listen within {timeout_s:g} s: {self.log_tail()}")

    def stop(self) -> None:
        end_group(self.process)
        _live.discard(self.process)


def verify(code: str, initial_db: Path, final_db: Path, final_answer: str | None, folder: Path, *,
           timeout_s: float = VERIFY_TIMEOUT_S) -> dict[str, Any]:  # fmt: skip
    """The verifier's verdict: ``{"result": "complete" | "others", ...}``; ``"error"`` and the reason in
    ``"error"`` when it raised, exited, returned something else or ran out of time (then its whole process group is
    killed). The verdict comes back in a file of its own, so nothing the verifier prints can hide it."""
    folder, copies = folder.resolve(), []
    for source, name in ((initial_db, "verify_initial.db"), (final_db, "verify_final.db")):
        copy = folder / name
        shutil.copyfile(source, copy)
        os.chmod(copy, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        copies.append(str(copy))
    verdict_path, log_path = folder / "verdict.json", folder / "verifier.log"
    verdict_path.unlink(missing_ok=True)
    payload = {"code": code, "initial_db_path": copies[0], "final_db_path": copies[1], "final_answer": final_answer}
    command = [sys.executable, "-m", "deltattg.envs.awm.run_verifier", str(verdict_path), str(os.getpid())]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, cwd=folder, env=child_environment(), stdin=subprocess.PIPE, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        process.communicate(json.dumps(payload).encode(), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        end_group(process, grace_s=0)
        return {"result": "error", "error": f"the verifier ran past its {timeout_s:g} s limit"}
    try:
        verdict = json.loads(verdict_path.read_text())
    except (OSError, ValueError):
        return {"result": "error", "error": f"the verifier exited with status {process.returncode} without a "
                                            f"verdict: {_tail(log_path, 300)}"}
    return verdict if isinstance(verdict, dict) else {"result": "error", "error": "not a verdict"}
