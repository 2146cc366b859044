"""Test-time action guidance with a frozen progress meter (§5.2, E.5).

At every step the actor proposes K candidate actions. Each distinct candidate is tried in a branch of the environment
(``snapshot``/``restore`` where the environment has them, else a replay of the actions so far), the meter reads the
resulting history, and the candidate with the largest predicted decrease in remaining work is executed in the main
environment. The cost before the step is shared by all candidates, so that is the candidate whose next state has the
lowest predicted cost c = v̂ if b̂ else C (E.5: C = 25600); ties go to the first candidate. Only the selected action
advances the main environment. The random-selection control picks one of the same K candidates uniformly.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from deltattg.envs.base import Branchable, Environment, replay
from deltattg.meter.base import Meter
from deltattg.meter.step_quality import state_cost
from deltattg.rollout.engine import Action, Episode
from deltattg.rollout.policies import LMPolicy

GUIDANCE_FAILURE_COST = 25600.0  # E.5


def try_action(episode: Episode, action: str, make_env: Callable[[], Environment] | None) -> str:
    """The observation ``action`` would produce, without advancing the episode's environment."""
    env = episode.env
    if isinstance(env, Branchable):
        state = env.snapshot()
        try:
            return env.step(action).observation
        finally:
            env.restore(state)
    if make_env is None:
        raise ValueError(f"{env.name} cannot snapshot its state: pass make_env so branches can replay the episode")
    branch, _ = replay(make_env, episode.task, [a for a, _ in episode.history])
    return branch.step(action).observation


def distinct(texts: Sequence[str]) -> list[str]:
    """Candidates in order of first appearance, each once."""
    return list(dict.fromkeys(texts))


def pick_lowest_cost(costs: Sequence[float | None]) -> int:
    """Index of the smallest predicted cost (an invalid reading never wins unless all are invalid); ties: first."""
    ranked = [(c if c is not None else float("inf"), k) for k, c in enumerate(costs)]
    return min(ranked)[1]


@dataclass
class GuidedPolicy:
    """K candidates from ``actor`` per step; ``select`` = ``meter`` (E.5 guidance) or ``random`` (the control)."""

    actor: LMPolicy
    meter: Meter | None
    candidates: int = 4
    select: str = "meter"
    failure_cost: float = GUIDANCE_FAILURE_COST
    make_env: Callable[[], Environment] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.select not in ("meter", "random"):
            raise ValueError(f"select must be 'meter' or 'random', got {self.select!r}")
        if self.select == "meter" and self.meter is None:
            raise ValueError("meter-guided selection needs a meter")
        self.name = f"{self.actor.name}+{self.select}-of-{self.candidates}"
        self.rng = random.Random(self.seed)

    def act(self, episodes: Sequence[Episode]) -> list[Action]:
        proposals = self.actor.act([e for e in episodes for _ in range(self.candidates)])
        per_episode = [proposals[k * self.candidates : (k + 1) * self.candidates] for k in range(len(episodes))]
        if self.select == "random":
            return [self.rng.choice(options) for options in per_episode]
        histories, owners = [], []
        for k, (episode, options) in enumerate(zip(episodes, per_episode)):
            for text in distinct([a.text for a in options]):
                observation = try_action(episode, text, self.make_env)
                histories.append(episode.messages + [{"role": "assistant", "content": text},
                                                     {"role": "user", "content": observation}])
                owners.append((k, text))
        assert self.meter is not None
        costs = [state_cost(r, self.failure_cost) for r in self.meter.score(histories)]
        chosen = []
        for k, options in enumerate(per_episode):
            mine = [(text, cost) for (owner, text), cost in zip(owners, costs) if owner == k]
            best_text = mine[pick_lowest_cost([c for _, c in mine])][0]
            chosen.append(next(a for a in options if a.text == best_text))
        return chosen
