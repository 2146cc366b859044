"""Put an environment back into a recorded state, and check that it got there (``rollout.replay`` resumes an
episode there).

A rollout record carries its provenance (``env``: the environment's ``describe()`` and the turn limit; ``task``: id,
split and data; written by ``rollout.engine``). From it the environment is rebuilt, reset to the task and stepped
through the record's first t actions (what the environment executed: ``steps[t].command`` where the record has one,
else the reply). Every observation on the way must come out exactly as recorded; state s_t *replays* when the reset
and the t actions before it all did. A state that does not is never relabelled silently: :class:`ReplayCheck`
counts it, and the label sources (``rollout.label_sources``) fall back to the record's own outcome there and say so.

    recorded = recorded_episode(trajectory)          # InputError without provenance
    check = check_replay(recorded)                   # how many of s_0..s_T reproduce
    for t, env, result in walk(recorded, env, upto): # stepping it yourself (ReplayMismatch where it differs)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from deltattg.data.trajectory import Trajectory, assistant_indices, text_of
from deltattg.envs.base import Environment, StepResult, Task
from deltattg.errors import InputError


@dataclass(frozen=True)
class RecordedEpisode:
    """What a record says about how its episode was played: how to rebuild its environment, its task, the turn limit
    it ran under, the commands each action executed and the observations the environment answered."""

    trajectory: Trajectory
    make_env: Callable[[], Environment]
    task: Task
    max_turns: int
    commands: tuple[str, ...]  # executed by action t = 0..T−1
    observations: tuple[str | None, ...]  # the observation before action t and after the last (t = 0..T)
    where: tuple[int | None, ...]  # the message index of each observation (None where the record has none)

    @property
    def num_steps(self) -> int:
        return len(self.commands)


def provenance(trajectory: Trajectory, name: str) -> dict[str, Any]:
    """The record's ``env`` or ``task`` provenance (an object); ``InputError`` naming it when it is missing."""
    value = trajectory.extra.get(name)
    if not isinstance(value, dict):
        raise InputError(f"missing: replaying a trajectory needs the {name} it was recorded in (rollouts of "
                         "`deltattg collect`, `evaluate` and `train` carry it)", field=name)  # fmt: skip
    return value


def recorded_task(trajectory: Trajectory) -> Task:
    """The :class:`Task` of a record's ``task`` provenance."""
    task = provenance(trajectory, "task")
    if not isinstance(task.get("id"), str) or not isinstance(task.get("data", {}), dict):
        raise InputError('expected {"id": ..., "split": ..., "data": {...}}', field="task")
    return Task(task["id"], str(task.get("split", "train")), dict(task.get("data") or {}))


def record_turn_limit(trajectory: Trajectory, default: int) -> int:
    """The turn limit a record's episode ran under (``env.max_turns``; ``default`` where it has none)."""
    limit = provenance(trajectory, "env").get("max_turns", default)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InputError(f"must be a positive integer, got {limit!r}", field="env.max_turns")
    return limit


def executed_commands(trajectory: Trajectory) -> list[str]:
    """What the environment executed at each action: ``steps[t].command`` where recorded, else the reply's text."""
    messages = trajectory.messages or []
    replies = [text_of(messages[index].get("content")) for index in assistant_indices(messages)]
    steps = trajectory.steps or []
    if len(steps) == len(replies):
        return [step.command if step.command is not None else reply for step, reply in zip(steps, replies)]
    return replies


def recorded_observations(messages: list[dict]) -> tuple[list[str | None], list[int | None]]:
    """The observation before each action and after the last (t = 0..T), as the record holds them — the first user
    message for t = 0, then the user message right after action t − 1 (None where there is none) — and the index of
    each in ``messages``."""
    first = next((k for k, m in enumerate(messages) if m.get("role") == "user"), None)
    where: list[int | None] = [first]
    for index in assistant_indices(messages):
        after = index + 1 < len(messages) and messages[index + 1].get("role") == "user"
        where.append(index + 1 if after else None)
    return [None if k is None else text_of(messages[k].get("content")) for k in where], where


def recorded_episode(trajectory: Trajectory, make_env: Callable[[], Environment] | None = None,
                     max_turns: int | None = None) -> RecordedEpisode:
    """The record's :class:`RecordedEpisode`: its environment rebuilt from its ``env`` description, or ``make_env``
    where given (the command line's environment options); its turn limit from ``env.max_turns``, else ``max_turns``,
    else the environment's own. ``InputError`` naming the field when it lacks provenance or messages, or its
    environment cannot be rebuilt here (an extra not installed, data not found)."""
    from deltattg.envs.registry import rebuild

    description = provenance(trajectory, "env")
    task = recorded_task(trajectory)
    if trajectory.messages is None:
        raise InputError("replaying needs the trajectory's messages", field="messages")
    if make_env is None:
        try:
            make_env = rebuild(description)
        except (ValueError, TypeError, ImportError) as exc:
            raise InputError(f"cannot rebuild the environment: {exc}", field="env") from None
    if "max_turns" not in description and max_turns is None:
        max_turns = make_env().max_steps
    max_turns = record_turn_limit(trajectory, max_turns or 1)
    observations, where = recorded_observations(trajectory.messages)
    return RecordedEpisode(trajectory, make_env, task, max_turns, tuple(executed_commands(trajectory)),
                           tuple(observations), tuple(where))  # fmt: skip


@dataclass(frozen=True)
class ReplayCheck:
    """How far a record replays: states s_0..s_{replayed−1} reproduced out of its T + 1 (s_T after the last action),
    and, where one did not, why (``mismatch``, a cause that counts alike across records) and where in the record
    (``field``)."""

    replayed: int
    states: int
    mismatch: str | None = None
    field: str | None = None

    @property
    def exact(self) -> bool:
        return self.replayed == self.states


class ReplayMismatch(InputError):
    """The environment did not reproduce the record here (the field names the message or provenance)."""


def _assistant_field(recorded: RecordedEpisode, t: int) -> str:
    return f"messages[{assistant_indices(recorded.trajectory.messages or [])[t]}]"


def walk(recorded: RecordedEpisode, env: Environment, upto: int) -> Iterator[tuple[int, StepResult | None]]:
    """Reset ``env`` to the record's task and step it through its first ``upto`` actions, yielding ``(t, the last
    result)`` at each state s_t that reproduced (t = 0..upto; None before the first action); raises
    :class:`ReplayMismatch` naming the record's field at the first that did not."""
    try:
        observation = env.reset(recorded.task)
    except Exception as exc:  # noqa: BLE001 - any failure of a foreign environment is "does not replay"
        raise ReplayMismatch(f"the reset failed ({type(exc).__name__}: {exc})", field="task") from None
    if recorded.observations[0] is not None and observation != recorded.observations[0]:
        raise ReplayMismatch("does not replay: the environment's first observation differs from the recorded one "
                             "(another environment, options or task?)", field=f"messages[{recorded.where[0]}].content")
    yield 0, None
    result: StepResult | None = None
    for t in range(upto):
        if result is not None and result.done:
            raise ReplayMismatch("an action after the episode ended", field=_assistant_field(recorded, t))
        try:
            result = env.step(recorded.commands[t])
        except Exception as exc:  # noqa: BLE001
            raise ReplayMismatch(f"the action failed ({type(exc).__name__}: {exc})",
                                 field=_assistant_field(recorded, t)) from None  # fmt: skip
        expected = recorded.observations[t + 1]
        if expected is not None and result.observation != expected:
            raise ReplayMismatch("does not replay: the environment's observation here differs from the recorded one "
                                 "(another environment, options or task?)",
                                 field=f"messages[{recorded.where[t + 1]}].content")  # fmt: skip
        yield t + 1, result


def check_replay(recorded: RecordedEpisode, make_env: Callable[[], Environment] | None = None) -> ReplayCheck:
    """Replay the whole record once and count the states that reproduce (:class:`ReplayCheck`)."""
    env = (make_env or recorded.make_env)()
    states = recorded.num_steps + 1
    reached = 0
    try:
        for t, _ in walk(recorded, env, recorded.num_steps):
            reached = t + 1
    except ReplayMismatch as exc:
        return ReplayCheck(reached, states, exc.message.split(" (")[0], exc.field)
    finally:
        close(env)
    return ReplayCheck(reached, states)


def close(env: Environment) -> None:
    """Close an environment that holds resources (a server, a subprocess), best effort."""
    closer = getattr(env, "close", None)
    if callable(closer):
        try:
            closer()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass
