"""The environment protocol every rollout, collector, trainer and guidance loop talks to.

    task = env.tasks("train")[0]
    observation = env.reset(task)
    result = env.step("go to countertop 1")   # -> StepResult(observation, reward, done, info)

``info`` carries ``won`` (bool) and, where the environment has them, ``admissible`` (list of valid actions) and the
step's verified outcome (:func:`verified_outcome`: ``verified``, else ``valid``; what CrEST reads).
An environment may set ``prompt_layout = "chat"`` when the actor must see the whole conversation (BFCL's later user
turns); the default is verl-agent's windowed prompt (see ``deltattg.rollout.prompts``).
Environments are deterministic given a task and seed. Branching for test-time guidance (E.5): ``snapshot()`` /
``restore()`` where cheap, else ``replay`` re-runs the actions so far on a fresh instance.

Optional: ``reference_answer(task) -> str | None`` (:class:`HasReferenceAnswer`), the answer whose probability
IGPO and A²TGPO track turn by turn (household: the planner's optimal plan; BFCL: the ground-truth calls). Not part
of :class:`Environment` itself, so an environment without one still runs every other method;
:func:`reference_answer` asks for it. Likewise ``mistaken_action(rng) -> str`` (:class:`HasMistakes`): a plausible
wrong step where there is no admissible list to draw one from (BFCL, τ²), what ``expert:EPS`` plays with probability
ε.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Task:
    """One task instance: ``id`` is stable across runs (it is the trajectory's ``group``)."""

    id: str
    split: str = "train"
    data: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass
class StepResult:
    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def won(self) -> bool:
        return bool(self.info.get("won", False))


@runtime_checkable
class Environment(Protocol):
    name: str
    system_prompt: str  # how to act: the action format the environment parses
    max_steps: int

    def tasks(self, split: str) -> Sequence[Task]: ...

    def reset(self, task: Task) -> str: ...

    def step(self, action: str) -> StepResult: ...

    def admissible_actions(self) -> list[str] | None: ...


@runtime_checkable
class Branchable(Protocol):
    """Environments whose state can be copied cheaply."""

    def snapshot(self) -> Any: ...

    def restore(self, state: Any) -> None: ...


@runtime_checkable
class Describable(Protocol):
    """Environments that can say how to rebuild themselves: ``{"name": ..., "options": {...}}`` such that
    ``deltattg.envs.registry.rebuild`` makes an identical one (recorded with every rollout, read by the oracle meter)."""

    def describe(self) -> dict[str, Any]: ...


@runtime_checkable
class StatesTask(Protocol):
    """Environments whose reset is costly (an ALFWorld game loads in seconds) that can state a task's text without
    one: what ``deltattg verl-tasks`` writes as a dataset row's prompt (the agent loop shows the full first
    observation when the episode starts)."""

    def task_text(self, task: Task) -> str: ...


@runtime_checkable
class HasExpert(Protocol):
    """Environments that know a good next action from the current state (planner, walkthrough, ground truth)."""

    def expert_action(self) -> str | None: ...


@runtime_checkable
class HasMistakes(Protocol):
    """Environments without admissible actions that say what a plausible wrong step is: a noisy expert's deviation
    (``expert:EPS``; :mod:`deltattg.envs.mistakes`)."""

    def mistaken_action(self, rng: random.Random) -> str: ...


@runtime_checkable
class HasReferenceAnswer(Protocol):
    """Environments that know a reference answer of each task, as text in the action format: what IGPO / A²TGPO
    teacher-force as an assistant reply after each turn (``None`` for a task without one)."""

    def reference_answer(self, task: Task) -> str | None: ...


def verified_outcome(info: Mapping[str, Any]) -> bool | None:
    """The step's outcome as the environment itself verified it, from its ``info``: ``info["verified"]`` where the
    environment sets that key (BFCL: its tool calls ran without error; None: a reply without calls, nothing to
    verify), else ``info["valid"]`` (the action was admissible: household, ALFWorld), else None. Never a privileged
    signal such as the planner's progress (``optimal_remaining``)."""
    value = info["verified"] if "verified" in info else info.get("valid")
    return None if value is None else bool(value)


def reference_answer(env: Environment, task: Task) -> str | None:
    """``env.reference_answer(task)`` where the environment has one, else ``None``."""
    return env.reference_answer(task) if isinstance(env, HasReferenceAnswer) else None


def replay(make_env: Callable[[], Environment], task: Task, actions: Sequence[str]) -> tuple[Environment, StepResult | None]:
    """A fresh environment at the state reached by ``actions`` from ``task``'s start (E.5 replays), and the last result."""
    env = make_env()
    return env, replay_on(env, task, actions)


def replay_on(env: Environment, task: Task, actions: Sequence[str]) -> StepResult | None:
    """Reset ``env`` to ``task`` and take ``actions``; the last result (None when there are none). Re-using one
    environment per task keeps its game loaded (an ALFWorld reset of the loaded game skips the game load)."""
    env.reset(task)
    last = None
    for action in actions:
        last = env.step(action)
    return last
