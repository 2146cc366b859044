"""What an agent that reads only its history can know of a household task: the hidden worlds consistent with it.

The first observation shows the goal and the receptacles. Hidden until the agent looks: which objects the house holds
(their types, hence their numbered names), where each one lies, and which lamp holder the desk lamp stands on. The
task generator (``generation._layout``) draws them independently of each other given the goal and the receptacles:

* the target count t uniform in ``config.targets`` (at least the task's count), the distractor count d uniform in
  ``config.distractors``, each distractor's type uniform over the other object types, then the list shuffled — so
  every sequence of t targets and d distractors has probability t!·d! / ((t+d)!·k^d) (k other types);
* each object a slot drawn without replacement from ``max_per_receptacle`` slots per receptacle;
* the lamp uniform over the lamp holders;

and keeps a house only if its goal is not met at the start and its optimal plan length lies in
``config.plan_length`` (it redraws otherwise), which conditions all of it. :func:`hypotheses` enumerates every
hidden completion with that prior probability (:class:`Hypothesis`), or — where there are more than ``max_worlds`` —
draws ``samples`` of them from the same prior (each of weight 1/samples: a Monte-Carlo belief, stated as such).

:func:`belief_readings` keeps, after every step of a recorded trajectory, the hypotheses that answer its actions with
exactly the observations it recorded (and end it when it ended), and reads each state as the planner's reading
averaged over them: p = P(the optimal plan fits in the turns left), v = E[the expert's remaining tokens]. It equals
the planner wherever nothing hidden matters, and reads no more than the history holds — the ceiling for a meter
that reads the history. It is an upper reference: it assumes the agent then acts knowing the world.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from deltattg.envs.household.catalog import RECEPTACLE_KINDS, TASK_KINDS
from deltattg.envs.household.generation import HouseholdConfig, draw_object_types, numbered, start_state
from deltattg.envs.household.planner import optimal_remaining
from deltattg.envs.household.world import (
    NOTHING_HAPPENS,
    State,
    World,
    admissible_commands,
    is_won,
    narrate,
    normalize,
    transition,
    type_of,
)

MAX_WORLDS = 20_000  # hidden completions enumerated per task; above this many they are sampled
SAMPLES = 4_096  # hidden completions drawn per task where they are sampled


@dataclass(frozen=True)
class Hypothesis:
    """One hidden completion of a task: its world, its start state and its probability under the generator's prior
    (conditioned on its acceptance test; the hypotheses of a task sum to 1)."""

    world: World
    start: State
    prior: float


def type_sequences(config: HouseholdConfig, world: World) -> dict[tuple[str, ...], float]:
    """Every sequence of object types the generator can draw for ``world``'s goal, with its probability (module
    doc)."""
    goal = world.goal
    need = TASK_KINDS[goal.task_type].count
    others = [o for o in config.object_types if o != goal.object_type]
    low, high = config.targets
    dlow, dhigh = config.distractors
    out: dict[tuple[str, ...], float] = defaultdict(float)
    for drawn in range(low, high + 1):
        targets = max(need, drawn)
        for distractors in range(dlow, dhigh + 1):
            n = targets + distractors
            each = (math.factorial(targets) * math.factorial(distractors)
                    / (math.factorial(n) * len(others) ** distractors))  # fmt: skip
            weight = each / ((high - low + 1) * (dhigh - dlow + 1))
            for places in itertools.combinations(range(n), targets):
                for kinds in itertools.product(others, repeat=distractors):
                    fill = iter(kinds)
                    sequence = tuple(goal.object_type if k in places else next(fill) for k in range(n))
                    out[sequence] += weight
    return dict(out)


def placements(objects: int, receptacles: int, capacity: int) -> Iterator[tuple[tuple[int, ...], float]]:
    """Every receptacle of each of ``objects`` objects, drawn as slots without replacement from ``capacity`` slots
    per receptacle (``random.sample``), with its probability."""
    slots = receptacles * capacity
    for where in itertools.product(range(receptacles), repeat=objects):
        used: dict[int, int] = defaultdict(int)
        prob = 1.0
        for k, r in enumerate(where):
            prob *= (capacity - used[r]) / (slots - k)
            used[r] += 1
            if prob == 0.0:
                break
        if prob > 0.0:
            yield where, prob


def accepted(config: HouseholdConfig, world: World, start: State) -> bool:
    """The generator's acceptance test: the goal is not met at the start, and the optimal plan length is in range."""
    low, high = config.plan_length
    return not is_won(world, start) and low <= optimal_remaining(world, start) <= high


def completion_count(config: HouseholdConfig, world: World) -> int:
    """How many hidden completions ``world``'s visible part has (before the acceptance test)."""
    holders = sum(RECEPTACLE_KINDS[type_of(r)].holds_lamp for r in world.receptacles)
    return sum(holders * len(world.receptacles) ** len(sequence) for sequence in type_sequences(config, world))


def hypotheses(config: HouseholdConfig, world: World, *, max_worlds: int = MAX_WORLDS, samples: int = SAMPLES,
               seed: int = 0) -> tuple[list[Hypothesis], bool]:
    """The hidden completions of the task whose visible part (goal, goal text, receptacles) ``world`` shows, with
    their prior probabilities conditioned on the generator's acceptance test; and whether they were sampled
    (``samples`` draws, seeded by ``seed``) because there are more than ``max_worlds``."""
    if completion_count(config, world) > max_worlds:
        return sampled_hypotheses(config, world, samples, random.Random(seed)), True
    holders = [r for r, name in enumerate(world.receptacles) if RECEPTACLE_KINDS[type_of(name)].holds_lamp]
    out = []
    for sequence, p_types in type_sequences(config, world).items():
        objects = tuple(numbered(sequence))
        for where, p_where in placements(len(objects), len(world.receptacles), config.max_per_receptacle):
            for lamp in holders:
                candidate = World(world.goal, world.goal_text, world.receptacles, objects, lamp)
                start = start_state(config, candidate, where)
                if accepted(config, candidate, start):
                    out.append(Hypothesis(candidate, start, p_types * p_where / len(holders)))
    total = sum(h.prior for h in out)
    return [Hypothesis(h.world, h.start, h.prior / total) for h in out], False


def sampled_hypotheses(config: HouseholdConfig, world: World, samples: int, rng: random.Random) -> list[Hypothesis]:
    """``samples`` accepted completions drawn as the generator draws them (module doc), each of weight 1/samples."""
    holders = [r for r, name in enumerate(world.receptacles) if RECEPTACLE_KINDS[type_of(name)].holds_lamp]
    slots = [r for r in range(len(world.receptacles)) for _ in range(config.max_per_receptacle)]
    out: list[Hypothesis] = []
    for _ in range(1000 * samples):
        if len(out) == samples:
            break
        types = draw_object_types(config, world.goal, rng)
        candidate = World(world.goal, world.goal_text, world.receptacles, tuple(numbered(types)), rng.choice(holders))
        start = start_state(config, candidate, tuple(rng.sample(slots, len(types))))
        if accepted(config, candidate, start):
            out.append(Hypothesis(candidate, start, 1.0 / samples))
    return out


@dataclass(frozen=True)
class BeliefReading:
    """The belief at one decision state: ``probability`` that the optimal plan fits in the turns left, the expected
    ``tokens_to_go`` of the expert's remaining actions, and how many hypotheses it averaged."""

    probability: float
    tokens_to_go: float
    worlds: int


def consistent(world: World, state: State, command: str, observation: str | None, won: bool) -> State | None:
    """The state after ``command`` in ``world`` if it answers with ``observation`` (None: not recorded, any answer)
    and meets the goal exactly when ``won``; else None."""
    cmd = admissible_commands(world, state).get(normalize(command))
    after = state if cmd is None else transition(state, cmd)
    said = NOTHING_HAPPENS if cmd is None else narrate(world, cmd, after)
    if observation is not None and said != observation:
        return None
    return after if is_won(world, after) == won else None


def belief_readings(hypotheses: Sequence[Hypothesis], commands: Sequence[str], observations: Sequence[str | None],
                    success: bool, max_turns: int, path_tokens: Callable[[World, State], float],
                    count: int) -> list[BeliefReading | None]:
    """The belief reading of states s_0..s_{count−1} of a recorded episode: its ``commands`` (executed by actions
    0..T−1), the ``observations`` after each (T of them), whether it ended in ``success`` and its turn limit. State
    s_t averages over the hypotheses consistent with everything the history h_t shows (the observations after
    actions 0..t−1). ``path_tokens(world, state)``: the tokens of the expert's remaining actions there. A state no
    hypothesis explains (a sampled belief that missed the true world) reads None."""
    alive = [(h, h.start) for h in hypotheses]
    out: list[BeliefReading | None] = []
    for t in range(count):
        if t > 0:
            won = success and t == len(commands)
            alive = [(h, after) for h, state in alive
                     if (after := consistent(h.world, state, commands[t - 1], observations[t - 1], won)) is not None]
        total = sum(h.prior for h, _ in alive)
        if not alive or total <= 0:
            out.append(None)
            continue
        turns_left = max_turns - t
        fits = sum(h.prior for h, state in alive if optimal_remaining(h.world, state) <= turns_left)
        tokens = sum(h.prior * path_tokens(h.world, state) for h, state in alive)
        out.append(BeliefReading(fits / total, tokens / total, len(alive)))
    return out
