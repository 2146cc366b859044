"""BFCL v3 multi-turn behind the environment protocol: the ``bfcl-eval`` package's data, backends and checker, offline.

    env = BFCLEnv()
    task = env.tasks("base")[0]              # Task(id="multi_turn_base_0", split="base")
    observation = env.reset(task)            # the first user turn; env.system_prompt now lists the task's tools
    result = env.step("[cd(folder='document'), mkdir(dir_name='temp')]")   # observation: each call -> its result
    result = env.step("Done, the folder is there.")                         # no call: on to the next user turn
    ...                                      # after the last turn: done, reward 1.0 iff BFCL's checker passes

**Tasks.** The four multi-turn categories, one split each (``CATEGORIES``): ``base``, ``miss_func``, ``miss_param`` and
``long_context``, 200 entries each, as shipped in the ``bfcl-eval`` wheel (its files say ``BFCL_v4``; the multi-turn
sets are BFCL v3's). BFCL is a test set: there is no train split.

**Turn loop** (BFCL's ``inference_multi_turn_prompting``): each user turn is fed in order; a reply that decodes to
function calls is executed against the package's executable backends (file system, trading bot, travel, ...) and the
observation lists every call with its result; a reply without calls (prose, ``[]``, anything that does not decode)
ends the turn and the observation is the next user turn. A turn in which the model makes calls in more than
``MAXIMUM_STEP_LIMIT`` (20) steps is force-quit and the episode fails, as in BFCL. After the last turn the episode is
done and ``multi_turn_checker`` scores it: reward 1.0 and ``won`` iff it passes (the final observation is empty).
``done`` with reward 0 (``truncated``) after ``max_steps`` replies (ours, 50 by default; BFCL has no global cap).

**Action format** (``system_prompt``, BFCL's default prompting system prompt): a Python list of calls with literal
arguments, ``[func_name1(param=value, ...), func_name2(...)]``. Decoding follows BFCL's
``default_decode_execute_prompting`` (strip backticks, newlines and spaces; add missing brackets; parse as Python),
with two differences: positional arguments are kept (the ground truth uses them), and a call runs only if it names a
tool of the task and every argument is a literal (``ast.literal_eval``) — BFCL ``eval``s whatever it decoded, so an
unknown name or expression answers ``Error during execution: ...`` instead and changes nothing.

**Isolation.** BFCL caches backend instances in ``multi_turn_utils``'s module globals under ``model name + test id``.
Every episode gets its own model name (``deltattg_<uuid>``), so concurrent episodes of one task never share state,
and its instances (including the checker's) are deleted when the episode ends or the env is reset.

**Expert** (``expert_action``): the ground truth, one call per step (``[call]``; the rest of the turn's calls at once
on the last step BFCL allows), then ``END_OF_TURN`` to close the turn. A gold call counts as made once it has run, in
order, in the current turn, so the expert resumes after anyone's steps. **Mistakes** (``mistaken_action``, what
``expert:EPS`` plays with probability ε): the next gold call with a wrong argument or to the wrong tool, or the turn
closed early (:mod:`deltattg.envs.mistakes`).

**Branching.** Backend state is plain Python but lives in BFCL's globals, so branching replays the replies so far
(``deltattg.envs.base.replay``); a replay costs about one backend step per replayed call (well under a millisecond).
"""

from __future__ import annotations

import ast
import json
import random
import uuid
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any

from deltattg.envs.base import StepResult, Task
from deltattg.envs.mistakes import MISTAKES, other_tool, perturbed_arguments

try:
    from bfcl_eval.constants.category_mapping import VERSION_PREFIX
    from bfcl_eval.constants.default_prompts import (
        DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING,
        MAXIMUM_STEP_LIMIT,
        OUTPUT_FORMAT_MAPPING,
        PARAM_TYPE_MAPPING,
        PROMPT_STYLE_TEMPLATES,
        PROMPT_TEMPLATE_MAPPING,
    )
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
except ImportError as error:  # pragma: no cover - depends on the extra
    raise ImportError(
        "BFCL needs bfcl-eval without its dependencies: pip install --no-deps bfcl-eval && pip install mpmath"
    ) from error

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
MAX_STEPS = 50
END_OF_TURN = "I have completed your request."
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."  # BFCL's hint appended to listed tool docs


def _read_jsonl(relative: str) -> list[dict[str, Any]]:
    text = resources.files("bfcl_eval").joinpath("data", relative).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@cache
def function_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """The tool schemas of one backend class (``GorillaFileSystem``, ``TradingBot``, ...)."""
    return tuple(_read_jsonl(f"multi_turn_func_doc/{MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]}"))


def with_tools(entry: dict[str, Any]) -> dict[str, Any]:
    """The entry with ``function`` (tool docs listed in the system prompt, with BFCL's Python hint) and
    ``missed_function`` ({turn: docs} held out until that turn; miss_func only), as BFCL's
    ``populate_test_cases_with_predefined_functions`` and ``add_language_specific_hint_to_function_doc`` build them."""
    docs = {doc["name"]: doc for name in entry["involved_classes"] for doc in function_docs(name)}
    held_out = {turn: [docs[name] for name in names] for turn, names in entry.get("missed_function", {}).items()}
    hidden = {doc["name"] for turn_docs in held_out.values() for doc in turn_docs}
    listed = [
        {**doc, "description": doc["description"] + PYTHON_HINT} for name, doc in docs.items() if name not in hidden
    ]
    return {**entry, "function": listed, "missed_function": held_out}


@cache
def load_tasks(category: str) -> tuple[Task, ...]:
    """A multi-turn category's entries, each with its ground truth: ``data = {"entry": ..., "ground_truth": ...}``.
    Read from the wheel's data files directly: ``bfcl_eval.utils.load_dataset_entry`` gives the same entries, but
    importing it creates ``result/`` and ``score/`` folders next to the installed package."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL multi-turn category {category!r}; expected one of {CATEGORIES}")
    file_name = f"{VERSION_PREFIX}_multi_turn_{category}.json"
    answers = {answer["id"]: answer["ground_truth"] for answer in _read_jsonl(f"possible_answer/{file_name}")}
    return tuple(
        Task(id=entry["id"], split=category, data={"entry": with_tools(entry), "ground_truth": answers[entry["id"]]})
        for entry in _read_jsonl(file_name)
    )


def system_prompt(functions: Sequence[dict[str, Any]]) -> str:
    """BFCL's default system prompt for prompting models (``formulate_system_prompt`` with
    ``DEFAULT_SYSTEM_PROMPT_FORMAT``: Python call list, no tags, JSON tool docs, plain text, classic style), built
    from its templates (``bfcl_eval.model_handler.utils`` itself needs tree-sitter)."""
    style = PROMPT_STYLE_TEMPLATES["classic"]
    call_format = style["tool_call_no_tag"].format(
        output_format=OUTPUT_FORMAT_MAPPING["python"], param_types=PARAM_TYPE_MAPPING["python"]
    )
    return PROMPT_TEMPLATE_MAPPING["plaintext"].format(
        persona=style["persona"],
        task=style["task"],
        tool_call_format=call_format,
        multiturn_behavior=style["multiturn_behavior"],
        available_tools=style["available_tools"].format(format="json", functions=json.dumps(list(functions), indent=4)),
    )


def user_turn(entry: dict[str, Any], turn: int) -> str:
    """What the user says at ``turn``: its messages, or, for a miss_func turn that only adds tools, BFCL's prompt
    listing the added tools."""
    added = entry["missed_function"].get(str(turn))
    if added:
        return DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=added)
    return "\n\n".join(message["content"] for message in entry["question"][turn])


def parse_calls(reply: str) -> list[ast.Call]:
    """The calls in a reply, decoded as BFCL decodes a prompting model's output; [] when there are none (prose,
    ``[]``, a syntax error, a list holding anything but calls)."""
    body = reply.strip("`\n ")
    source = ("" if body.startswith("[") else "[") + body + ("" if body.endswith("]") else "]")
    try:
        parsed = ast.parse(source.strip().strip("'"), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    elements = parsed.elts if isinstance(parsed, ast.List) else [parsed]
    calls = [element for element in elements if isinstance(element, ast.Call)]
    return calls if len(calls) == len(elements) else []


def why_not_runnable(call: ast.Call, tools: frozenset[str]) -> str | None:
    """Why the call must not reach BFCL's ``eval``, or None: it names a tool and all its arguments are literals."""
    if not isinstance(call.func, ast.Name) or call.func.id not in tools:
        return f"{ast.unparse(call.func)} is not an available function"
    for argument in [*call.args, *(keyword.value for keyword in call.keywords)]:
        try:
            ast.literal_eval(argument)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return f"argument {ast.unparse(argument)} is not a literal"
    return None


def call_failed(result: str) -> bool:
    """Whether a call's result reports an error: BFCL's ``Error during execution: ...`` (an exception, or a call we
    refused to run) or a backend's ``{"error": ...}`` answer (e.g. ``cd`` into a missing folder)."""
    if result.startswith("Error during execution"):
        return True
    if not result.startswith("{"):
        return False
    try:
        parsed = json.loads(result)
    except ValueError:
        return False
    return isinstance(parsed, dict) and "error" in parsed


def tool_report(calls: Sequence[str], results: Sequence[str]) -> str:
    """The observation after a step with calls: one ``call -> result`` line per call."""
    return "\n".join(f"{call} -> {result}" for call, result in zip(calls, results, strict=True))


def normalized_call(source: str) -> str:
    """A call's source as ``ast.unparse`` writes it (how executed calls are kept), e.g. ``cd(folder="a")`` ->
    ``cd(folder='a')``."""
    return ast.unparse(ast.parse(source, mode="eval").body)


def matched_in_order(gold: Sequence[str], ran: Sequence[str]) -> int:
    """How many of ``gold`` (a prefix) appear in ``ran`` in order, other calls in between ignored."""
    done = 0
    for source in ran:
        if done < len(gold) and source == normalized_call(gold[done]):
            done += 1
    return done


def mistaken_argument(source: str, rng: random.Random) -> str | None:
    """``[call]`` with one literal argument changed (:func:`deltattg.envs.mistakes.perturbed_arguments`); None when
    none can be."""
    call = ast.parse(source, mode="eval").body
    slots = {**{str(i): node for i, node in enumerate(call.args)}, **{k.arg: k.value for k in call.keywords if k.arg}}
    values = {}
    for slot, node in slots.items():
        try:
            values[slot] = ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError):
            continue
    changed = perturbed_arguments(values, rng)
    if changed is None:
        return None
    slot = next(slot for slot in values if changed[slot] != values[slot])
    replacement = ast.parse(repr(changed[slot]), mode="eval").body
    if slot.isdigit():
        call.args[int(slot)] = replacement
    else:
        next(k for k in call.keywords if k.arg == slot).value = replacement
    return f"[{ast.unparse(call)}]"


def mistaken_tool(source: str, tools: Sequence[str], rng: random.Random) -> str | None:
    """``[call]`` sent to another tool of the task with the same arguments; None when the task has one tool."""
    call = ast.parse(source, mode="eval").body
    name = other_tool(ast.unparse(call.func), tools, rng)
    if name is None:
        return None
    call.func = ast.Name(id=name, ctx=ast.Load())
    return f"[{ast.unparse(call)}]"


class BFCLEnv:
    """BFCL v3 multi-turn entries (see the module doc). ``info`` of every step: ``won``, ``truncated``, ``turn`` (the
    user turn now in progress), ``calls`` and ``results`` (this step's, empty when it ended the turn), ``check``
    (the checker's verdict when the last turn ends, else None), ``admissible`` (None: any call may be made) and
    ``verified`` (a step with calls: True iff every call ran without error, :func:`call_failed`; a step without
    calls: None, nothing to verify)."""

    name = "bfcl"
    prompt_layout = "chat"  # later user turns must stay visible: the windowed prompt would drop them

    def __init__(self, *, max_steps: int = MAX_STEPS):
        self.max_steps = max_steps
        self._task: Task | None = None
        self._tools: frozenset[str] = frozenset()
        self._model_name = ""
        self._decoded: list[list[list[str]]] = []  # per turn, per step with calls: the executed calls (checker input)
        self._turn = 0
        self._turn_steps = 0  # steps with calls in the current turn
        self._steps = 0
        self._done = False

    @property
    def system_prompt(self) -> str:
        """BFCL's system prompt with the current task's tools (the format instructions alone before any reset)."""
        return system_prompt(self._task.data["entry"]["function"] if self._task else [])

    def tasks(self, split: str) -> Sequence[Task]:
        """A multi-turn category's 200 entries (``CATEGORIES``)."""
        return load_tasks(split)

    def describe(self) -> dict[str, Any]:
        """``{"name": "bfcl", "options": {"max_steps"}}`` (``Describable``): what ``envs.registry.rebuild`` needs,
        e.g. in verl's workers; the entries ship with ``bfcl-eval`` and each task carries its own."""
        return {"name": self.name, "options": {"max_steps": self.max_steps}}

    def reset(self, task: Task) -> str:
        self._release()
        entry = task.data["entry"]
        self._task = task
        self._tools = frozenset(doc["name"] for name in entry["involved_classes"] for doc in function_docs(name))
        self._model_name = f"deltattg_{uuid.uuid4().hex}"
        self._decoded = [[]]
        self._turn = self._turn_steps = self._steps = 0
        self._done = False
        return user_turn(entry, 0)

    def step(self, action: str) -> StepResult:
        self._live_task()
        self._steps += 1
        calls = parse_calls(action)
        info: dict[str, Any] = {"calls": [], "results": [], "check": None, "admissible": None, "verified": None}
        if calls:
            info["calls"], info["results"] = self._execute(calls)
            info["verified"] = not any(call_failed(result) for result in info["results"])
            observation, won = tool_report(info["calls"], info["results"]), False
            over = self._turn_steps > MAXIMUM_STEP_LIMIT  # BFCL force-quits the entry: it fails
        else:
            observation, over, won, info["check"] = self._end_turn()
        truncated = not over and self._steps >= self.max_steps
        self._done = over or truncated
        if self._done:
            self._release()
        info.update(won=won, truncated=truncated, turn=self._turn)
        return StepResult(observation, 1.0 if won else 0.0, self._done, info)

    def admissible_actions(self) -> None:
        return None

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools the actor has been shown so far: the system prompt's, plus those a miss_func turn has added
        (``deltattg.rollout.random_calls.HasToolCalls``: what the random policy calls)."""
        entry = self._live_task().data["entry"]
        added = [doc for turn, docs in entry["missed_function"].items() if int(turn) <= self._turn for doc in docs]
        return [*entry["function"], *added]

    def call_text(self, name: str, arguments: dict[str, Any]) -> str:
        """``[name(arg=value, ...)]``: one call in the action format, literal keyword arguments."""
        return f"[{name}({', '.join(f'{key}={value!r}' for key, value in arguments.items())})]"

    def plain_replies(self) -> list[str]:
        """The call-free reply: it closes the user turn."""
        return [END_OF_TURN]

    def expert_action(self) -> str:
        """The ground truth one call per step: the current turn's next pending call as ``[call]`` (all pending calls
        on the turn's last step before BFCL's force-quit), then ``END_OF_TURN``. A gold call is pending until it has
        run, in order, this turn (:func:`pending_calls`), so the expert picks up after other policies' steps."""
        pending = self._pending_calls()
        if not pending:
            return END_OF_TURN
        last_chance = self._turn_steps + 1 >= MAXIMUM_STEP_LIMIT
        return "[" + ", ".join(pending if last_chance else pending[:1]) + "]"

    def mistaken_action(self, rng: random.Random) -> str:
        """A plausible wrong step (``HasMistakes``; :mod:`deltattg.envs.mistakes`): the next gold call (the turn's
        last one once none is pending) with a wrong argument or sent to another tool, or the turn closed with calls
        pending. A turn without gold calls: a call to a random tool of the task."""
        pending = self._pending_calls()
        gold_calls = self._live_task().data["ground_truth"][self._turn]
        gold = pending[0] if pending else (gold_calls[-1] if gold_calls else None)
        if gold is None:
            return f"[{rng.choice(sorted(self._tools))}()]"
        mistakes = {"wrong_argument": mistaken_argument(gold, rng), "wrong_tool": mistaken_tool(gold, self._tools, rng),
                    "give_up": END_OF_TURN if pending else None}  # fmt: skip
        possible = [mistake for mistake in MISTAKES if mistakes[mistake] is not None]
        return mistakes[rng.choice(possible)] if possible else END_OF_TURN

    def reference_answer(self, task: Task) -> str:
        """The task's ground truth as text (``HasReferenceAnswer``, IGPO / A²TGPO): each user turn's calls in the
        action format, ``[call1, call2]``, one turn per line (turns without calls left out)."""
        return "\n".join("[" + ", ".join(calls) + "]" for calls in task.data["ground_truth"] if calls)

    def close(self) -> None:
        """Free this env's backend instances (done automatically when an episode ends and when the env is freed)."""
        self._release()

    __del__ = close

    def _live_task(self) -> Task:
        if self._task is None:
            raise RuntimeError("call reset(task) first")
        if self._done:
            raise RuntimeError("the episode is over; call reset()")
        return self._task

    def _pending_calls(self) -> list[str]:
        """The current turn's gold calls not yet run: those after the longest prefix of them found, in order, among
        the calls this turn has run."""
        gold = self._live_task().data["ground_truth"][self._turn]
        ran = [source for step in self._decoded[-1] for source in step]
        return gold[matched_in_order(gold, ran) :]

    def _execute(self, calls: Sequence[ast.Call]) -> tuple[list[str], list[str]]:
        """Run the step's runnable calls on this episode's backends; (each call's source, each call's result)."""
        task = self._live_task()
        entry = task.data["entry"]
        sources = [ast.unparse(call) for call in calls]
        problems = [why_not_runnable(call, self._tools) for call in calls]
        runnable = [source for source, problem in zip(sources, problems, strict=True) if problem is None]
        outputs, _ = multi_turn_utils.execute_multi_turn_func_call(
            func_call_list=runnable,
            initial_config=entry["initial_config"],
            involved_classes=entry["involved_classes"],
            model_name=self._model_name,
            test_entry_id=entry["id"],
            long_context=task.split == "long_context",
        )
        produced = iter(outputs)
        results = [next(produced) if problem is None else f"Error during execution: {problem}" for problem in problems]
        if runnable:
            self._decoded[-1].append(runnable)
        self._turn_steps += 1
        return sources, results

    def _end_turn(self) -> tuple[str, bool, bool, dict[str, Any] | None]:
        """Close the current user turn: (observation, episode over, won, checker verdict)."""
        task = self._live_task()
        entry = task.data["entry"]
        self._turn += 1
        self._turn_steps = 0
        if self._turn < len(entry["question"]):
            self._decoded.append([])
            return user_turn(entry, self._turn), False, False, None
        verdict = multi_turn_checker(
            self._decoded, task.data["ground_truth"], entry, f"multi_turn_{task.split}", self._model_name
        )
        check = {key: verdict.get(key) for key in ("valid", "error_type", "error_message")}
        return "", True, bool(verdict["valid"]), check

    def _release(self) -> None:
        """Delete this episode's backend instances from BFCL's module globals."""
        if not self._model_name:
            return
        space = vars(multi_turn_utils)
        for key in [key for key in space if key.startswith(f"{self._model_name}_")]:
            del space[key]
