"""An AWM scenario's episode sandbox: its SQLite database built from the released SQL, its FastAPI code patched to
that database and served as MCP over streamable HTTP in a subprocess, and its code-mode verifier run in another
subprocess with a time limit. All of it is the dataset's code: AWM environments are trusted code (README).

Following AWM (``awm/core/{db,sample,server,verify}.py``): tables' DDL, then their indexes, then every sample INSERT
one at a time, failures counted and skipped; the working database is copied to ``initial.db`` before the episode;
each line of the code that calls ``create_engine(`` is rewritten to the episode's database, and
``FastApiMCP(app).mount_http()`` goes before ``uvicorn.run(app, ...)``, which listens on a free loopback port. The
verifier ``verify_task_completion(initial_db_path, final_db_path, final_answer)`` gets read-only copies of both
databases, only the arguments its signature names, and ``timeout_s`` seconds (OpenEnv's AWM port allows 20 s).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

READY_TIMEOUT_S = 60.0
VERIFY_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class BuildReport:
    tables: int
    failed_tables: int
    inserts: int
    failed_inserts: int


def build_database(path: str | os.PathLike, db_schema: dict[str, Any], sample_data: Any) -> BuildReport:
    """Create the SQLite file ``path`` from a scenario's schema and sample data (AWM's order; failures skipped)."""
    Path(path).unlink(missing_ok=True)
    tables = db_schema.get("tables") or []
    failed_tables = inserts = failed_inserts = 0
    with sqlite3.connect(path) as db:
        for table in tables:
            try:
                for sql in [table["ddl"], *table.get("indexes", []), *table.get("examples", [])]:
                    db.execute(sql)
            except (sqlite3.Error, KeyError, TypeError):
                failed_tables += 1
        db.execute("PRAGMA foreign_keys = ON")
        groups = sample_data.get("tables", []) if isinstance(sample_data, dict) else sample_data
        for group in groups:
            statements = group.get("insert_statements", []) if isinstance(group, dict) else [group]
            for sql in statements:
                inserts += 1
                try:
                    db.execute(sql)
                except (sqlite3.Error, TypeError, ValueError):
                    failed_inserts += 1
    return BuildReport(len(tables), failed_tables, inserts, failed_inserts)


def patched_code(code: str, db_path: str) -> str:
    """The scenario's FastAPI code bound to ``db_path`` and mounted as MCP (AWM's ``_generate_server_code``)."""
    lines = ["import os", "import warnings", 'warnings.filterwarnings("ignore", category=DeprecationWarning)']
    for line in code.split("\n"):
        if "create_engine(" in line:
            left = line.split("create_engine(")[0]
            line = f"{left}create_engine({f'sqlite:///{db_path}'!r}, connect_args={{'check_same_thread': False}})"
        if "uvicorn.run(app" in line:
            indent = line[: len(line) - len(line.lstrip())]
            lines += [f"{indent}from fastapi_mcp import FastApiMCP", f"{indent}FastApiMCP(app).mount_http()"]
            line = f"{indent}uvicorn.run(app, host='127.0.0.1', port=int(os.environ['PORT']), log_level='warning')"
        lines.append(line)
    return "\n".join(lines)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerError(RuntimeError):
    """The scenario's server did not come up, or went away."""


class Server:
    """The patched code running in its own process group on a free loopback port; ``stop()`` ends the group."""

    def __init__(self, code: str, db_path: Path, folder: Path, *, ready_timeout_s: float = READY_TIMEOUT_S):
        self.port = free_port()
        self.log_path = folder / "server.log"
        script = folder / "server.py"
        script.write_text(patched_code(code, str(db_path)))
        env = {**os.environ, "PORT": str(self.port), "HOST": "127.0.0.1", "DATABASE_PATH": f"sqlite:///{db_path}"}
        with open(self.log_path, "wb") as log:  # a file, not a pipe: a full pipe would block the server
            self.process = subprocess.Popen([sys.executable, str(script)], cwd=folder, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)  # fmt: skip
        self._wait_ready(ready_timeout_s)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, chars: int = 400) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return " ".join(text[-chars:].split())

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
        self.stop()
        raise ServerError(f"the scenario's server did not listen within {timeout_s:g} s: {self.log_tail()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.process.wait()


def verify(code: str, initial_db: Path, final_db: Path, final_answer: str | None, folder: Path, *,
           timeout_s: float = VERIFY_TIMEOUT_S) -> dict[str, Any]:  # fmt: skip
    """The verifier's verdict: ``{"result": "complete" | "others", ...}``; ``"error"`` and the reason in
    ``"error"`` when it raised, returned something else, or ran out of time."""
    copies = []
    for source, name in ((initial_db, "verify_initial.db"), (final_db, "verify_final.db")):
        copy = folder / name
        shutil.copyfile(source, copy)
        os.chmod(copy, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        copies.append(str(copy))
    payload = {"code": code, "initial_db_path": copies[0], "final_db_path": copies[1], "final_answer": final_answer}
    try:
        done = subprocess.run([sys.executable, "-m", "deltattg.envs.awm.run_verifier"], input=json.dumps(payload),
                              capture_output=True, text=True, timeout=timeout_s, cwd=folder)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"result": "error", "error": f"the verifier ran past its {timeout_s:g} s limit"}
    try:
        verdict = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"result": "error", "error": f"the verifier printed no verdict: {' '.join(done.stderr.split())[-300:]}"}
    return verdict if isinstance(verdict, dict) else {"result": "error", "error": "not a verdict"}
