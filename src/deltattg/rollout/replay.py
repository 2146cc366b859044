"""Resume an episode at a recorded state: the environment put back by a checked replay (``envs.replay``), and the
record's transcript, history and reward so far, so any policy can play on from there (``rollout.completions``).

    episode = resume(recorded, t)                    # a running Episode at s_t (None if s_t does not reproduce)
    other = copy_episode(episode, make_env(), k)     # another copy of it through snapshot/restore (None: replay)
"""

from __future__ import annotations

from deltattg.data.trajectory import assistant_indices
from deltattg.envs.base import Branchable, Environment, StepResult
from deltattg.envs.replay import RecordedEpisode, ReplayMismatch, walk
from deltattg.rollout.engine import Episode


def resume(recorded: RecordedEpisode, t: int, env: Environment | None = None, index: int = 0) -> Episode | None:
    """A running :class:`Episode` at state s_t of the record (its transcript, history and reward so far), on ``env``
    (a fresh one by default) reset and replayed to it; ``None`` when s_t does not reproduce."""
    if not 0 <= t <= recorded.num_steps:
        raise ValueError(f"state {t} of a record with {recorded.num_steps} actions")
    env = env or recorded.make_env()
    last: StepResult | None = None
    reward = 0.0
    try:
        for _, last in walk(recorded, env, t):
            reward += last.reward if last is not None else 0.0
    except ReplayMismatch:
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
