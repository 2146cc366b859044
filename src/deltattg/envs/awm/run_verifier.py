"""Run one AWM code-mode verifier: ``python -m deltattg.envs.awm.run_verifier VERDICT PARENT`` reads a JSON payload
on stdin (``code``, ``initial_db_path``, ``final_db_path``, ``final_answer``) and writes one JSON verdict to the file
VERDICT (not stdout, which is the verifier's own). Started by :func:`deltattg.envs.awm.sandbox.verify` in its own
process group, under a time limit, and killed with its parent. The verifier is the dataset's code, run as AWM's
``execute_code_verifier`` does: ``sqlite3``, ``json``, ``os`` and ``re`` preloaded, only the arguments its signature
names (``_call_verifier_func``); a result that is not a dict with ``result`` is an error, one other than
``complete`` counts as ``others``."""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

from deltattg.envs.awm.sandbox import die_with_parent

NAMES = ("verify_task_completion", "verify_task")


def function_name(code: str) -> str:
    """The verifier's name: the first ``def verify_...(`` in the code (AWM's rule), else ``verify_task_completion``."""
    match = re.search(r"^def (verify_\w+)\s*\(", code, re.M)
    return match.group(1) if match else NAMES[0]


def call(func: Any, initial: str, final: str, answer: str | None) -> Any:
    params = inspect.signature(func).parameters
    given = {"initial_db_path": initial, "final_db_path": final, "final_answer": answer or ""}
    kwargs = {k: v for k, v in given.items() if k in params}
    if not kwargs and len(params) >= 2:
        return func(*[initial, final, answer or ""][: min(len(params), 3)])
    return func(**kwargs)


def judge(payload: dict[str, Any]) -> dict[str, Any]:
    """The verdict of the payload's verifier: ``{"result": "complete" | "others"}`` (``raw``: a result of another
    name), or ``{"result": "error", "error": why}`` when it did not compile, raised or exited (``sys.exit``)."""
    namespace: dict[str, Any] = {"sqlite3": sqlite3, "json": json, "os": os, "re": re}
    try:
        exec(compile(payload["code"], "<verifier>", "exec"), namespace)  # noqa: S102 - trusted dataset code
        result = call(namespace[function_name(payload["code"])], payload["initial_db_path"],
                      payload["final_db_path"], payload.get("final_answer"))  # fmt: skip
    except BaseException as exc:  # noqa: BLE001 - the verifier's own failure (sys.exit too) is a verdict
        return {"result": "error", "error": f"{type(exc).__name__}: {exc}"[:500]}
    if isinstance(result, dict) and result.get("result") in ("complete", "others"):
        return {"result": result["result"]}
    if isinstance(result, dict) and "result" in result:
        return {"result": "others", "raw": str(result["result"])[:200]}
    return {"result": "error", "error": f"the verifier returned {type(result).__name__}, not a dict with 'result'"}


def main(argv: list[str]) -> int:
    verdict_path, parent = Path(argv[1]), int(argv[2])
    die_with_parent(parent, signal.SIGKILL)
    verdict = judge(json.loads(sys.stdin.read()))
    verdict_path.write_text(json.dumps(verdict))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
