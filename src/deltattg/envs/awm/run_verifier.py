"""Run one AWM code-mode verifier: a JSON payload on stdin (``code``, ``initial_db_path``, ``final_db_path``,
``final_answer``), one JSON verdict on stdout. Started by :func:`deltattg.envs.awm.sandbox.verify` in its own process,
under a time limit; the verifier is the dataset's code (AWM's ``_call_verifier_func``: only the arguments its
signature names; a result that is not ``{"result": "complete" | "others"}`` is an error)."""

from __future__ import annotations

import inspect
import json
import re
import sys
from typing import Any

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


def main() -> int:
    payload = json.loads(sys.stdin.read())
    try:
        namespace: dict[str, Any] = {}
        exec(compile(payload["code"], "<verifier>", "exec"), namespace)  # noqa: S102 - trusted dataset code
        result = call(namespace[function_name(payload["code"])], payload["initial_db_path"],
                      payload["final_db_path"], payload.get("final_answer"))  # fmt: skip
    except Exception as exc:  # the verifier's own failure is a verdict, not a crash of ours
        verdict: dict[str, Any] = {"result": "error", "error": f"{type(exc).__name__}: {exc}"[:500]}
    else:
        if isinstance(result, dict) and result.get("result") in ("complete", "others"):
            verdict = {"result": result["result"]}
        elif isinstance(result, dict) and "result" in result:
            verdict = {"result": "others", "raw": str(result["result"])[:200]}
        else:
            verdict = {"result": "error", "error": f"the verifier returned {type(result).__name__}, not a dict with "
                                                   "'result'"}
    print(json.dumps(verdict))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
