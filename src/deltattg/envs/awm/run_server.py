"""Serve one AWM scenario as MCP on a loopback port: ``python -m deltattg.envs.awm.run_server SCRIPT PORT PARENT``,
started by :class:`deltattg.envs.awm.sandbox.Server` in the episode's folder (SCRIPT: the patched code there).

The code is imported as a module, so its ``if __name__ == "__main__":`` entry point does not run (a ``uvicorn.run``
outside one is skipped too); its ``app`` gets AWM's ``FastApiMCP(app).mount_http()`` and uvicorn serves it on
127.0.0.1:PORT, whatever host the code names. The process ends with its parent (SIGTERM,
:func:`~deltattg.envs.awm.sandbox.die_with_parent`) and then removes the episode's folder, which its parent no longer
can.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import sys
from pathlib import Path

from deltattg.envs.awm.sandbox import die_with_parent


def serve(script: Path, port: int) -> None:
    """Import ``script``, mount MCP on its ``app`` and serve it on ``127.0.0.1:port`` until stopped."""
    import uvicorn
    from fastapi_mcp import FastApiMCP

    spec = importlib.util.spec_from_file_location("awm_scenario", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the models' annotations through it
    run, uvicorn.run = uvicorn.run, lambda *args, **kwargs: None
    try:
        spec.loader.exec_module(module)
    finally:
        uvicorn.run = run
    app = getattr(module, "app", None)
    if app is None:
        raise SystemExit(f"{script.name}: the scenario's code defines no FastAPI `app`")
    FastApiMCP(app).mount_http()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=5)


def main(argv: list[str]) -> int:
    script, port, parent = Path(argv[1]), int(argv[2]), int(argv[3])
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # unwinds to the clean-up below
    die_with_parent(parent, signal.SIGTERM)
    try:
        serve(script, port)
    finally:
        if os.getppid() != parent:  # the parent died: nobody else removes the episode's folder
            shutil.rmtree(script.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
