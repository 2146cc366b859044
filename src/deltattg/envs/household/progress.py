"""What the planner knows about a recorded household trajectory: the state before every action and after the last, each
state's distance to the goal, and the actions the expert would take from it. The oracle progress meter and
``deltattg inspect`` read recorded trajectories through these.

A trajectory replays when it carries its provenance (``env`` and ``task``, written by the rollout engine): the
environment is rebuilt from ``env``'s description, reset to ``task`` and stepped through the recorded actions
(``envs.replay``); every observation must come out as recorded, or the record is refused (it belongs to another
environment or task).
"""

from __future__ import annotations

from dataclasses import dataclass

from deltattg.data.trajectory import Trajectory
from deltattg.envs.household.env import HouseholdEnv
from deltattg.envs.household.planner import best_route
from deltattg.envs.household.world import State, World, transition
from deltattg.envs.replay import provenance, recorded_episode, recorded_task, walk
from deltattg.errors import InputError


@dataclass(frozen=True)
class Replayed:
    """A recorded trajectory's states: ``states[t]`` is s_t, before action t (t = 0..T−1), and ``states[T]`` the state
    after the last action; ``max_turns`` is the turn limit the episode ran under."""

    world: World
    states: tuple[State, ...]
    max_turns: int

    def distances(self) -> list[int]:
        """d_t = the optimal remaining plan length of every state s_0..s_T (0 once the goal is met)."""
        return [len(best_route(self.world, s)) for s in self.states]


def household_env(trajectory: Trajectory) -> HouseholdEnv:
    """The household environment a trajectory's ``env`` record describes; refuses any other environment."""
    from deltattg.envs.registry import rebuild

    description = provenance(trajectory, "env")
    if description.get("name") != HouseholdEnv.name:
        raise InputError(f"only the household environment has a planner to replay with, not {description.get('name')!r}",
                         field="env.name")  # fmt: skip
    try:
        env = rebuild(description)()
    except (ValueError, TypeError) as exc:
        raise InputError(f"cannot rebuild the environment: {exc}", field="env.options") from None
    assert isinstance(env, HouseholdEnv)
    return env


def replay(trajectory: Trajectory) -> Replayed:
    """Rebuild, reset and step the trajectory's environment through its actions (``envs.replay.walk``: every
    observation must come out as recorded), keeping the state before every action and after the last."""
    env = household_env(trajectory)
    seed = (recorded_task(trajectory).data or {}).get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise InputError(f"must be an integer in [0, 2^63), got {seed!r}", field="task.data.seed")
    recorded = recorded_episode(trajectory, lambda: env, env.max_steps)
    states = [env.state for _ in walk(recorded, env, recorded.num_steps)]
    return Replayed(env.world, tuple(states), recorded.max_turns)


class ExpertPaths:
    """The actions the planner's expert takes from a state to the goal (``best_route``'s first command, again and
    again), memoised per (world, state): a trajectory's states share most of their paths."""

    def __init__(self) -> None:
        self._memo: dict[tuple[World, State], tuple[str, ...]] = {}  # worlds hash by identity

    def __call__(self, world: World, state: State) -> tuple[str, ...]:
        key = (world, state)
        found = self._memo.get(key)
        if found is None:
            route = best_route(world, state)
            found = () if not route else (world.texts[route[0]], *self(world, transition(state, route[0])))
            self._memo[key] = found
        return found
