"""What a house can hold, the six task types, and every sentence the environment can say.

All text comes from the templates here, so ``deltattg.envs.household.tasks.vocabulary`` can read the complete word list
from them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ReceptacleKind:
    openable: bool = False
    inside: bool = False  # goal text says "in" (else "on")
    process: str | None = None  # "clean", "heat" or "cool": what this appliance does to a held object
    holds_lamp: bool = False
    single: bool = False  # at most one per house


RECEPTACLE_KINDS: dict[str, ReceptacleKind] = {
    "armchair": ReceptacleKind(single=True),
    "bed": ReceptacleKind(single=True),
    "cabinet": ReceptacleKind(openable=True, inside=True),
    "coffeemachine": ReceptacleKind(inside=True, single=True),
    "coffeetable": ReceptacleKind(holds_lamp=True),
    "countertop": ReceptacleKind(),
    "desk": ReceptacleKind(holds_lamp=True),
    "diningtable": ReceptacleKind(),
    "drawer": ReceptacleKind(openable=True, inside=True),
    "dresser": ReceptacleKind(holds_lamp=True),
    "fridge": ReceptacleKind(openable=True, inside=True, process="cool", single=True),
    "garbagecan": ReceptacleKind(inside=True, single=True),
    "microwave": ReceptacleKind(openable=True, inside=True, process="heat", single=True),
    "safe": ReceptacleKind(openable=True, inside=True, single=True),
    "shelf": ReceptacleKind(),
    "sidetable": ReceptacleKind(holds_lamp=True),
    "sinkbasin": ReceptacleKind(inside=True, process="clean"),
    "sofa": ReceptacleKind(single=True),
    "stoveburner": ReceptacleKind(),
    "toilet": ReceptacleKind(single=True),
}

# What each object type affords: the processes it can undergo and whether it is looked at under the lamp.
OBJECT_AFFORDANCES: dict[str, frozenset[str]] = {
    name: frozenset(uses.split())
    for name, uses in {
        "alarmclock": "light", "apple": "clean heat cool", "book": "light", "bowl": "clean cool light",
        "bread": "heat cool", "cd": "light", "cellphone": "light", "creditcard": "light", "cup": "clean heat cool",
        "dishsponge": "clean", "egg": "clean heat cool", "fork": "clean", "keychain": "light", "knife": "clean",
        "lettuce": "clean cool", "mug": "clean heat cool light", "newspaper": "light", "pan": "clean cool",
        "pen": "light", "pencil": "light", "pillow": "light", "plate": "clean heat cool", "pot": "clean cool",
        "potato": "clean heat cool", "remotecontrol": "light", "soapbar": "clean", "spatula": "clean",
        "spoon": "clean", "statue": "light", "tomato": "clean heat cool", "vase": "light", "watch": "light",
    }.items()
}  # fmt: skip

LAMP = "desklamp 1"

# Object state bits; the bit each process sets and the one it clears (heating undoes cooling and vice versa).
CLEAN, HOT, COOL = 1, 2, 4
PROCESS_SETS = {"clean": CLEAN, "heat": HOT, "cool": COOL}
PROCESS_CLEARS = {"clean": 0, "heat": COOL, "cool": HOT}


@dataclass(frozen=True)
class TaskKind:
    use: str | None  # what the target must afford: a process, "light", or None for plain carrying
    count: int  # how many targets must end up in one destination (0: none, the target is held under the lamp)
    phrasings: tuple[str, str]  # goal templates, ALFWorld's two annotation styles


TASK_KINDS: dict[str, TaskKind] = {
    "pick_and_place_simple": TaskKind(None, 1, ("put a {obj} {prep} {recep}.", "put some {obj} {prep} {recep}.")),
    "pick_clean_then_place_in_recep": TaskKind(
        "clean", 1, ("put a clean {obj} {prep} {recep}.", "clean some {obj} and put it {prep} {recep}.")
    ),
    "pick_heat_then_place_in_recep": TaskKind(
        "heat", 1, ("put a hot {obj} {prep} {recep}.", "heat some {obj} and put it {prep} {recep}.")
    ),
    "pick_cool_then_place_in_recep": TaskKind(
        "cool", 1, ("put a cool {obj} {prep} {recep}.", "cool some {obj} and put it {prep} {recep}.")
    ),
    "pick_two_obj_and_place": TaskKind(
        None, 2, ("put two {obj} {prep} {recep}.", "find two {obj} and put them {prep} {recep}.")
    ),
    "look_at_obj_in_light": TaskKind(
        "light", 0, ("look at {obj} under the desklamp.", "examine the {obj} with the desklamp.")
    ),
}
TASK_TYPES: tuple[str, ...] = tuple(TASK_KINDS)
PREPOSITIONS = ("in", "on")

SYSTEM_PROMPT = (
    "You are a household robot. Complete the task by interacting with the room. "
    "Each turn, reply with exactly one of the admissible actions, copied verbatim, and nothing else."
)
COMMANDS = {
    "go": "go to {recep}", "open": "open {recep}", "close": "close {recep}", "take": "take {obj} from {recep}",
    "move": "move {obj} to {recep}", "clean": "clean {obj} with {recep}", "heat": "heat {obj} with {recep}",
    "cool": "cool {obj} with {recep}", "use": "use {lamp}", "examine": "examine {thing}", "look": "look",
    "inventory": "inventory",
}  # fmt: skip
OBSERVATIONS = {
    "intro": "-= Welcome to TextWorld, ALFRED! =-\n\n{room}\n\nYour task is to: {goal}",
    "room": "You are in the middle of a room. Looking quickly around you, you see {items}.",
    "arrive": "You arrive at {recep}. {view}",
    "open": "You open the {recep}. {view}",
    "closed_view": "The {recep} is closed.",
    "open_view": "The {recep} is open. In it, you see {items}.",
    "surface_view": "On the {recep}, you see {items}.",
    "close": "You close the {recep}.",
    "take": "You pick up the {obj} from the {recep}.",
    "move": "You move the {obj} to the {recep}.",
    "process": "You {verb} the {obj} using the {recep}.",
    "lamp_on": "You turn on the {lamp}.",
    "lamp_off": "You turn off the {lamp}.",
    "facing": "You are facing the {recep}. Next to it, you see nothing.",
    "carrying": "You are carrying: a {obj}.",
    "empty_handed": "You are not carrying anything.",
    "nothing": "Nothing happens.",
}
DESCRIPTIONS = {  # "examine O", by the object's state bits (ALFWorld's wording)
    0: "There's nothing special about {obj}.",
    CLEAN: "This is a clean {obj}.",
    HOT: "This is a hot {obj}.",
    COOL: "This is a cold {obj}.",
    CLEAN | HOT: "This is a hot and clean {obj}.",
    CLEAN | COOL: "This is a cool and clean {obj}.",
}
LIST_WORDS = "a , and nothing"  # what ``listing`` adds around names

_WORD = re.compile(r"[A-Za-z0-9]+|[^\sA-Za-z0-9]")


def split_words(text: str) -> list[str]:
    """Words and single punctuation marks, as a whitespace-then-punctuation pre-tokenizer splits them."""
    return _WORD.findall(text)


def listing(names: Sequence[str]) -> str:
    """ALFWorld's list style: "nothing", "a x 1", "a x 1, and a y 2", "a x 1, a y 2, and a z 1"."""
    if not names:
        return "nothing"
    if len(names) == 1:
        return f"a {names[0]}"
    return ", ".join(f"a {n}" for n in names[:-1]) + f", and a {names[-1]}"
