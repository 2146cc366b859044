"""The belief reference of the household environment: the planner's reading averaged over the worlds the history allows.

The oracle (``meter.oracle``) reads the true world, hidden objects included. This meter reads only what the recorded
history has shown — the goal and the receptacles from the first observation, then every observation after an action —
and the task generator's prior over what is still hidden (``envs.household.belief``): for decision state h_t it keeps
the hidden completions that answer the trajectory's actions exactly as recorded and reads

* ``probability`` p = the prior mass of those in which the optimal plan from s_t fits in the turns left;
* ``can_complete`` = p ≥ ½;
* ``tokens_to_go`` = the expected tokens of the expert's remaining actions (counted as ``labels`` counts an action).

Where nothing hidden matters it equals the oracle. It is the ceiling for a meter that reads the history (it uses no
more than the history and the generator's rules), and an upper one: it assumes the agent acts knowing the world from
then on. Tasks with more hidden completions than ``max_worlds`` are read from ``samples`` completions drawn from the
prior (a Monte-Carlo belief, seeded per task; its meter id says so); a state none of them explains reads None.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from deltattg.data.trajectory import MeterOutput, Trajectory
from deltattg.envs.household.belief import MAX_WORLDS, SAMPLES, Hypothesis, belief_readings, hypotheses
from deltattg.envs.household.progress import household_env, replay
from deltattg.envs.replay import recorded_episode
from deltattg.meter.oracle import ExpertTokens, check_turn_limit, tokenizer_name

BELIEF = "belief"
TASKS_KEPT = 32  # tasks whose hypotheses (and their expert paths) stay in memory


class BeliefMeter:
    """The belief reference as a progress meter (module doc). ``tokenizer`` counts tokens as ``labels`` does;
    ``max_worlds`` / ``samples`` / ``seed``: where and how the hidden completions are sampled."""

    def __init__(self, tokenizer: Any, *, max_worlds: int = MAX_WORLDS, samples: int = SAMPLES, seed: int = 0):
        if max_worlds < 1 or samples < 1:
            raise ValueError(f"max_worlds and samples must be positive, got {max_worlds} and {samples}")
        self.tokenizer = tokenizer
        self.max_worlds, self.samples, self.seed = max_worlds, samples, seed
        self._tasks: OrderedDict[tuple, tuple[list[Hypothesis], ExpertTokens]] = OrderedDict()
        self.sampled_tasks = 0  # tasks read from a Monte-Carlo belief so far

    @property
    def meter_id(self) -> str:
        return (f"{BELIEF}/household/max-worlds={self.max_worlds}/samples={self.samples}/seed={self.seed}"
                f"/tokenizer={tokenizer_name(self.tokenizer)}")  # fmt: skip

    def _task(self, config: Any, world: Any) -> tuple[list[Hypothesis], ExpertTokens]:
        """The hypotheses of the task whose visible part ``world`` shows, and an expert-token counter for their worlds
        (both kept for the last ``TASKS_KEPT`` tasks)."""
        key = (config, world.goal, world.receptacles)
        found = self._tasks.get(key)
        if found is None:
            seed = zlib.crc32(repr(key[1:]).encode()) ^ self.seed
            found_hypotheses, sampled = hypotheses(config, world, max_worlds=self.max_worlds, samples=self.samples,
                                                   seed=seed)  # fmt: skip
            self.sampled_tasks += sampled
            found = self._tasks[key] = (found_hypotheses, ExpertTokens(self.tokenizer))
            if len(self._tasks) > TASKS_KEPT:
                self._tasks.popitem(last=False)
        self._tasks.move_to_end(key)
        return found

    def read_trajectory(self, trajectory: Trajectory, terminal: bool = False) -> list[MeterOutput | None]:
        """Readings of h_0..h_{T−1} (and h_T with ``terminal``); raises ``InputError`` if the record does not replay."""
        replayed = replay(trajectory)  # the record replays exactly (and names its turn limit)
        check_turn_limit(replayed.max_turns, len(replayed.states) - 1)
        env = household_env(trajectory)
        recorded = recorded_episode(trajectory, lambda: env, env.max_steps)
        found, expert_tokens = self._task(env.config, replayed.world)
        count = len(replayed.states) if terminal else len(replayed.states) - 1
        beliefs = belief_readings(found, recorded.commands, recorded.observations[1:], trajectory.success,
                                  replayed.max_turns, expert_tokens, count)  # fmt: skip
        return [None if b is None else MeterOutput(can_complete=b.probability >= 0.5, tokens_to_go=b.tokens_to_go,
                                                   probability=b.probability)
                for b in beliefs]  # fmt: skip

    def score_records(self, trajectories: Sequence[Trajectory], terminal: bool = False) -> list[list[MeterOutput | None]]:
        return [self.read_trajectory(t, terminal) for t in trajectories]
