"""The rollout engine: batched multi-turn episodes of any policy in any environment, recorded as trajectories.

Each turn, every unfinished episode asks the policy for an action in ONE batched call (an LM policy generates for
all of them at once), then each environment steps. Every step records the observation it acted on, the prompt ids,
the assistant token ids and their log-probs under the sampling policy (LM policies), the reward and the outcome the
environment verified (``envs.base.verified_outcome``: the action was admissible, the tool calls ran without error).
Where the policy knows each action's provenance (the noisy expert: its own action or a deliberate mistake), the record
carries it as AgentProcessBench-style ``step_labels`` (:func:`provenance_step_labels`), which ``eval-steps`` reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tqdm import tqdm

from deltattg.data.trajectory import Step, Trajectory, assistant_indices
from deltattg.envs.base import Describable, Environment, Task, verified_outcome


@dataclass
class Action:
    """What the policy produced (``text``, its token ids and log-probs, the prompt it read) and, where the
    environment is to see only part of it (ReAct: the action after the thought), that part as ``env_text``."""

    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    prompt_ids: list[int] | None = None
    env_text: str | None = None
    mistake: bool | None = None  # the noisy expert's provenance: True a deliberate mistake, False its own action

    @property
    def command(self) -> str:
        """What the environment executes: ``env_text`` when set, else the whole ``text``."""
        return self.text if self.env_text is None else self.env_text


@dataclass
class Episode:
    """One running episode: its environment, what happened so far and the chat transcript."""

    env: Environment
    task: Task
    index: int  # position within its task's group
    messages: list[dict]
    first_observation: str
    observation: str
    admissible: list[str] | None
    history: list[tuple[str, str]] = field(default_factory=list)  # (command executed, observation after it)
    steps: list[Step] = field(default_factory=list)
    mistakes: list[bool | None] = field(default_factory=list)  # each action's ``Action.mistake``
    reward: float = 0.0
    done: bool = False
    won: bool = False


class Policy(Protocol):
    name: str

    def act(self, episodes: Sequence[Episode]) -> list[Action]: ...


def with_memory(system_prompt: str, memory: Sequence[str]) -> str:
    """The system prompt followed by the reflections of earlier trials of the task (Reflexion), if any."""
    if not memory:
        return system_prompt
    notes = "\n".join(f"- {note}" for note in memory)
    return f"{system_prompt}\n\nYour reflections on earlier failed trials of this task:\n{notes}"


def start_episode(env: Environment, task: Task, index: int, memory: Sequence[str] = ()) -> Episode:
    """A fresh episode of ``task``; ``memory`` (Reflexion's reflections) is appended to the system message."""
    observation = env.reset(task)
    messages = [{"role": "system", "content": with_memory(env.system_prompt, memory)},
                {"role": "user", "content": observation}]  # fmt: skip
    return Episode(env, task, index, messages, observation, observation, env.admissible_actions())


def advance(episode: Episode, action: Action) -> None:
    """Execute ``action.command`` in the episode's environment and record the step: the transcript keeps the whole
    reply (``action.text``: a ReAct thought too), ``history`` the command executed (what a replay repeats)."""
    result = episode.env.step(action.command)
    episode.steps.append(
        Step(
            observation=episode.observation,
            token_ids=action.token_ids,
            logprobs=action.logprobs,
            prompt_ids=action.prompt_ids,
            reward=result.reward,
            verified=verified_outcome(result.info),
            command=action.env_text,
            error=service_error(result.info),
        )
    )
    episode.messages += [{"role": "assistant", "content": action.text}, {"role": "user", "content": result.observation}]
    episode.mistakes.append(action.mistake)
    episode.history.append((action.command, result.observation))
    episode.observation = result.observation
    episode.admissible = result.info.get("admissible")
    episode.reward += result.reward
    episode.won = result.won
    episode.done = result.done


def service_error(info: dict) -> str | None:
    """Why the environment could not carry a step out (``info["error"]``: its retrieval server, scenario server or
    verifier failed), or None."""
    error = info.get("error")
    return error if isinstance(error, str) and error else None


def failed_steps(trajectory: Trajectory) -> int:
    """How many of a trajectory's steps the environment could not carry out (``Step.error``)."""
    return sum(step.error is not None for step in trajectory.steps or [])


def service_warning(steps: int, episodes: int, total: int) -> str | None:
    """The warning for ``steps`` steps in ``episodes`` of ``total`` episodes that the environment could not carry
    out; None when there are none."""
    if not steps:
        return None
    return (f"warning: the environment could not carry out {steps} steps in {episodes} of {total} episodes (its "
            "retrieval server, scenario server or verifier failed): their outcomes are not the policy's; each step's "
            "error is in its record")  # fmt: skip


def provenance(episode: Episode, max_turns: int) -> dict:
    """Where the trajectory came from: its ``task`` (id, split and, for environments that can rebuild themselves, the
    task's data) and its ``env`` (``describe()`` and the turn limit the episode ran under) — enough for the oracle
    meter and ``inspect`` to replay it."""
    task = {"id": episode.task.id, "split": episode.task.split}
    env = {"name": episode.env.name, "max_turns": min(max_turns, episode.env.max_steps)}
    if isinstance(episode.env, Describable):
        task["data"] = episode.task.data
        env |= episode.env.describe()
    return {"task": task, "env": env}


def provenance_step_labels(messages: list[dict], mistakes: Sequence[bool | None]) -> dict[str, int] | None:
    """Step labels in AgentProcessBench's form ({assistant message index: label}) from each action's provenance: +1
    the expert's own action, −1 a deliberate mistake; ``None`` unless every action's provenance is known. The labels
    are what the policy meant, not what the step did: a mistake drawn from the admissible actions can happen to be
    the expert's action or a harmless one, and it still counts as harmful."""
    if not mistakes or any(m is None for m in mistakes):
        return None
    return {str(index): -1 if mistake else 1 for index, mistake in zip(assistant_indices(messages), mistakes)}


def to_trajectory(episode: Episode, policy: str, run: str, max_turns: int) -> Trajectory:
    recorded = all(step.token_ids is not None for step in episode.steps)
    extra = provenance(episode, max_turns)
    labels = provenance_step_labels(episode.messages, episode.mistakes)
    if labels is not None:
        extra |= {"step_labels": labels, "data_source": episode.env.name}
    return Trajectory(
        id=f"{run}{episode.task.id}#{episode.index}",
        group=episode.task.id,
        reward=episode.reward,
        success=episode.won,
        messages=episode.messages,
        step_tokens=[len(step.token_ids) for step in episode.steps] if recorded else None,  # type: ignore[arg-type]
        policy=policy,
        steps=episode.steps,
        extra=extra,
    )


def run_episodes(
    make_env: Callable[[], Environment],
    tasks: Sequence[Task],
    policy: Policy,
    *,
    group_size: int = 1,
    max_turns: int | None = None,
    run: str = "",
    progress: bool = False,
    on_finish: Callable[[Trajectory], None] | None = None,
    memory: Mapping[str, Sequence[str]] | None = None,
) -> list[Trajectory]:
    """``group_size`` episodes of every task with ``policy``; stops each at done or after ``max_turns`` actions
    (default: the environment's ``max_steps``). Returns trajectories grouped by task, in task order; ``on_finish``
    also gets each one as soon as its episode ends (``deltattg evaluate`` appends it to its output then).
    ``memory``: task id → reflections shown in that task's system prompt (``rollout.reflexion``)."""
    memory = memory or {}
    episodes = [start_episode(make_env(), task, k, memory.get(task.id, ())) for task in tasks
                for k in range(group_size)]  # fmt: skip
    limit = max_turns if max_turns is not None else max(e.env.max_steps for e in episodes)
    finished: dict[int, Trajectory] = {}

    def finish(k: int) -> None:
        finished[k] = to_trajectory(episodes[k], policy.name, run, limit)
        if on_finish is not None:
            on_finish(finished[k])

    play(episodes, policy, [limit] * len(episodes), on_end=finish,
         bar=tqdm(total=len(episodes), desc=f"rollout {policy.name}", unit="ep", disable=not progress))
    return [finished[k] for k in range(len(episodes))]


def play(episodes: Sequence[Episode], policy: Policy, actions_left: Sequence[int], *,
         on_end: Callable[[int], None] | None = None, bar: tqdm | None = None) -> None:
    """Play ``episodes`` together with ``policy`` (one batched ``act`` per turn) until each is done or has taken
    ``actions_left[k]`` more actions; ``on_end(k)`` when episode k ends, in the order they end (those that run out
    of actions last, in order). Episodes may start anywhere: fresh (:func:`start_episode`) or resumed mid-way
    (``rollout.replay.resume``)."""
    taken = [0] * len(episodes)
    ended: set[int] = set()

    def end(k: int) -> None:
        ended.add(k)
        if bar is not None:
            bar.update(1)
        if on_end is not None:
            on_end(k)

    horizon = max(actions_left, default=0)
    for turn in range(horizon):
        active = [k for k, e in enumerate(episodes) if not e.done and taken[k] < actions_left[k]]
        if not active:
            break
        if bar is not None:
            bar.set_postfix_str(f"turn {turn + 1}/{horizon}")  # episodes often finish together, at the turn limit
        for k, action in zip(active, policy.act([episodes[k] for k in active])):
            advance(episodes[k], action)
            taken[k] += 1
            if episodes[k].done:
                end(k)
    for k in range(len(episodes)):
        if k not in ended:  # ran out of actions
            end(k)
    if bar is not None:
        bar.close()
