"""Put an environment back into a recorded state, and check that it got there.

A rollout record carries its provenance (``env``: the environment's ``describe()`` and the turn limit; ``task``: id,
split and data; written by ``rollout.engine``). From it the environment is rebuilt, reset to the task and stepped
through the record's first t actions (what the environment executed: ``steps[t].command`` where the record has one,
else the reply). Every observation on the way must come out exactly as recorded; state s_t *replays* when the reset
and the t actions before it all did. A state that does not is never relabelled silently: :class:`ReplayCheck`
counts it, and the label sources (``rollout.label_sources``) fall back to the record's own outcome there and say so.

    recorded = recorded_episode(trajectory)          # InputError without provenance
    check = check_replay(recorded)                   # how many of s_0..s_T reproduce
    episode = resume(recorded, t)                    # a running Episode at s_t (None if s_t does not reproduce)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from deltattg.data.trajectory import Trajectory, assistant_indices, text_of
from deltattg.envs.base import Branchable, Environment, StepResult, Task
from deltattg.errors import InputError
from deltattg.rollout.engine import Episode


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

    @property
    def num_steps(self) -> int:
        return len(self.commands)


def _provenance(trajectory: Trajectory, name: str) -> dict[str, Any]:
    value = trajectory.extra.get(name)
    if not isinstance(value, dict):
        raise InputError(f"missing: replaying a trajectory needs the {name} it was recorded in (rollouts of "
                         "`deltattg collect`, `evaluate` and `train` carry it)", field=name)  # fmt: skip
    return value


def recorded_task(trajectory: Trajectory) -> Task:
    """The :class:`Task` of a record's ``task`` provenance."""
    task = _provenance(trajectory, "task")
    if not isinstance(task.get("id"), str) or not isinstance(task.get("data", {}), dict):
        raise InputError('expected {"id": ..., "split": ..., "data": {...}}', field="task")
    return Task(task["id"], str(task.get("split", "train")), dict(task.get("data") or {}))


def record_turn_limit(trajectory: Trajectory, default: int) -> int:
    """The turn limit a record's episode ran under (``env.max_turns``; ``default`` where it has none)."""
    limit = _provenance(trajectory, "env").get("max_turns", default)
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


def recorded_observations(messages: list[dict]) -> list[str | None]:
    """The observation before each action and after the last (t = 0..T), as the record holds them: the first user
    message for t = 0, then the user message right after action t − 1; None where there is none."""
    first = next((m for m in messages if m.get("role") == "user"), None)
    out: list[str | None] = [text_of(first.get("content")) if first else None]
    for index in assistant_indices(messages):
        following = messages[index + 1] if index + 1 < len(messages) else None
        out.append(text_of(following.get("content")) if following and following.get("role") == "user" else None)
    return out


def recorded_episode(trajectory: Trajectory, make_env: Callable[[], Environment] | None = None,
                     max_turns: int | None = None) -> RecordedEpisode:
    """The record's :class:`RecordedEpisode`: its environment rebuilt from its ``env`` description, or ``make_env``
    where given (the command line's environment options); its turn limit from ``env.max_turns``, else ``max_turns``,
    else the environment's own. ``InputError`` naming the field when it lacks provenance or messages, or its
    environment cannot be rebuilt here (an extra not installed, data not found)."""
    from deltattg.envs.registry import rebuild

    description = _provenance(trajectory, "env")
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
    return RecordedEpisode(trajectory, make_env, task, max_turns, tuple(executed_commands(trajectory)),
                           tuple(recorded_observations(trajectory.messages)))  # fmt: skip


@dataclass(frozen=True)
class ReplayCheck:
    """How far a record replays: states s_0..s_{replayed−1} reproduced out of its T + 1 (s_T after the last action),
    and, where one did not, which observation differed (or what failed) — ``mismatch``."""

    replayed: int
    states: int
    mismatch: str | None = None

    @property
    def exact(self) -> bool:
        return self.replayed == self.states


def _walk(recorded: RecordedEpisode, env: Environment, upto: int) -> Iterator[tuple[int, StepResult | None]]:
    """Reset ``env`` to the record's task and step it through its actions, yielding ``(t, last result)`` at each state
    s_t, t = 0..upto, that reproduced; raises ``_Mismatch`` at the first that did not."""
    try:
        observation = env.reset(recorded.task)
    except Exception as exc:  # noqa: BLE001 - any failure of a foreign environment is "does not replay"
        raise _Mismatch(f"reset failed: {type(exc).__name__}: {exc}") from None
    if recorded.observations[0] is not None and observation != recorded.observations[0]:
        raise _Mismatch("the first observation differs from the recorded one (another environment, options or task?)")
    yield 0, None
    for t in range(upto):
        try:
            result = env.step(recorded.commands[t])
        except Exception as exc:  # noqa: BLE001
            raise _Mismatch(f"action {t} failed: {type(exc).__name__}: {exc}") from None
        expected = recorded.observations[t + 1]
        if expected is not None and result.observation != expected:
            raise _Mismatch(f"the observation after action {t} differs from the recorded one")
        yield t + 1, result


class _Mismatch(Exception):
    pass


def check_replay(recorded: RecordedEpisode, make_env: Callable[[], Environment] | None = None) -> ReplayCheck:
    """Replay the whole record once and count the states that reproduce (:class:`ReplayCheck`)."""
    env = (make_env or recorded.make_env)()
    states = recorded.num_steps + 1
    reached = 0
    try:
        for t, _ in _walk(recorded, env, recorded.num_steps):
            reached = t + 1
    except _Mismatch as exc:
        return ReplayCheck(reached, states, str(exc))
    finally:
        _close(env)
    return ReplayCheck(reached, states)


def resume(recorded: RecordedEpisode, t: int, env: Environment | None = None, index: int = 0) -> Episode | None:
    """A running :class:`Episode` at state s_t of the record (its transcript, history and reward so far), on ``env``
    (a fresh one by default) reset and replayed to it; ``None`` when s_t does not reproduce."""
    if not 0 <= t <= recorded.num_steps:
        raise ValueError(f"state {t} of a record with {recorded.num_steps} actions")
    env = env or recorded.make_env()
    last: StepResult | None = None
    reward = 0.0
    try:
        for _, last in _walk(recorded, env, t):
            reward += last.reward if last is not None else 0.0
    except _Mismatch:
        return None
    messages = recorded.trajectory.messages or []
    cut = ([*assistant_indices(messages), len(messages)])[t]
    first = recorded.observations[0] or ""
    observation = recorded.observations[t] or (last.observation if last else first)
    admissible = env.admissible_actions() if last is None else last.info.get("admissible", env.admissible_actions())
    episode = Episode(env, recorded.task, index, [dict(m) for m in messages[:cut]], first, observation, admissible)
    episode.history = [(recorded.commands[u], recorded.observations[u + 1] or "") for u in range(t)]
    episode.reward = reward
    episode.done = bool(last is not None and last.done)
    episode.won = bool(last is not None and last.won)
    return episode


def copy_episode(episode: Episode, env: Environment, index: int) -> Episode | None:
    """Another copy of a running episode on ``env``, through the environment's ``snapshot``/``restore`` (one replay
    then serves every copy); ``None`` where the environment cannot branch (the caller replays instead)."""
    if not isinstance(episode.env, Branchable) or not isinstance(env, Branchable):
        return None
    env.reset(episode.task)
    env.restore(episode.env.snapshot())
    copy = Episode(env, episode.task, index, [dict(m) for m in episode.messages], episode.first_observation,
                   episode.observation, None if episode.admissible is None else list(episode.admissible))
    copy.history, copy.reward, copy.done, copy.won = list(episode.history), episode.reward, episode.done, episode.won
    return copy


def _close(env: Environment) -> None:
    close = getattr(env, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass
