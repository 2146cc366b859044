"""Difficulty knobs, tasks from integer seeds, the fixed splits, and the vocabulary a config can produce."""

from __future__ import annotations

import random
import string
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from deltattg.envs.base import Task
from deltattg.envs.household.catalog import (
    COMMANDS,
    DESCRIPTIONS,
    LAMP,
    LIST_WORDS,
    OBJECT_AFFORDANCES,
    OBSERVATIONS,
    PREPOSITIONS,
    PROCESS_SETS,
    RECEPTACLE_KINDS,
    SYSTEM_PROMPT,
    TASK_KINDS,
    TASK_TYPES,
    split_words,
)
from deltattg.envs.household.planner import optimal_remaining
from deltattg.envs.household.world import Goal, State, World, is_won, type_of
from deltattg.errors import InputError

SPLITS: tuple[str, ...] = ("train", "valid_seen", "valid_unseen", "test")
_SPLIT_SEED_OFFSET = {"train": 0, "valid_seen": 1_000_000, "valid_unseen": 2_000_000, "test": 3_000_000}
# What each split is deduplicated against (by content): held-out splits never pose a training task, and the test
# split (for reporting, never for choosing settings) never poses a valid_seen task either.
_DISJOINT_FROM = {"train": (), "valid_seen": ("train",), "valid_unseen": ("train",), "test": ("train", "valid_seen")}
_RANGES = ("receptacles", "targets", "distractors", "plan_length")
# Upper bounds of the knobs (far above any useful house; they keep a crafted or corrupted record from building a
# house or a split that exhausts memory or time).
_LIMITS = {"receptacles": 64, "targets": 16, "distractors": 256, "plan_length": 1000, "max_per_receptacle": 64,
           "max_steps": 10_000, "n_train": 1_000_000, "n_valid_seen": 1_000_000, "n_valid_unseen": 1_000_000,
           "n_test": 1_000_000}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
_LAYOUT_ATTEMPTS = 200


@dataclass(frozen=True)
class HouseholdConfig:
    """Difficulty knobs. ``(low, high)`` ranges are inclusive and drawn per task."""

    task_types: tuple[str, ...] = TASK_TYPES
    receptacles: tuple[int, int] = (10, 16)
    targets: tuple[int, int] = (1, 3)  # objects of the goal's type (pick-two tasks get at least 2)
    distractors: tuple[int, int] = (6, 12)  # objects of other types
    max_per_receptacle: int = 4  # objects per receptacle at the start
    start_closed: bool = True  # openable receptacles start closed (as in ALFWorld)
    plan_length: tuple[int, int] = (1, 50)  # accepted optimal solution lengths at the start
    max_steps: int = 50
    object_types: tuple[str, ...] = tuple(OBJECT_AFFORDANCES)
    receptacle_types: tuple[str, ...] = tuple(RECEPTACLE_KINDS)
    n_train: int = 1000
    n_valid_seen: int = 140
    n_valid_unseen: int = 134
    n_test: int = 1000  # seen pairings, disjoint from train and valid_seen: where results are reported

    @classmethod
    def short(cls, **overrides: object) -> HouseholdConfig:
        """Small rooms, solutions of 3–10 steps, 20 steps allowed: episodes a CPU demo can afford."""
        knobs: dict[str, object] = {
            "receptacles": (4, 7), "targets": (1, 2), "distractors": (2, 4), "plan_length": (3, 10), "max_steps": 20,
            "n_train": 200, "n_valid_seen": 50, "n_valid_unseen": 50,
        }  # fmt: skip
        return cls(**(knobs | overrides))  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        for name in _RANGES:
            value = getattr(self, name)
            if not (isinstance(value, (tuple, list)) and len(value) == 2 and all(_is_int(v) for v in value)
                    and 0 <= value[0] <= value[1] <= _LIMITS[name]):
                raise InputError(f"must be a (low, high) range of integers with 0 <= low <= high <= {_LIMITS[name]}, "
                                 f"got {value!r}", field=name)
        for name in ("max_per_receptacle", "max_steps", "n_train", "n_valid_seen", "n_valid_unseen", "n_test"):
            value = getattr(self, name)
            if not (_is_int(value) and 0 <= value <= _LIMITS[name]):
                raise InputError(f"must be an integer in [0, {_LIMITS[name]}], got {value!r}", field=name)
        for name in ("task_types", "object_types", "receptacle_types"):
            if not all(isinstance(v, str) for v in getattr(self, name)):
                raise InputError("must be a list of names", field=name)
        _check_names(self.task_types, TASK_KINDS, "task_types")
        _check_names(self.object_types, OBJECT_AFFORDANCES, "object_types")
        _check_names(self.receptacle_types, RECEPTACLE_KINDS, "receptacle_types")
        if not any(RECEPTACLE_KINDS[r].holds_lamp for r in self.receptacle_types):
            raise InputError("needs a type that holds the desklamp (desk, sidetable, ...)", field="receptacle_types")
        for task_type in self.task_types:
            if not goals(self, task_type, unseen=False):
                raise InputError(f"no object and receptacle types here make a {task_type} task", field="task_types")
        if len(self.object_types) < 2:
            raise InputError("needs at least two object types (targets and distractors)", field="object_types")
        if self.receptacles[0] < 3:
            raise InputError("at least 3 (destination, appliance, lamp holder)", field="receptacles")
        if self.receptacles[0] * self.max_per_receptacle < max(self.targets[1], 2) + self.distractors[1]:
            raise InputError("too many objects for the smallest house", field="max_per_receptacle")
        if self.max_steps < 1:
            raise InputError("must be positive", field="max_steps")
        if min(self.n_train, self.n_valid_seen, self.n_valid_unseen, self.n_test) < 0:
            raise InputError("split sizes must be non-negative", field="n_train")


def _check_names(names: Sequence[str], known: Mapping[str, object], name: str) -> None:
    unknown = sorted(set(names) - set(known))
    if unknown or not names:
        raise InputError(f"unknown {unknown} or empty; choose from {', '.join(known)}", field=name)


def is_held_out(object_type: str, receptacle_type: str | None) -> bool:
    """Whether a goal pairing is posed in valid_unseen only: a fixed fifth or so of all pairs, by CRC32 (the lamp task
    pairs its object with "desklamp")."""
    return zlib.crc32(f"{object_type}/{receptacle_type or 'desklamp'}".encode()) % 5 == 0


@lru_cache(maxsize=256)
def goals(config: HouseholdConfig, task_type: str, unseen: bool) -> tuple[Goal, ...]:
    """Every goal of ``task_type`` the config can pose: the held-out pairings if ``unseen``, else the others."""
    kind = TASK_KINDS[task_type]
    if kind.use in PROCESS_SETS and not any(RECEPTACLE_KINDS[r].process == kind.use for r in config.receptacle_types):
        return ()
    objects = [o for o in config.object_types if kind.use is None or kind.use in OBJECT_AFFORDANCES[o]]
    receptacles: list[str | None] = [None] if kind.count == 0 else list(config.receptacle_types)
    candidates = (Goal(task_type, o, r) for o in objects for r in receptacles)
    return tuple(g for g in candidates if is_held_out(g.object_type, g.receptacle_type) == unseen)


def numbered(types: Sequence[str]) -> list[str]:
    """``["cup", "mug", "cup"]`` → ``["cup 1", "mug 1", "cup 2"]``."""
    counts: Counter[str] = Counter()
    names = []
    for t in types:
        counts[t] += 1
        names.append(f"{t} {counts[t]}")
    return names


def _receptacle_types(config: HouseholdConfig, goal: Goal, rng: random.Random) -> list[str]:
    """The house's receptacle types, sorted: the goal's destination and appliance, a lamp holder, then random fill
    (at most one of each ``single`` kind)."""
    use = TASK_KINDS[goal.task_type].use
    types = [goal.receptacle_type] if goal.receptacle_type else []
    if use in PROCESS_SETS and not any(RECEPTACLE_KINDS[t].process == use for t in types):
        types.append(rng.choice([r for r in config.receptacle_types if RECEPTACLE_KINDS[r].process == use]))
    types.append(rng.choice([r for r in config.receptacle_types if RECEPTACLE_KINDS[r].holds_lamp]))
    size = rng.randint(*config.receptacles)
    while len(types) < size:  # never stuck: lamp holders are not ``single``
        allowed = [r for r in config.receptacle_types if not (RECEPTACLE_KINDS[r].single and r in types)]
        types.append(rng.choice(allowed))
    return sorted(types)


def draw_object_types(config: HouseholdConfig, goal: Goal, rng: random.Random) -> list[str]:
    """Targets (the goal's type) and distractors (other types), shuffled."""
    count = max(TASK_KINDS[goal.task_type].count, rng.randint(*config.targets))
    others = [o for o in config.object_types if o != goal.object_type]
    types = [goal.object_type] * count + [rng.choice(others) for _ in range(rng.randint(*config.distractors))]
    rng.shuffle(types)
    return types


def _layout(config: HouseholdConfig, goal: Goal, phrasing: int, rng: random.Random) -> tuple[World, State]:
    """A random house for ``goal`` and its start state (middle of the room, empty hands)."""
    receptacles = numbered(_receptacle_types(config, goal, rng))
    objects = numbered(draw_object_types(config, goal, rng))
    holders = [i for i, r in enumerate(receptacles) if RECEPTACLE_KINDS[type_of(r)].holds_lamp]
    world = World(goal, goal.text(phrasing), tuple(receptacles), tuple(objects), rng.choice(holders))
    slots = [r for r in range(len(receptacles)) for _ in range(config.max_per_receptacle)]
    return world, start_state(config, world, tuple(rng.sample(slots, len(objects))))


def start_state(config: HouseholdConfig, world: World, where: tuple[int, ...]) -> State:
    """The start state of a house whose objects lie in receptacles ``where``: the agent in the middle of the room,
    empty hands, the openable receptacles open unless ``config.start_closed``."""
    opened = 0 if config.start_closed else sum(1 << r for r, openable in enumerate(world.openable) if openable)
    return State(-1, -1, where, (0,) * len(where), opened, False)


@lru_cache(maxsize=4096)
def generate(config: HouseholdConfig, seed: int, unseen: bool = False) -> tuple[World, State]:
    """The task for ``seed``: task types take turns by seed; a random goal of that type (a held-out pairing iff
    ``unseen``); then random houses until one is unsolved at the start with an optimal plan length in
    ``config.plan_length``."""
    task_types = [t for t in config.task_types if goals(config, t, unseen)]
    if not task_types:
        raise InputError(f"no {'held-out' if unseen else 'seen'} goal pairing exists", field="object_types")
    rng = random.Random(seed)
    goal = rng.choice(goals(config, task_types[seed % len(task_types)], unseen))
    phrasing = rng.randrange(2)
    low, high = config.plan_length
    for _ in range(_LAYOUT_ATTEMPTS):
        world, state = _layout(config, goal, phrasing, rng)
        if not is_won(world, state) and low <= optimal_remaining(world, state) <= high:
            return world, state
    raise InputError(f"no house for {goal} has a plan length in {config.plan_length}", field="plan_length")


def content_key(world: World, state: State) -> tuple:
    """What makes two tasks the same task: the goal, the house and the start state (not the goal's phrasing)."""
    return (world.goal, world.receptacles, world.objects, world.lamp_at, state)


@lru_cache(maxsize=64)
def split_tasks(config: HouseholdConfig, split: str) -> tuple[Task, ...]:
    """A split's fixed tasks. Seeds of different splits never overlap; valid_unseen poses only held-out pairings.
    The held-out splits are deduplicated by content (``content_key``) against the training tasks (test also against
    valid_seen's, the split settings are chosen on) and themselves: a seed whose task equals one already taken is
    passed over, so held-out success measures held-out tasks."""
    if split not in SPLITS:
        raise InputError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}", field="split")
    offset, wanted, unseen = _SPLIT_SEED_OFFSET[split], getattr(config, f"n_{split}"), split == "valid_unseen"
    taken = {content_key(*generate(config, int(t.data["seed"]), other == "valid_unseen"))
             for other in _DISJOINT_FROM[split] for t in split_tasks(config, other)}  # fmt: skip
    tasks: list[Task] = []
    attempts = wanted if split == "train" else 20 * wanted + 1000
    for seed in range(offset, offset + attempts):
        if len(tasks) == wanted:
            break
        world, state = generate(config, seed, unseen)
        if split != "train":
            key = content_key(world, state)
            if key in taken:
                continue
            taken.add(key)
        data = {"seed": seed, "task_type": world.goal.task_type, "goal": world.goal_text}
        tasks.append(Task(id=f"household/{split}/{seed}", split=split, data=data))
    if len(tasks) < wanted:
        raise InputError(f"only {len(tasks)} {split} tasks in {attempts} seeds differ from the training tasks and each "
                         f"other; lower n_{split} or widen the task space", field=f"n_{split}")  # fmt: skip
    return tuple(tasks)


def vocabulary(config: HouseholdConfig) -> list[str]:
    """Every word (``split_words``) of the observations, goals, commands and system prompt the config can produce."""
    templates = [SYSTEM_PROMPT, LAMP, LIST_WORDS, *PREPOSITIONS, *COMMANDS.values(), *OBSERVATIONS.values()]
    templates += [*DESCRIPTIONS.values(), *(p for kind in TASK_KINDS.values() for p in kind.phrasings)]
    literals = [literal for template in templates for literal, *_ in string.Formatter().parse(template)]
    highest = max(config.receptacles[1], max(config.targets[1], 2) + config.distractors[1])
    names = [*config.object_types, *config.receptacle_types, *map(str, range(1, highest + 1))]
    return sorted({word for text in literals + names for word in split_words(text)})
