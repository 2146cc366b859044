"""A blocking client of an MCP server over streamable HTTP (the ``mcp`` SDK), for environments whose ``step`` is
synchronous: each request opens a session, runs on its own event loop in a worker thread (so it also works when the
caller is inside a running loop, as verl's agent loop is) and is bounded by ``timeout_s``; a server that hangs costs
that long, one that is gone an error at once. Errors are :class:`MCPError` with one line of reason."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

TIMEOUT_S = 60.0  # AWM's tool-call timeout


class MCPError(RuntimeError):
    """The server could not be reached, timed out, or answered something that is not MCP."""


@dataclass(frozen=True)
class ToolResult:
    text: str
    is_error: bool


class MCPClient:
    def __init__(self, url: str, *, timeout_s: float = TIMEOUT_S):
        self.url = url
        self.timeout_s = timeout_s

    def list_tools(self) -> list[dict[str, Any]]:
        """``[{"name", "description", "inputSchema"}, ...]``."""

        async def request(session: Any) -> list[dict[str, Any]]:
            result = await session.list_tools()
            return [{"name": t.name, "description": t.description or "", "inputSchema": t.inputSchema or {}}
                    for t in result.tools]  # fmt: skip

        return self._run(request)

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        async def request(session: Any) -> ToolResult:
            result = await session.call_tool(name, arguments)
            text = "\n".join(getattr(part, "text", None) or str(part) for part in result.content)
            return ToolResult(text, bool(result.isError))

        return self._run(request)

    def _run(self, request: Callable[[Any], Awaitable[Any]]) -> Any:
        from mcp import ClientSession
        from mcp.client.streamable_http import streamablehttp_client

        async def session_request() -> Any:
            async with streamablehttp_client(self.url, timeout=self.timeout_s) as (read, write, _):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    return await request(session)

        outcome: dict[str, Any] = {}

        def work() -> None:
            try:
                outcome["value"] = asyncio.run(asyncio.wait_for(session_request(), self.timeout_s))
            except BaseException as exc:  # handed to the caller's thread
                outcome["error"] = exc

        worker = threading.Thread(target=work, name="deltattg-mcp", daemon=True)
        worker.start()
        worker.join(self.timeout_s + 5.0)
        if worker.is_alive() or isinstance(outcome.get("error"), (asyncio.TimeoutError, TimeoutError)):
            raise MCPError(f"no answer from {self.url} within {self.timeout_s:g} s")
        if "error" in outcome:
            raise MCPError(f"{self.url}: {_reason(outcome['error'])}")
        return outcome["value"]


def _reason(error: BaseException) -> str:
    """One line for an error, unwrapping the exception groups anyio raises."""
    while getattr(error, "exceptions", None):  # an exception group (the exceptiongroup backport on Python 3.10)
        error = error.exceptions[0]  # type: ignore[attr-defined]
    return f"{type(error).__name__}: {error}".splitlines()[0][:300]
