"""``HouseholdEnv``: the household rules behind the ``Environment``, ``Branchable`` and ``HasExpert`` protocols."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from deltattg.envs.base import StepResult, Task
from deltattg.envs.household.catalog import SYSTEM_PROMPT
from deltattg.envs.household.generation import HouseholdConfig, generate, split_tasks, vocabulary
from deltattg.envs.household.planner import best_route, is_harmful, plan, plan_length_change
from deltattg.envs.household.world import (
    NOTHING_HAPPENS,
    Command,
    State,
    World,
    admissible_commands,
    intro_text,
    is_won,
    narrate,
    normalize,
    transition,
)


@dataclass(frozen=True)
class HouseholdSnapshot:
    """An episode at one moment; immutable, so taking one costs nothing."""

    world: World
    state: State
    steps: int
    done: bool


class HouseholdEnv:
    """Household tasks (see the package doc). ``info`` of every step: ``won``, ``truncated`` (hit ``max_steps``),
    ``valid`` (the action was admissible), ``admissible`` (the next state's commands) and ``optimal_remaining``."""

    name = "household"
    system_prompt = SYSTEM_PROMPT

    def __init__(self, config: HouseholdConfig | None = None):
        self.config = config or HouseholdConfig()
        self.max_steps = self.config.max_steps
        self._now: HouseholdSnapshot | None = None
        self._commands: dict[str, Command] = {}  # admissible now
        self._route: list[Command] = []  # a shortest plan from now

    def tasks(self, split: str) -> Sequence[Task]:
        """The split's fixed tasks ("train", "valid_seen", "valid_unseen", "test")."""
        return split_tasks(self.config, split)

    def reset(self, task: Task) -> str:
        world, state = generate(self.config, int(task.data["seed"]), task.split == "valid_unseen")
        self.restore(HouseholdSnapshot(world, state, 0, False))
        return intro_text(world)

    def step(self, action: str) -> StepResult:
        now = self.snapshot()
        if now.done:
            raise RuntimeError("the episode is over; call reset()")
        cmd = self._commands.get(normalize(action))
        after = now.state if cmd is None else transition(now.state, cmd)
        observation = NOTHING_HAPPENS if cmd is None else narrate(now.world, cmd, after)
        won = is_won(now.world, after)
        truncated = not won and now.steps + 1 >= self.max_steps
        self.restore(HouseholdSnapshot(now.world, after, now.steps + 1, won or truncated))
        info = {
            "won": won,
            "truncated": truncated,
            "valid": cmd is not None,
            "admissible": list(self._commands),
            "optimal_remaining": len(self._route),
        }
        return StepResult(observation, 1.0 if won else 0.0, won or truncated, info)

    def admissible_actions(self) -> list[str]:
        return list(self._commands)

    def snapshot(self) -> HouseholdSnapshot:
        if self._now is None:
            raise RuntimeError("call reset(task) first")
        return self._now

    def restore(self, state: HouseholdSnapshot) -> None:
        self._now = state
        self._commands = admissible_commands(state.world, state.state)
        self._route = best_route(state.world, state.state)

    @property
    def world(self) -> World:
        return self.snapshot().world

    @property
    def state(self) -> State:
        return self.snapshot().state

    def plan(self) -> list[str]:
        """A shortest winning command sequence from here."""
        texts = self.world.texts
        return [texts[c] for c in self._route]

    def expert_action(self) -> str | None:
        """The planner's next command (``HasExpert``); None once the goal is met."""
        return self.world.texts[self._route[0]] if self._route else None

    def optimal_remaining(self) -> int:
        return len(self._route)

    def reference_answer(self, task: Task) -> str:
        """The task's reference answer (``HasReferenceAnswer``) for IGPO / A²TGPO: the planner's shortest plan from the
        task's start state, one command per line. Household tasks have no answer in the QA sense; this is our
        choice: the expert's plan stands in for a QA answer, so a turn is informative when it makes the actor
        likelier to state the optimal plan. The current episode is not touched."""
        world, state = generate(self.config, int(task.data["seed"]), task.split == "valid_unseen")
        return "\n".join(plan(world, state))

    def plan_length_change(self, action: str) -> int:
        """−1 progress, 0 wasted, > 0 harmful (``planner.plan_length_change``)."""
        return plan_length_change(self.world, self.state, action)

    def is_harmful(self, action: str) -> bool:
        return is_harmful(self.world, self.state, action)

    def describe(self) -> dict[str, Any]:
        """``{"name": "household", "options": every HouseholdConfig field}`` (``Describable``)."""
        return {"name": self.name, "options": {k: list(v) if isinstance(v, tuple) else v
                                               for k, v in asdict(self.config).items()}}  # fmt: skip

    def vocabulary(self) -> list[str]:
        """Every word this environment's text can contain (``generation.vocabulary``)."""
        return vocabulary(self.config)
