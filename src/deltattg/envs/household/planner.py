"""An optimal planner from any state, and what it says about single actions (progress, waste, harm).

For every choice of target object(s), appliance and (for two targets) destination there is one sensible route: fetch
the target (open its receptacle if closed, put down whatever is in hand right there), treat it at the appliance,
deliver it to the destination quickest to reach (open it if still closed); for the lamp task, fetch the target and
switch the lamp on. The shortest of these routes is a shortest plan. The tests check this against breadth-first
search on small houses and check Bellman consistency (``d(s) = 1 + min over admissible a of d(s')``) on full-size ones.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from deltattg.envs.household.catalog import TASK_KINDS
from deltattg.envs.household.world import Command, State, World, admissible_commands, is_won, normalize, transition


class _Route:
    """A plan under construction: its commands so far, and where the agent stands, what it holds, what is where and
    what is open once they have run."""

    __slots__ = ("world", "where", "at", "held", "opened", "lamp_on", "steps")

    def __init__(self, world: World, state: State):
        self.world, self.where, self.lamp_on = world, list(state.where), state.lamp_on
        self.at, self.held, self.opened = state.at, state.held, state.opened
        self.steps: list[Command] = []

    def go(self, r: int) -> None:
        if self.at != r:
            self.steps.append(("go", -1, r))
            self.at = r

    def reach(self, r: int) -> None:
        """Stand at ``r`` with it open."""
        self.go(r)
        if self.world.openable[r] and not self.opened >> r & 1:
            self.steps.append(("open", -1, r))
            self.opened |= 1 << r

    def reach_cost(self, r: int) -> int:
        """Commands ``reach(r)`` would add."""
        return (self.at != r) + (self.world.openable[r] and not self.opened >> r & 1)

    def put(self, r: int) -> None:
        self.reach(r)
        self.steps.append(("move", self.held, r))
        self.where[self.held] = r
        self.held = -1

    def take(self, o: int) -> None:
        """Hold ``o``, leaving whatever else is in hand where ``o`` was."""
        if self.held == o:
            return
        r = self.where[o]
        self.reach(r)
        if self.held >= 0:
            self.put(r)
        self.steps.append(("take", o, r))
        self.where[o] = -1
        self.held = o

    def deliver(self, destinations: tuple[int, ...]) -> None:
        """Put what is held into whichever destination is quickest to reach (the last move, so the only thing that
        matters about the choice)."""
        self.put(min(destinations, key=self.reach_cost))

    def treat(self, appliance: int) -> None:
        self.go(appliance)
        self.steps.append((self.world.processes[appliance], self.held, appliance))  # type: ignore[arg-type]

    def light(self) -> None:
        self.go(self.world.lamp_at)
        if not self.lamp_on:
            self.steps.append(("use", -1, self.world.lamp_at))


def _routes(world: World, state: State) -> Iterator[list[Command]]:
    """One route per choice of target(s) and appliance, and, for two targets, destination."""
    count = TASK_KINDS[world.goal.task_type].count
    if count == 0:
        for o in world.targets:
            route = _Route(world, state)
            route.take(o)
            route.light()
            yield route.steps
    elif count == 1:
        for o in world.targets:
            treated = state.flags[o] & world.need == world.need
            for appliance in (None,) if treated else world.appliances:
                route = _Route(world, state)
                route.take(o)
                if appliance is not None:
                    route.treat(appliance)
                route.deliver(world.destinations)
                yield route.steps
    else:
        for d in world.destinations:
            outside = [o for o in world.targets if state.where[o] != d]
            missing = count - (len(world.targets) - len(outside))
            for chosen in itertools.permutations(outside, missing):
                route = _Route(world, state)
                for o in chosen:
                    route.take(o)
                    route.put(d)
                yield route.steps


def best_route(world: World, state: State) -> list[Command]:
    """A shortest command sequence from ``state`` to the goal, as commands (empty when the goal is met)."""
    if is_won(world, state):
        return []
    return min(_routes(world, state), key=len)


def plan(world: World, state: State) -> list[str]:
    """A shortest command sequence from ``state`` to the goal, as text (empty when the goal is met)."""
    return [world.texts[c] for c in best_route(world, state)]


def optimal_remaining(world: World, state: State) -> int:
    """The length of a shortest plan from ``state``."""
    return len(best_route(world, state))


def plan_length_change(world: World, state: State, action: str) -> int:
    """How ``action`` changes the optimal remaining plan length: −1 progress, 0 wasted, > 0 harmful (undoes progress).
    A command that is not admissible changes nothing: 0."""
    cmd = admissible_commands(world, state).get(normalize(action))
    if cmd is None:
        return 0
    return optimal_remaining(world, transition(state, cmd)) - optimal_remaining(world, state)


def is_harmful(world: World, state: State, action: str) -> bool:
    """Whether ``action`` lengthens the optimal remaining plan (the package doc lists the kinds of harm)."""
    return plan_length_change(world, state, action) > 0
