"""ALFWorld (text) behind the environment protocol: the official PDDL game files, played by TextWorld.

    env = ALFWorldEnv()                       # game files from $ALFWORLD_DATA (or ALFWorldEnv(data_dir=...))
    task = env.tasks("valid_seen")[0]         # Task(id="valid_seen/look_at_obj_in_light-.../trial_...", ...)
    observation = env.reset(task)             # "-= Welcome to TextWorld, ALFRED! =- ... Your task is to: ..."
    result = env.step("<think>...</think><action>go to desk 1</action>")
    result.info                               # won, truncated, valid, action, admissible

**Data.** Game files in the official ``json_2.1.1`` layout, ``<root>/json_2.1.1/<split>/<task>/<trial>/game.tw-pddl``
(``<root>`` is ``data_dir`` or ``$ALFWORLD_DATA``; a ``data_dir`` that is the ``json_2.1.1`` folder itself works too).
Splits: ``train`` (3,553 games), ``valid_seen`` (140), ``valid_unseen`` (134) and ``valid_train`` (200). The task type
is the task folder's prefix, one of ``TASK_TYPES``. The games need no ``traj_data.json``: each is loaded straight into
TextWorld's PDDL backend with ALFWorld's ``AlfredDemangler`` (object names such as "desk 1"), as
``textworld.gym.register_game(path, EnvInfos(...), wrappers=[AlfredDemangler()])`` does, minus the gym layer.

**Episodes.** Reward 1 and ``done`` on the step that wins; ``done`` with reward 0 (``truncated``) after ``max_steps``
steps (50, as in ALFWorld and verl-agent). Anything that is not an admissible command answers "Nothing happens."
and still costs a step. ``admissible_actions()`` lists the commands of the current state (~25), ``goal`` is the task
text and ``observation`` the latest feedback: what a prompt with a history window needs (the window itself belongs to
the rollout engine).

**Actions** (``parse_action``): the text inside the last ``<action>...</action>`` of the reply (verl-agent's format,
see ``SYSTEM_PROMPT``), or the whole reply when it has no such tag; lower-cased, whitespace collapsed.

**Experts.** ``walkthrough()`` is the game file's recorded winning command sequence. ``expert_action()`` is the next
command of the current plan — the walkthrough from the start — while the episode has followed that plan, else the
first command of a fresh fast-downward plan from the current state (``plan_from_here``, what TextWorld reports as
``policy_commands``), which then becomes the plan, so ε-noisy experts recover after off-plan actions. Planning runs
only off the plan and costs 0.01-0.5 s CPU on most games but up to ~15 s on some large ones (measured on valid_seen),
which is why the env does not request ``policy_commands`` (TextWorld would re-plan at every step). After a few
detours in ``pick_two_obj_and_place`` games the search can run for many minutes, so each plan runs in a forked copy
of the process with ``plan_seconds`` (default 10 s); when that runs out the expert has no action for the state and
a noisy expert acts at random (``NoisyExpertPolicy``).

**Cost and branching.** One env instance holds one TextWorld game, with its own copy of the fast-downward library
(TextWorld loads one per game instance, so concurrent envs never share planner state). Measured CPU time on 2 shared
cores (valid_unseen): a reset on a new game (load + reset) 0.5-3.8 s, a reset of the game already loaded 0.2-1.5 s (the
PDDL problem is re-translated; ``textworld.gym`` would reload the game every time), a step 50-130 ms. The planner
state lives in C and cannot be copied, so there is no ``snapshot()``: branching for test-time guidance (E.5) replays the
actions so far (``deltattg.envs.base.replay``), one reset plus one step per replayed action — re-use one env per task
for the branches so that the game stays loaded.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deltattg.envs.base import StepResult, Task

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
SPLITS = ("train", "valid_seen", "valid_unseen", "valid_train")
DATA_ENV_VAR = "ALFWORLD_DATA"
LAYOUT = "json_2.1.1"
GAME_FILE = "game.tw-pddl"
MAX_STEPS = 50
PLAN_SECONDS = 10.0  # the expert's planning budget per state; planning takes 0.01-0.5 s on most states
SYSTEM_PROMPT = (
    "You are an expert agent operating in the ALFRED Embodied Environment. Each turn you see your task, your most "
    "recent actions and observations, the current observation and the admissible actions of the current situation. "
    "You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed "
    "within <think> </think> tags. Once you've finished your reasoning, you should choose an admissible action for "
    "the current step and present it within <action> </action> tags, e.g. <action>go to desk 1</action>."
)
_ACTION_TAG = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)
_GOAL = re.compile(r"Your task is to: (.*)")


def data_root(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder holding the game files: ``data_dir``, else ``$ALFWORLD_DATA``."""
    chosen = data_dir if data_dir is not None else os.environ.get(DATA_ENV_VAR)
    if not chosen:
        raise FileNotFoundError(f"no ALFWorld data: pass the json_2.1.1 folder (--data) or set {DATA_ENV_VAR}")
    root = Path(chosen).expanduser().resolve()  # absolute game paths: a task names its game file wherever it is read
    if not root.is_dir():
        raise FileNotFoundError(f"ALFWorld data folder {root} does not exist")
    return root


def split_dir(root: Path, split: str) -> Path:
    """``<root>/json_2.1.1/<split>``, or ``<root>/<split>`` when ``root`` is the ``json_2.1.1`` folder itself."""
    if split not in SPLITS:
        raise ValueError(f"unknown ALFWorld split {split!r}; expected one of {SPLITS}")
    for candidate in (root / LAYOUT / split, root / split):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"ALFWorld split {split!r} not found under {root} (expected {root / LAYOUT / split})")


def task_type_of(task_folder: str) -> str:
    """The task type named by a task folder, e.g. ``pick_two_obj_and_place-Newspaper-None-Drawer-224``."""
    prefix = task_folder.split("-", 1)[0]
    if prefix not in TASK_TYPES:
        raise ValueError(f"{task_folder!r} does not start with an ALFWorld task type")
    return prefix


def find_tasks(root: Path, split: str) -> list[Task]:
    """Every game of a split, sorted by id ``<split>/<task folder>/<trial folder>``."""
    games = sorted(split_dir(root, split).glob(f"*/*/{GAME_FILE}"))
    return [
        Task(
            id=f"{split}/{game.parent.parent.name}/{game.parent.name}",
            split=split,
            data={"game_file": str(game), "task_type": task_type_of(game.parent.parent.name)},
        )
        for game in games
    ]


def goal_of(intro: str) -> str:
    """The task text of a game's first observation ("put a clean mug in coffeemachine.")."""
    found = _GOAL.search(intro)
    if found is None:
        raise ValueError("the observation states no task ('Your task is to: ...')")
    return found.group(1).strip()


def task_line(game_file: str | os.PathLike[str]) -> str:
    """The game's "Your task is to: ..." line — the last of its first observation — derived from the game file's
    grammar by TextWorld's own parser, without loading the game (~0.15 s against 0.5-3.8 s; the task rule reads no
    game state)."""
    from textworld.envs.pddl.logic import GameLogic

    data = json.loads(Path(game_file).read_text())
    logic = GameLogic(domain=data["pddl_domain"], grammar=data["grammar"])
    return logic.grammar.derive("#task#", {"state": None, "facts": None, "variables": {}, "mapping": {},
                                           "entity_infos": {}})  # fmt: skip


def parse_action(reply: str) -> str:
    """The command in a reply: the last ``<action>...</action>``, else the whole reply; lower case, single spaces."""
    tagged = _ACTION_TAG.findall(reply)
    command = tagged[-1] if tagged else reply
    return " ".join(command.lower().split())


def open_game(game_file: str) -> Any:
    """A TextWorld PDDL game with ALFWorld's demangled names, asking for what ``ALFWorldEnv`` reports."""
    try:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
    except ImportError as error:
        raise ImportError("ALFWorld needs the [alfworld] extra: pip install alfworld") from error
    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["walkthrough"])
    return textworld.start(game_file, infos, wrappers=[AlfredDemangler])


def plan_from_here(game: Any) -> list[str]:
    """A shortest winning command sequence from the game's current state ([] if none): TextWorld's
    ``policy_commands`` computation (``PddlEnv._gather_infos``), run on demand."""
    pddl = game.unwrapped
    return pddl._pddl_state.replan(pddl._entity_infos)


def plan_within(game: Any, seconds: float) -> list[str] | None:
    """:func:`plan_from_here` in a forked copy of this process, given ``seconds`` (None when it runs out). The planner
    is a C library that Python cannot interrupt, and on some states (``pick_two_obj_and_place`` games after a few
    detours) its search runs for many minutes; the fork shares the game's memory copy-on-write, so asking costs the
    parent nothing but the wait."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: plan, send the plan, leave without running any of the parent's cleanup
        code = 1
        try:
            os.close(read_end)
            with os.fdopen(write_end, "w") as out:
                json.dump(plan_from_here(game), out)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        with os.fdopen(read_end) as answer:
            ready, _, _ = select.select([answer], [], [], seconds)
            if not ready:
                os.kill(pid, signal.SIGKILL)
                return None
            text = answer.read()  # the child writes once and exits: read to its end
    finally:
        os.waitpid(pid, 0)
    return json.loads(text) if text else None


class ALFWorldEnv:
    """ALFWorld text games (see the module doc). ``info`` of every step: ``won``, ``truncated`` (hit ``max_steps``),
    ``valid`` (the command was admissible), ``action`` (the parsed command) and ``admissible`` (the next commands)."""

    name = "alfworld"
    system_prompt = SYSTEM_PROMPT

    def __init__(self, data_dir: str | os.PathLike[str] | None = None, *, max_steps: int = MAX_STEPS,
                 plan_seconds: float | None = PLAN_SECONDS):
        self.data_dir = data_dir
        self.max_steps = max_steps
        self.plan_seconds = plan_seconds  # the expert's time to plan (None: unlimited, in this process)
        self._game: Any = None
        self._game_file: str | None = None
        self._state: Any = None
        self._goal = ""
        self._actions: list[str] = []  # the parsed commands of this episode
        self._plan: tuple[list[str], list[str]] = ([], [])  # (the commands before it, the plan) of expert_action
        self._done = False

    def tasks(self, split: str) -> Sequence[Task]:
        """The split's games (``SPLITS``), sorted by id."""
        return find_tasks(data_root(self.data_dir), split)

    def task_text(self, task: Task) -> str:
        """The task's "Your task is to: ..." line, read from its game file without loading the game
        (:func:`task_line`; ``StatesTask``)."""
        return task_line(task.data["game_file"])

    def describe(self) -> dict[str, Any]:
        """``{"name": "alfworld", "options": {"data", "max_steps"}}`` (``Describable``): what
        ``envs.registry.rebuild`` needs, e.g. in verl's workers. ``data`` is the data folder made absolute (None:
        ``$ALFWORLD_DATA`` where it is rebuilt); a task names its own game file. ``plan_seconds`` is the expert's
        budget, not part of the game, and is not recorded."""
        data = None if self.data_dir is None else str(Path(self.data_dir).expanduser().resolve())
        return {"name": self.name, "options": {"data": data, "max_steps": self.max_steps}}

    def reset(self, task: Task) -> str:
        game_file = task.data["game_file"]
        if game_file != self._game_file:
            self._game = open_game(game_file)
            self._game_file = game_file
        self._state = self._game.reset()
        self._goal = goal_of(self._state.feedback)
        self._actions = []
        self._plan = ([], self.walkthrough())
        self._done = False
        return self._state.feedback

    def step(self, action: str) -> StepResult:
        if self._done:
            raise RuntimeError("the episode is over; call reset()")
        command = parse_action(action)
        valid = command in self._live_state()["admissible_commands"]
        self._state, _, _ = self._game.step(command)
        self._actions.append(command)
        won = bool(self._state["won"])
        truncated = not won and len(self._actions) >= self.max_steps
        self._done = won or truncated
        info = {
            "won": won,
            "truncated": truncated,
            "valid": valid,
            "action": command,
            "admissible": self.admissible_actions(),
        }
        return StepResult(self._state.feedback, 1.0 if won else 0.0, self._done, info)

    def admissible_actions(self) -> list[str]:
        return list(self._live_state()["admissible_commands"])

    def expert_action(self) -> str | None:
        """The plan's next command while the episode has followed the plan (at first the walkthrough), else the first
        command of a shortest plan from here, which becomes the plan (None when no plan exists or the planner ran out
        of ``plan_seconds``; not asked twice in one state)."""
        before, plan = self._plan
        k = len(self._actions) - len(before)
        if 0 <= k <= len(plan) and self._actions == [*before, *plan[:k]]:
            if k < len(plan):
                return plan[k]
            if k == 0:  # planned from this very state already and found nothing (or ran out of time)
                return None
        self._live_state()  # refuses before reset()
        if self.plan_seconds is None:
            found: list[str] | None = plan_from_here(self._game)
        else:
            found = plan_within(self._game, self.plan_seconds)
        self._plan = (list(self._actions), found or [])
        return self._plan[1][0] if self._plan[1] else None

    def walkthrough(self) -> list[str]:
        """The game file's recorded winning command sequence, from the start of the task."""
        return list(self._live_state()["extra.walkthrough"])

    @property
    def goal(self) -> str:
        """The task text ("look at alarmclock under the desklamp."); "" before the first reset."""
        return self._goal

    @property
    def observation(self) -> str:
        """The latest observation (the intro right after ``reset``)."""
        return self._live_state().feedback

    def _live_state(self) -> Any:
        if self._state is None:
            raise RuntimeError("call reset(task) first")
        return self._state
