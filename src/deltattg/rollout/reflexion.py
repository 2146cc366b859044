"""The Reflexion baseline (Shinn et al., 2023) as ``deltattg evaluate --actor reflexion:MODEL``.

Each task is played for up to ``TRIALS`` trials. After a failed trial the actor writes a short self-reflection (one
generate call reading the failed trial's transcript and ``REFLECTION_PROMPT``); the task's reflections so far are kept
in a memory that the next trial's system prompt shows (``rollout.engine.with_memory``). The task succeeds if any trial
does; it stops at the first success. The actor is ReAct (``react:MODEL``'s prompt and action parsing).

Trials of all the tasks still running are played together (one ``run_episodes`` call per trial, one batched generate
call per turn; one batched call for the reflections of a trial's failures). Each task yields one trajectory, that of
its last trial (the successful one, or the third failure), with ``reflexion``: ``trials`` (how many were played),
``max_trials``, ``outcomes`` (success of each trial) and ``reflections`` (the memory its last trial was shown).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from deltattg.data.trajectory import Trajectory
from deltattg.envs.base import Environment, Task
from deltattg.rollout.engine import Action, Episode, run_episodes
from deltattg.rollout.policies import ChatPolicy

TRIALS = 3
REFLECTION_KEY = "reflexion"  # the trajectory field (``extra``) that holds a task's trial record
REFLECTION_SYSTEM = "You review a failed attempt at a task in a text environment."
REFLECTION_PROMPT = ("The attempt above failed. In two or three sentences, say what went wrong and give a concrete "
                     "plan for the next attempt at the same task.")  # fmt: skip


class ReflexionActor(Protocol):
    """What ``run_reflexion`` needs: a policy that also writes one reflection per failed trajectory."""

    name: str

    def act(self, episodes: Sequence[Episode]) -> list[Action]: ...

    def reflect(self, trajectories: Sequence[Trajectory]) -> list[str]: ...


def reflection_messages(trajectory: Trajectory) -> list[dict]:
    """The reflection prompt of a failed trajectory: its transcript (observations, ``> reply`` lines, the system
    prompt left out) then ``REFLECTION_PROMPT``."""
    lines = []
    for message in (trajectory.messages or [])[1:]:
        content = str(message.get("content", ""))
        lines.append(f"> {content}" if message.get("role") == "assistant" else content)
    return [{"role": "system", "content": REFLECTION_SYSTEM},
            {"role": "user", "content": "\n".join(lines) + f"\n\n{REFLECTION_PROMPT}"}]  # fmt: skip


class Reflexion:
    """A chat LM actor (ReAct, ``prompt.react``) plus the reflection step: ``reflect`` generates, in batches of the
    actor's sampling batch size, one reply per failed trajectory with the actor's sampling settings."""

    def __init__(self, policy: ChatPolicy):
        self.policy = policy
        self.name = policy.name

    def act(self, episodes: Sequence[Episode]) -> list[Action]:
        return self.policy.act(episodes)

    def reflect(self, trajectories: Sequence[Trajectory]) -> list[str]:
        replies = self.policy.generate_all([self.policy.encode(reflection_messages(t)) for t in trajectories])
        return [reply.text.strip() for reply in replies]


def run_reflexion(
    make_env: Callable[[], Environment],
    tasks: Sequence[Task],
    actor: ReflexionActor,
    *,
    trials: int = TRIALS,
    max_turns: int | None = None,
    run: str = "",
    on_finish: Callable[[Trajectory], None] | None = None,
) -> list[Trajectory]:
    """Up to ``trials`` trials of every task (see the module doc); returns each task's last trial, in task order,
    and hands each to ``on_finish`` as soon as its task is settled (a success, or its last trial failed)."""
    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}")
    memory: dict[str, list[str]] = {task.id: [] for task in tasks}
    outcomes: dict[str, list[bool]] = {task.id: [] for task in tasks}
    final: dict[str, Trajectory] = {}
    pending = list(tasks)
    for trial in range(1, trials + 1):
        if not pending:
            break
        shown = {task.id: list(memory[task.id]) for task in pending}
        played = run_episodes(make_env, pending, actor, max_turns=max_turns, run=run, memory=shown)
        failed: list[tuple[Task, Trajectory]] = []
        for task, trajectory in zip(pending, played):
            outcomes[task.id].append(trajectory.success)
            if trajectory.success or trial == trials:
                trajectory.extra[REFLECTION_KEY] = {"trials": trial, "max_trials": trials,
                                                    "outcomes": list(outcomes[task.id]),
                                                    "reflections": shown[task.id]}  # fmt: skip
                final[task.id] = trajectory
                if on_finish is not None:
                    on_finish(trajectory)
            else:
                failed.append((task, trajectory))
        if failed:
            notes = actor.reflect([trajectory for _, trajectory in failed])
            for (task, _), note in zip(failed, notes, strict=True):
                memory[task.id].append(note)
        pending = [task for task, _ in failed]
    return [final[task.id] for task in tasks]


def trials_used(trajectory: Trajectory) -> int:
    """How many trials a trajectory's task took (1 for a trajectory not played by ``run_reflexion``)."""
    record = trajectory.extra.get(REFLECTION_KEY)
    return int(record.get("trials", 1)) if isinstance(record, dict) else 1
