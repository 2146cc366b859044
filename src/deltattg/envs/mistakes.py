"""Plausible wrong steps for environments without admissible actions (BFCL, τ²-bench): what a noisy expert
(``expert:EPS``) does instead of the gold step, so that a pool of noisy experts there is diverse (paper D.1).

On household and ALFWorld a noisy expert picks a random admissible command. A tool environment has no such list, and
a random string is not a mistake anyone makes, so :class:`deltattg.envs.base.HasMistakes` environments draw one of
three mistakes a tool-using agent makes (:data:`MISTAKES`):

* ``wrong_argument`` — the gold call with one argument value changed (:func:`perturbed_value`: the last digit of a
  string or number moved on by one, a string without digits pluralised, a flag flipped, a list's last item dropped):
  an id that does not exist, a file that is not there, the wrong item changed;
* ``wrong_tool`` — another tool of the task called with the gold call's arguments (usually an error: a wasted step);
* ``give_up`` — the environment's way of ending early: the turn closed with calls still pending (BFCL), the
  conversation stopped before the work is done (τ²).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

MISTAKES = ("wrong_argument", "wrong_tool", "give_up")


def perturbed_value(value: Any) -> Any:
    """A nearby wrong value of a literal argument, or ``value`` itself when it has no obvious neighbour (None, a
    dict, an empty string or list)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 1.0
    if isinstance(value, str) and value:
        digits = [i for i, char in enumerate(value) if char in "0123456789"]
        if digits:
            i = digits[-1]
            return value[:i] + str((int(value[i]) + 1) % 10) + value[i + 1 :]
        return value + "s"
    if isinstance(value, list) and value:
        return value[:-1]
    return value


def perturbed_arguments(arguments: Mapping[str, Any], rng: random.Random) -> dict[str, Any] | None:
    """The arguments with one value (chosen with ``rng`` among those :func:`perturbed_value` changes) changed; None
    when no value can be changed."""
    changeable = [name for name, value in arguments.items() if perturbed_value(value) != value]
    if not changeable:
        return None
    name = rng.choice(changeable)
    return {**arguments, name: perturbed_value(arguments[name])}


def other_tool(name: str, tools: Sequence[str], rng: random.Random) -> str | None:
    """A tool of the task other than ``name`` (None when there is none)."""
    others = sorted(set(tools) - {name})
    return rng.choice(others) if others else None
