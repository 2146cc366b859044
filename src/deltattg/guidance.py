"""Test-time action guidance with a frozen progress meter (§5.2, E.5).

At every step the actor proposes K candidate actions. Each distinct candidate is tried in a branch of the environment
(``snapshot``/``restore`` where the environment has them, else a replay of the actions so far), the meter reads the
resulting history, and the candidate with the largest predicted decrease in remaining work is executed in the main
environment. The cost before the step is shared by all candidates, so that is the candidate whose next state has the
lowest predicted cost c = v̂ if b̂ else C (E.5: C = 25600); ties go to the first candidate. Only the selected action
advances the main environment. The random-selection control picks one of the same K candidates uniformly.

A meter that reads whole trajectory records (``score_records``: the household oracle) gets each candidate's branch as
a record with the episode's provenance and reads its last state; any other meter reads the branch's messages.

``compare_guidance`` runs the three arms of Table 9 (natural rollout, random-of-K, meter-of-K) on the same tasks from
the same seed, and times the meter (``deltattg guide`` and the demo's stage 5).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from deltattg.envs.base import Branchable, Environment, replay_on
from deltattg.meter.base import Meter
from deltattg.meter.step_quality import state_cost
from deltattg.data.trajectory import MeterOutput, Trajectory
from deltattg.rollout.engine import Action, Episode, Policy, provenance, run_episodes

GUIDANCE_FAILURE_COST = 25600.0  # E.5


@dataclass
class Branches:
    """Environments to try candidate actions in, off the main episode: one per task, made by ``make_env`` on first
    use and reset for every replay (on ALFWorld, loading a game costs more than replaying a few steps of it)."""

    make_env: Callable[[], Environment]
    envs: dict[str, Environment] = field(default_factory=dict)

    def at(self, episode: Episode) -> Environment:
        """An environment in the state the episode has reached (its actions replayed)."""
        env = self.envs.get(episode.task.id)
        if env is None:
            env = self.envs[episode.task.id] = self.make_env()
        replay_on(env, episode.task, [a for a, _ in episode.history])
        return env


def try_action(episode: Episode, action: str, branches: Branches | None) -> str:
    """The observation ``action`` would produce, without advancing the episode's environment."""
    env = episode.env
    if isinstance(env, Branchable):
        state = env.snapshot()
        try:
            return env.step(action).observation
        finally:
            env.restore(state)
    if branches is None:
        raise ValueError(f"{env.name} cannot snapshot its state: pass make_env so branches can replay the episode")
    return branches.at(episode).step(action).observation


def distinct(texts: Sequence[str]) -> list[str]:
    """Candidates in order of first appearance, each once."""
    return list(dict.fromkeys(texts))


def pick_lowest_cost(costs: Sequence[float | None]) -> int:
    """Index of the smallest predicted cost (an invalid reading never wins unless all are invalid); ties: first."""
    ranked = [(c if c is not None else float("inf"), k) for k, c in enumerate(costs)]
    return min(ranked)[1]


@dataclass
class GuidedPolicy:
    """K candidates from ``actor`` per step; ``select`` = ``meter`` (E.5 guidance) or ``random`` (the control).
    ``max_turns``: the episode's turn limit as a record-reading meter sees it (default: the environment's);
    ``meter_seconds`` accumulates the time spent in the meter."""

    actor: Policy
    meter: Meter | None
    candidates: int = 4
    select: str = "meter"
    failure_cost: float = GUIDANCE_FAILURE_COST
    make_env: Callable[[], Environment] | None = None
    seed: int = 0
    max_turns: int | None = None

    def __post_init__(self) -> None:
        if self.select not in ("meter", "random"):
            raise ValueError(f"select must be 'meter' or 'random', got {self.select!r}")
        if self.select == "meter" and self.meter is None:
            raise ValueError("meter-guided selection needs a meter")
        self.name = f"{self.actor.name}+{self.select}-of-{self.candidates}"
        self.rng = random.Random(self.seed)
        self.meter_seconds = 0.0
        self.branches = Branches(self.make_env) if self.make_env is not None else None

    def read(self, branches: Sequence[tuple[Episode, list[dict]]]) -> list[MeterOutput | None]:
        """The meter's reading of each branch's last state (the history after its candidate action)."""
        assert self.meter is not None
        start = time.perf_counter()
        try:
            if hasattr(self.meter, "score_records"):  # reads records with provenance (the household oracle)
                records = [Trajectory(id=f"branch{k}", group=e.task.id, reward=0.0, success=False, messages=messages,
                                      extra=provenance(e, self.max_turns or e.env.max_steps))
                           for k, (e, messages) in enumerate(branches)]  # fmt: skip
                return [row[-1] for row in self.meter.score_records(records, terminal=True)]
            return list(self.meter.score([messages for _, messages in branches]))
        finally:
            self.meter_seconds += time.perf_counter() - start

    def act(self, episodes: Sequence[Episode]) -> list[Action]:
        proposals = self.actor.act([e for e in episodes for _ in range(self.candidates)])
        per_episode = [proposals[k * self.candidates : (k + 1) * self.candidates] for k in range(len(episodes))]
        if self.select == "random":
            return [self.rng.choice(options) for options in per_episode]
        branches, owners = [], []
        for k, (episode, options) in enumerate(zip(episodes, per_episode)):
            commands = {a.text: a.command for a in options}  # a ReAct reply: the environment runs its action
            for text in distinct([a.text for a in options]):
                observation = try_action(episode, commands[text], self.branches)
                branches.append((episode, episode.messages + [{"role": "assistant", "content": text},
                                                              {"role": "user", "content": observation}]))
                owners.append((k, text))
        costs = [state_cost(r, self.failure_cost) for r in self.read(branches)]
        chosen = []
        for k, options in enumerate(per_episode):
            mine = [(text, cost) for (owner, text), cost in zip(owners, costs) if owner == k]
            best_text = mine[pick_lowest_cost([c for _, c in mine])][0]
            chosen.append(next(a for a in options if a.text == best_text))
        return chosen


@dataclass(frozen=True)
class GuidanceRow:
    """One column group of Table 9: success rate and average interaction length (and the arm's wall time)."""

    name: str
    candidates: int
    success: float
    steps: float
    seconds: float = 0.0


@dataclass
class GuidanceResult:
    """The three arms and the time the meter took in the meter-guided one."""

    rows: list[GuidanceRow]
    meter_seconds: float

    @property
    def meter_share(self) -> float:
        """The meter's share of the meter-guided arm's wall time."""
        guided = self.rows[-1].seconds
        return self.meter_seconds / guided if guided > 0 else 0.0


def compare_guidance(
    make_env: Callable[[], Environment],
    tasks: Sequence,
    make_actor: Callable[[], Policy],
    meter: Meter,
    *,
    candidates: int = 4,
    seed: int = 0,
    max_turns: int | None = None,
    progress: bool = False,
) -> GuidanceResult:
    """Natural rollout (1 candidate), random-of-K and meter-guided-of-K (E.5) on the same ``tasks``, each arm from
    torch seed ``seed`` with a fresh ``make_actor()`` (a stateful actor, e.g. a noisy expert, starts every arm from
    the same state). ``progress``: a bar per arm."""
    import torch

    if candidates < 1:
        raise ValueError(f"candidates must be at least 1, got {candidates}")
    if getattr(meter, "turn_limit", None) is not None:  # its input states the turns left: of these episodes?
        from deltattg.meter.loading import check_meter_turn_limit

        limit = max_turns if max_turns is not None else make_env().max_steps
        check_meter_turn_limit(meter, limit, "the meter", "the episodes' turn limit (--max-turns)")
    arms: list[tuple[str, int, Callable[[], Policy]]] = [("natural rollout", 1, make_actor)]
    guided: list[GuidedPolicy] = []

    def arm(select: str) -> Callable[[], Policy]:
        def build() -> Policy:
            policy = GuidedPolicy(make_actor(), meter if select == "meter" else None, candidates=candidates,
                                  select=select, make_env=make_env, seed=seed, max_turns=max_turns)  # fmt: skip
            guided.append(policy)
            return policy

        return build

    arms += [("random selection", candidates, arm("random")), ("progress meter", candidates, arm("meter"))]
    rows = []
    for name, k, build in arms:
        torch.manual_seed(seed)
        policy = build()
        start = time.perf_counter()
        trajectories = run_episodes(make_env, tasks, policy, max_turns=max_turns, progress=progress)
        seconds = time.perf_counter() - start
        rows.append(GuidanceRow(name, k, mean([t.success for t in trajectories]),
                                mean([t.num_steps for t in trajectories]), seconds))  # fmt: skip
    return GuidanceResult(rows, guided[-1].meter_seconds)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def guidance_header(candidates: int) -> tuple[str, ...]:
    """The columns of Table 9's layout: per selection rule, its success rate and mean steps."""
    return ("actor", "split", "natural rollout (1) SR %", "Steps", f"random selection ({candidates}) SR %", "Steps",
            f"progress meter ({candidates}) SR %", "Steps")  # fmt: skip


def guidance_row(actor: str, split: str, rows: Sequence[GuidanceRow]) -> list[str]:
    """One actor's line of :func:`guidance_header`'s table."""
    from deltattg.report import percent

    return [actor, split, *(cell for row in rows for cell in (percent(row.success), f"{row.steps:.2f}"))]
