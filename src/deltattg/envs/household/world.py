"""The rules: a static ``World`` per task, an immutable ``State``, admissible commands, transitions, text, goal test."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

from deltattg.envs.household.catalog import (
    COMMANDS,
    DESCRIPTIONS,
    LAMP,
    OBSERVATIONS,
    PROCESS_CLEARS,
    PROCESS_SETS,
    RECEPTACLE_KINDS,
    TASK_KINDS,
    listing,
)
from deltattg.errors import InputError

Command = tuple[str, int, int]  # (verb, object index or -1, receptacle index or -1); verbs are the keys of COMMANDS
NOTHING_HAPPENS = OBSERVATIONS["nothing"]


@dataclass(frozen=True)
class Goal:
    task_type: str
    object_type: str
    receptacle_type: str | None  # None for look_at_obj_in_light

    def text(self, phrasing: int) -> str:
        """The goal sentence in one of its task type's two phrasings."""
        template = TASK_KINDS[self.task_type].phrasings[phrasing]
        if self.receptacle_type is None:
            return template.format(obj=self.object_type)
        prep = "in" if RECEPTACLE_KINDS[self.receptacle_type].inside else "on"
        return template.format(obj=self.object_type, prep=prep, recep=self.receptacle_type)


def type_of(name: str) -> str:
    """``"cabinet 2"`` → ``"cabinet"``."""
    return name.rsplit(" ", 1)[0]


@dataclass(frozen=True, eq=False)
class World:
    """What never changes during a task; ``State`` holds the rest. Names are ``"<type> <number>"``. Raises
    ``InputError`` for a house that cannot pose its goal (too few targets, no destination, appliance or lamp holder)."""

    goal: Goal
    goal_text: str
    receptacles: tuple[str, ...]
    objects: tuple[str, ...]
    lamp_at: int  # index of the receptacle ``desklamp 1`` stands on
    # Derived in __post_init__, for speed:
    openable: tuple[bool, ...] = field(init=False)
    processes: tuple[str | None, ...] = field(init=False)
    targets: tuple[int, ...] = field(init=False)  # objects of the goal's type
    destinations: tuple[int, ...] = field(init=False)  # receptacles of the goal's type
    appliances: tuple[int, ...] = field(init=False)  # receptacles doing the goal's process
    need: int = field(init=False)  # state bit a placed target must carry (0: none)

    def __post_init__(self) -> None:
        kinds = [RECEPTACLE_KINDS[type_of(r)] for r in self.receptacles]
        kind = TASK_KINDS[self.goal.task_type]
        use = kind.use
        derived = {
            "openable": tuple(k.openable for k in kinds),
            "processes": tuple(k.process for k in kinds),
            "targets": tuple(i for i, o in enumerate(self.objects) if type_of(o) == self.goal.object_type),
            "destinations": tuple(i for i, r in enumerate(self.receptacles) if type_of(r) == self.goal.receptacle_type),
            "appliances": tuple(i for i, k in enumerate(kinds) if use in PROCESS_SETS and k.process == use),
            "need": PROCESS_SETS.get(use or "", 0),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)
        unsolvable = (
            len(self.targets) < max(kind.count, 1)
            or (kind.count > 0 and not self.destinations)
            or (use in PROCESS_SETS and not self.appliances)
            or not kinds[self.lamp_at].holds_lamp
        )
        if unsolvable:
            raise InputError(f"this house cannot pose {self.goal}", field="world")

    @cached_property
    def texts(self) -> dict[Command, str]:
        """Command texts, each formatted once, on first use."""
        return _CommandTexts(self)


class State(NamedTuple):
    """Everything actions change. Hashable and immutable: snapshots are references, search needs no copies."""

    at: int  # receptacle index, -1 in the middle of the room
    held: int  # object index, -1 with empty hands
    where: tuple[int, ...]  # each object's receptacle, -1 while held
    flags: tuple[int, ...]  # each object's CLEAN | HOT | COOL bits
    opened: int  # bit r set: receptacle r is open (only read for openable ones)
    lamp_on: bool


def command_text(world: World, cmd: Command) -> str:
    """The command as the agent types it."""
    verb, o, r = cmd
    obj = world.objects[o] if o >= 0 else ""
    recep = world.receptacles[r] if r >= 0 else ""
    return COMMANDS[verb].format(obj=obj, recep=recep, thing=obj or recep, lamp=LAMP)


class _CommandTexts(dict):
    """A memo of ``command_text`` for one world."""

    def __init__(self, world: World):
        super().__init__()
        self.world = world

    def __missing__(self, cmd: Command) -> str:
        text = self[cmd] = command_text(self.world, cmd)
        return text


def accessible(world: World, state: State, r: int) -> bool:
    """Whether things can be taken from or moved into receptacle ``r``."""
    return not world.openable[r] or bool(state.opened >> r & 1)


def admissible_commands(world: World, state: State) -> dict[str, Command]:
    """The valid commands in ``state``, by their text, in a fixed order (like ALFWorld's admissible list)."""
    at, held = state.at, state.held
    cmds = [("go", -1, r) for r in range(len(world.receptacles)) if r != at]
    if at >= 0:
        if world.openable[at]:
            cmds.append(("close" if state.opened >> at & 1 else "open", -1, at))
        if accessible(world, state, at):
            if held < 0:
                cmds += [("take", o, at) for o, r in enumerate(state.where) if r == at]
            else:
                cmds.append(("move", held, at))
        process = world.processes[at]
        if held >= 0 and process is not None:
            cmds.append((process, held, at))
        if at == world.lamp_at:
            cmds.append(("use", -1, at))
        cmds.append(("examine", -1, at))
    if held >= 0:
        cmds.append(("examine", held, -1))
    cmds += [("inventory", -1, -1), ("look", -1, -1)]
    texts = world.texts
    return {texts[c]: c for c in cmds}


def normalize(action: str) -> str:
    """How actions are matched: lower case, single spaces."""
    return " ".join(action.lower().split())


def transition(state: State, cmd: Command) -> State:
    """The state after an admissible command."""
    verb, o, r = cmd
    if verb == "go":
        return state._replace(at=r)
    if verb == "open":
        return state._replace(opened=state.opened | 1 << r)
    if verb == "close":
        return state._replace(opened=state.opened & ~(1 << r))
    if verb == "take":
        return state._replace(held=o, where=_replaced(state.where, o, -1))
    if verb == "move":
        return state._replace(held=-1, where=_replaced(state.where, o, r))
    if verb in PROCESS_SETS:
        flags = state.flags[o] & ~PROCESS_CLEARS[verb] | PROCESS_SETS[verb]
        return state._replace(flags=_replaced(state.flags, o, flags))
    if verb == "use":
        return state._replace(lamp_on=not state.lamp_on)
    return state  # examine, look, inventory


def _replaced(values: tuple[int, ...], i: int, value: int) -> tuple[int, ...]:
    return values[:i] + (value,) + values[i + 1 :]


def is_won(world: World, state: State) -> bool:
    """Whether ``state`` meets the goal: the lit lamp, its place and a target in hand (look_at_obj_in_light), or
    ``count`` targets carrying the needed state bit in one destination (the other types)."""
    count = TASK_KINDS[world.goal.task_type].count
    if count == 0:
        return state.lamp_on and state.at == world.lamp_at and state.held in world.targets
    need = world.need
    placed = [state.where[o] for o in world.targets if state.flags[o] & need == need]
    return any(placed.count(d) >= count for d in world.destinations)


def _contents(world: World, state: State, r: int) -> list[str]:
    """Names of what stands on or in receptacle ``r``, the lamp first."""
    lamp = [LAMP] if r == world.lamp_at else []
    return lamp + [world.objects[o] for o, at in enumerate(state.where) if at == r]


def _view(world: World, state: State, r: int) -> str:
    """What the agent sees of receptacle ``r``."""
    name = world.receptacles[r]
    if not accessible(world, state, r):
        return OBSERVATIONS["closed_view"].format(recep=name)
    template = OBSERVATIONS["open_view" if world.openable[r] else "surface_view"]
    return template.format(recep=name, items=listing(_contents(world, state, r)))


def room_text(world: World) -> str:
    return OBSERVATIONS["room"].format(items=listing(world.receptacles))


def intro_text(world: World) -> str:
    """The first observation: the room and the task."""
    return OBSERVATIONS["intro"].format(room=room_text(world), goal=world.goal_text)


def narrate(world: World, cmd: Command, after: State) -> str:
    """The observation answering ``cmd``, given the state it led to."""
    verb, o, r = cmd
    obj = world.objects[o] if o >= 0 else ""
    recep = world.receptacles[r] if r >= 0 else ""
    if verb in ("go", "open"):
        return OBSERVATIONS["arrive" if verb == "go" else "open"].format(recep=recep, view=_view(world, after, r))
    if verb in ("close", "take", "move"):
        return OBSERVATIONS[verb].format(obj=obj, recep=recep)
    if verb in PROCESS_SETS:
        return OBSERVATIONS["process"].format(verb=verb, obj=obj, recep=recep)
    if verb == "use":
        return OBSERVATIONS["lamp_on" if after.lamp_on else "lamp_off"].format(lamp=LAMP)
    if verb == "examine":
        return DESCRIPTIONS[after.flags[o]].format(obj=obj) if o >= 0 else _view(world, after, r)
    if verb == "inventory":
        held = after.held
        return OBSERVATIONS["carrying"].format(obj=world.objects[held]) if held >= 0 else OBSERVATIONS["empty_handed"]
    return OBSERVATIONS["facing"].format(recep=world.receptacles[after.at]) if after.at >= 0 else room_text(world)
