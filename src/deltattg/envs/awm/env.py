"""Agent World Model scenarios behind the environment protocol (the paper's AWM domain).

    env = AWMEnv("awm-release/")                    # AWM's released JSONL files (deltattg awm-examples writes ours)
    task = env.tasks("train")[0]                    # Task(id="event_ticketing/0"); splits: train, test, all, SCENARIO
    observation = env.reset(task)                   # the task; a fresh database and MCP server for this episode
    env.step('<tool_call>{"name": "list_tools", "arguments": null}</tool_call>')
    env.step('<tool_call>{"name": "call_tool", "arguments": {"tool_name": "create_event", "arguments": "{...}"}}'
             '</tool_call>')
    env.step("I created the event.")                # no tool call: the final answer; reward = the verifier's verdict

**Protocol** (AWM's agent, ``awm/core/agent.py``): the system prompt offers two functions, ``list_tools`` and
``call_tool`` (``tool_name``, ``arguments`` as a JSON string or object), called as ``<tool_call>{"name": ...,
"arguments": ...}</tool_call>``; a scenario tool may also be called by its own name (``mcp_tool_`` prefix optional).
Only the first call of a reply runs. A reply without a tool call is the final answer and ends the episode; so does
reaching ``max_steps`` (Table 4: 20 turns; the final answer is then empty). ``list_tools`` answers AWM's listing of
the scenario's tools (:func:`tool_listing`). The reward is 1.0 when the scenario's code-mode verifier says ``complete``
about the database before and after the episode (and the final answer), else 0; the last step's ``info["verdict"]``
keeps the verdict (``complete``, ``others``, or ``error`` with its ``error`` text: a verifier that failed, which is
also logged as a warning and counted in :attr:`AWMEnv.verifier_errors`); ``won`` = complete. A malformed call, an
unknown function or a tool error is a failed step (``Error: ...``), as in AWM.

**Sandbox** (:mod:`deltattg.envs.awm.sandbox`): each episode gets its own copy of the scenario's database (built once
per scenario and process from the released SQL) and its own server process, started at its first step (so ``reset``,
and ``verl-tasks``, cost no server); the verifier runs in a subprocess with a time limit. A server that dies, stops
answering or never lists its tools (it listens but does not speak MCP) is a failed step that ends the episode (reward
0, ``info["error"]``), never a hang: every MCP request has ``tool_timeout_s``. Servers and verifiers end with the
process that started them, however it ends (on Linux; see the sandbox).

**Expert and mistakes** (only where ``deltattg_gold.jsonl`` gives a task's gold calls; AWM's release has none, and
:meth:`AWMEnv.check_expert` refuses such tasks up front): the first gold call not yet made successfully, in order,
then the gold answer; mistakes are those of :mod:`deltattg.envs.mistakes` (a wrong argument, another tool, giving up
with a final answer).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import random
import shutil
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deltattg.envs.awm.mcp_client import MCPClient, MCPError
from deltattg.envs.awm.release import FILES, OPTIONAL, Release, Scenario, read_release
from deltattg.envs.awm.sandbox import (VERIFY_TIMEOUT_S, BuildReport, Server, ServerError, build_database,
                                       owned_temp_folder, remove_orphans, verify)
from deltattg.envs.base import StepResult, Task
from deltattg.envs.mistakes import MISTAKES, other_tool, perturbed_arguments
from deltattg.envs.tool_calls import Malformed, embedded_tool_calls
from deltattg.errors import InputError

MAX_STEPS = 20  # Table 4's AWM turn limit
TOOL_TIMEOUT_S = 60.0
PREFIX = "mcp_tool_"
GIVE_UP = "I could not complete this task."
logger = logging.getLogger(__name__)

SYSTEM_PROMPT = """# MCP Tools

You are at a MCP environment. You need to call MCP tools to assist with the user query. At each step, you can only \
call one function. You have already logged in, and your user id is 1 if required for the MCP tool.

You are provided with TWO functions within <tools></tools> XML tags:
<tools>
1. list_tools
    - Description: List all available MCP tools for the current environment to help you finish the user task.
    - Arguments: None
    - Output: A list of MCP environment-specific tools and their descriptions

2. call_tool
    - Description: Call a MCP environment-specific tool
    - Arguments:
        - tool_name: str, required, the tool name in the list_tools output
        - arguments: str, required, the arguments for calling <tool_name>. You must pass a valid JSON string without \
any markdown fences or additional commentary.
    - Output: The result of the <tool_name> tool call
</tools>

You should always call list_tools function first to get the available tools, and should only call it once. You \
should always directly output the answer or summary at the final step instead of calling any function.

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call>"""  # AWM's demo agent prompt (awm/prompts.py), its examples left out

_templates: dict[tuple[str, str], Path] = {}
_templates_lock = threading.Lock()
_cache_dir: list[Path] = []


def _template(release: Release, scenario: Scenario) -> Path:
    """The scenario's freshly built database, once per process (episodes copy it)."""
    key = (release.folder, scenario.name)
    with _templates_lock:
        if key not in _templates:
            if not _cache_dir:  # this process's first: remove what killed ones left
                remove_orphans(Path(tempfile.gettempdir()))
                _cache_dir.append(owned_temp_folder("databases"))
                atexit.register(shutil.rmtree, _cache_dir[0], True)
            path = _cache_dir[0] / f"{len(_templates)}-{scenario.name}.db"
            for warning in build_warnings(build_database(path, scenario.db_schema, scenario.sample_data),
                                          scenario.name, release.folder):  # fmt: skip
                logger.warning("%s", warning)
            _templates[key] = path
        return _templates[key]


def build_warnings(report: BuildReport, scenario: str, folder: str, shown: int = 3) -> list[str]:
    """What building ``scenario``'s database skipped, one line per released file naming it, the scenario and the
    first ``shown`` failed statements by field: its tasks run on what did build (as in AWM), where a missing table
    would otherwise show only as failed verifiers."""
    lines = []
    for failed, total, what, name in ((report.failed_tables, report.tables, "tables did not build", FILES["db"]),
                                      (report.failed_inserts, report.inserts, "sample inserts failed",
                                       FILES["sample"])):  # fmt: skip
        if failed:
            more = f"; and {len(failed) - shown} more" if len(failed) > shown else ""
            lines.append(f"warning: {Path(folder) / name}: scenario {scenario}: {len(failed)} of {total} {what} "
                         f"({'; '.join(failed[:shown])}{more}); its tasks run without them")
    return lines


def tool_listing(tools: Sequence[dict[str, Any]]) -> str:
    """The scenario's tools as AWM's agent lists them (``format_tools_for_response``, ``awm/core/agent.py``): a
    count, then per tool ``mcp_tool_NAME``, its whole description line by line (fastapi-mcp's includes the response
    schemas and examples) and its parameters (:func:`parameter_lines`)."""
    shown = [tool for tool in tools if tool.get("name") != "list_tools"]
    lines = [f"Available MCP Tools ({len(shown)} tools):", "=" * 80, ""]
    for i, tool in enumerate(shown, start=1):
        name = tool.get("name", "")
        first, *more = (tool.get("description") or "").split("\n")
        lines += [f"{i}. {name if name.startswith(PREFIX) else PREFIX + name}", f"   Description: {first.strip()}"]
        lines += [f"   {line.strip()}" for line in more if line.strip()]
        schema = tool.get("inputSchema") or {}
        listed = parameter_lines(schema, 6)
        lines += ["   Parameters:", *listed] if listed else ["   Parameters: None"]
        lines.append("")
    return "\n".join(lines).strip()


def parameter_lines(schema: dict[str, Any], indent: int) -> list[str]:
    """A JSON schema's properties as AWM lists them (``format_input_schema``): ``- name: type (required)``, then
    its description, default, allowed values and, for an object, its own properties indented by 4 more."""
    pad, required, lines = " " * indent, schema.get("required") or [], []
    for name, spec in (schema.get("properties") or {}).items():
        kind = spec.get("type", "unknown")
        lines.append(f"{pad}- {name}: {kind} ({'required' if name in required else 'optional'})")
        if spec.get("description"):
            lines.append(f"{pad}  Description: {spec['description']}")
        if spec.get("default") is not None:
            lines.append(f"{pad}  Default: {spec['default']}")
        if spec.get("enum"):
            lines.append(f"{pad}  Allowed values: {spec['enum']}")
        if kind == "object" and spec.get("properties"):
            lines += [f"{pad}  Properties:", *parameter_lines(spec, indent + 4)]
    return lines


def parse_call(reply: str) -> tuple[str, dict[str, Any]] | None:
    """``(function, arguments)`` of a reply's first tool call (``list_tools``, or a scenario tool with its
    arguments: ``call_tool`` unwrapped), None for a final answer; ``Malformed`` for a call that is not one."""
    calls = embedded_tool_calls(reply)
    if not calls:
        return None
    name, arguments = calls[0]
    if name == "call_tool":
        name = arguments.get("tool_name")
        inner = arguments.get("arguments", {})
        if isinstance(inner, str):
            try:
                inner = json.loads(inner) if inner.strip() else {}
            except ValueError:
                raise Malformed(f"the arguments of {name} are not a JSON object") from None
        if not isinstance(name, str) or not name:
            raise Malformed("call_tool needs a tool_name")
        arguments = inner if isinstance(inner, dict) else {}
    return name.removeprefix(PREFIX), arguments


class AWMEnv:
    """AWM scenarios of a release folder (see the module doc)."""

    name = "awm"
    system_prompt = SYSTEM_PROMPT
    prompt_layout = "chat"  # the tool listing and earlier results must stay in view

    def __init__(self, data: str | os.PathLike, *, max_steps: int = MAX_STEPS, tool_timeout_s: float = TOOL_TIMEOUT_S,
                 verify_timeout_s: float = VERIFY_TIMEOUT_S):  # fmt: skip
        self.release = read_release(data)
        self.max_steps = max_steps
        self.tool_timeout_s = tool_timeout_s
        self.verify_timeout_s = verify_timeout_s
        self._scenario: Scenario | None = None
        self._task: Task | None = None
        self._server: Server | None = None
        self._client: MCPClient | None = None
        self._folder: Path | None = None
        self._tools: list[dict[str, Any]] = []
        self._unlisted: str | None = None  # why the server did not list its tools (the episode's first step fails)
        self.verifier_errors = 0  # episodes whose verifier failed (counted as not complete, and logged)
        self._made: list[tuple[str, dict[str, Any]]] = []  # successful calls, in order
        self._steps = 0
        self._done = False

    # protocol ------------------------------------------------------------------------------------------------
    def tasks(self, split: str) -> Sequence[Task]:
        scenarios = self.release.scenarios
        if split in ("train", "test", "all"):
            chosen = [s for s in scenarios.values() if split in ("all", s.split)]
        elif split in scenarios:
            chosen = [scenarios[split]]
        else:
            raise ValueError(f"no split {split!r}: the splits are train, test, all or a scenario "
                             f"({', '.join(sorted(scenarios)[:5])}{', ...' if len(scenarios) > 5 else ''})")
        return [Task(id=f"{s.name}/{i}", split=split, data={"scenario": s.name, "task_idx": i, "task": s.tasks[i]})
                for s in sorted(chosen, key=lambda s: s.name) for i in sorted(s.verifiers)]  # fmt: skip

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "options": {"data": self.release.folder, "max_steps": self.max_steps}}

    def admissible_actions(self) -> None:
        return None

    def reset(self, task: Task) -> str:
        self.close()
        scenario = self.release.scenarios.get(task.data.get("scenario", ""))
        index = task.data.get("task_idx")
        if scenario is None or not isinstance(index, int) or isinstance(index, bool) or index not in scenario.verifiers:
            raise ValueError(f"task {task.id} is not a playable task of {self.release.folder}")
        self._folder = owned_temp_folder(scenario.name)
        working = self._folder / "final.db"
        shutil.copyfile(_template(self.release, scenario), working)
        shutil.copyfile(working, self._folder / "initial.db")
        self._scenario, self._task = scenario, task
        self._made, self._steps, self._done = [], 0, False
        self._server, self._client, self._tools, self._unlisted = None, None, [], None  # started at the first step
        return task.data["task"]

    def _start(self) -> None:
        """The episode's server and its tool list, once per episode: an ``InputError`` naming the scenario when its
        code does not start; a server that starts but does not list its tools (it does not speak MCP, it died) is
        kept in ``_unlisted``, and the next step fails with it."""
        if self._client is not None:
            return
        if self._task is None or self._done:
            raise RuntimeError("call reset(task) before step()" if self._task is None else "the episode is over")
        try:
            self._server = Server(self._scenario.code, self._folder / "final.db", self._folder)
        except ServerError as error:  # the dataset's code does not run: bad input, named by scenario
            raise InputError(f"scenario {self._scenario.name}: {error}",
                             path=str(Path(self.release.folder) / FILES["envs"]), field="full_code") from None
        self._client = MCPClient(self._server.url, timeout_s=self.tool_timeout_s)
        try:
            self._tools = self._client.list_tools()
        except MCPError as error:
            self._unlisted = f"the scenario's server did not list its tools: {self._failure(error)}"

    def step(self, action: str) -> StepResult:
        self._start()
        self._steps += 1
        info: dict[str, Any] = {"admissible": None, "won": False, "truncated": False, "verdict": None}
        if self._unlisted is not None:  # nothing can run: a failed step that ends the episode
            info.update(kind="tool", verified=False, error=self._unlisted)
            return self._finish(None, info, f"Error: {self._unlisted}")
        try:
            call = parse_call(action)
        except Malformed as error:
            call, observation, info["verified"] = None, f"Error: {error}", False
            info["kind"] = "malformed"
        else:
            if call is None:
                return self._finish(action, info)
            observation, info["verified"] = self._run(*call, info)
        if info.get("error") or self._steps >= self.max_steps:
            info["truncated"] = not info.get("error")
            return self._finish(None, info, observation)
        return StepResult(observation, 0.0, False, info)

    def _run(self, name: str, arguments: dict[str, Any], info: dict[str, Any]) -> tuple[str, bool]:
        info.update(kind="tool", call={"name": name, "arguments": arguments})
        if name == "list_tools":
            return tool_listing(self._tools), True
        if name not in {t["name"] for t in self._tools}:
            return f"Error: Unknown tool '{name}'. Call list_tools to see the available tools.", False
        try:
            result = self._client.call_tool(name, arguments)
        except MCPError as error:
            info["error"] = self._failure(error)
            return f"Error: {info['error']}", False
        if not result.is_error:
            self._made.append((name, arguments))
        return (f"Error: {result.text}" if result.is_error else result.text), not result.is_error

    def _failure(self, error: MCPError) -> str:
        """Why an MCP request failed: the server's exit status and log when it is gone, else the request's error."""
        assert self._server is not None
        if self._server.alive():
            return str(error)
        return f"the scenario's server exited ({self._server.process.returncode}): {self._server.log_tail()}"

    def _finish(self, answer: str | None, info: dict[str, Any], observation: str = "") -> StepResult:
        self._done = True
        info["kind"] = info.get("kind", "answer")
        assert self._scenario is not None and self._task is not None and self._folder is not None
        if self._server is not None:
            self._server.stop()
        self._client = None
        code = self._scenario.verifiers[self._task.data["task_idx"]]
        verdict = verify(code, self._folder / "initial.db", self._folder / "final.db", answer, self._folder,
                         timeout_s=self.verify_timeout_s)  # fmt: skip
        info["verdict"] = verdict
        info["won"] = verdict.get("result") == "complete"
        if verdict.get("result") == "error":
            self.verifier_errors += 1
            info.setdefault("error", f"the task's verifier failed: {verdict.get('error')}")  # kept in the record
            logger.warning("AWM task %s: its verifier failed (counted as not complete): %s", self._task.id,
                           verdict.get("error"))  # fmt: skip
        return StepResult(observation, float(info["won"]), True, info)

    def close(self) -> None:
        """Stop the episode's server and remove its folder (``reset`` does it for the previous episode)."""
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing more to do
            pass

    # expert, mistakes, tools for the random policy -------------------------------------------------------------
    def _gold_of(self, task: Task) -> dict[str, Any] | None:
        """The task's gold calls and answer (``deltattg_gold.jsonl``), None without."""
        scenario = self.release.scenarios.get(task.data.get("scenario", ""))
        return scenario.gold.get(task.data.get("task_idx")) if scenario else None

    def check_expert(self, tasks: Sequence[Task]) -> None:
        """Refuse (``ValueError`` naming the file) tasks the expert cannot play: those without gold calls in the
        release's ``deltattg_gold.jsonl``, which AWM's own releases do not have."""
        missing = [task.id for task in tasks if self._gold_of(task) is None]
        if missing:
            path = Path(self.release.folder) / OPTIONAL["gold"]
            why = (f"has none for {', '.join(missing[:3])}{' and more' if len(missing) > 3 else ''}" if path.is_file()
                   else "is missing (AWM's releases have none)")  # fmt: skip
            raise ValueError(f"the expert plays each task's gold calls from {path}, which {why}: use another policy "
                             "(random, lm:MODEL, ...)")

    def _gold(self) -> dict[str, Any]:
        gold = self._gold_of(self._task) if self._task else None
        if gold is None:
            raise ValueError(f"no gold calls for {self._task.id if self._task else 'this task'} "
                             "(deltattg_gold.jsonl): the expert cannot play it")
        return gold

    def _next_gold(self) -> dict[str, Any] | None:
        calls, done = self._gold()["calls"], 0
        for made in self._made:
            if done < len(calls) and made == (calls[done]["tool_name"], calls[done]["arguments"]):
                done += 1
        return calls[done] if done < len(calls) else None

    def expert_action(self) -> str:
        call = self._next_gold()
        return self.call_text(call["tool_name"], call["arguments"]) if call else self._gold()["answer"]

    def mistaken_action(self, rng: random.Random) -> str:
        self._start()
        call = self._next_gold()
        if call is None:
            return GIVE_UP
        arguments = perturbed_arguments(call["arguments"], rng)
        tool = other_tool(call["tool_name"], [t["name"] for t in self._tools], rng)
        options = {"wrong_argument": None if arguments is None else self.call_text(call["tool_name"], arguments),
                   "wrong_tool": None if tool is None else self.call_text(tool, call["arguments"]),
                   "give_up": GIVE_UP}  # fmt: skip
        return options[rng.choice([m for m in MISTAKES if options[m] is not None])]

    def reference_answer(self, task: Task) -> str | None:
        gold = self._gold_of(task)
        if gold is None:
            return None
        return "\n".join(self.call_text(call["tool_name"], call["arguments"]) for call in gold["calls"])

    def tool_schemas(self) -> list[dict[str, Any]]:
        self._start()
        return [{"name": t["name"], "parameters": t.get("inputSchema") or {}} for t in self._tools]

    def call_text(self, name: str, arguments: dict[str, Any]) -> str:
        call = {"name": "call_tool", "arguments": {"tool_name": name, "arguments": json.dumps(arguments)}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"

    def plain_replies(self) -> list[str]:
        return [GIVE_UP]
