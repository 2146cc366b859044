"""The oracle progress meter of the household environment: the planner's exact answer for every decision state.

For decision state h_t of a recorded trajectory it replays the environment to s_t (``envs.household.progress``) and
reads

* ``can_complete`` = the optimal plan from s_t fits in the turns left: d_t ≤ max_turns − t;
* ``tokens_to_go`` = the tokens of the expert's remaining actions from s_t, each counted as ``deltattg labels``
  counts an action (the assistant turn as ``tokenizer``'s chat template renders it), so on the trajectories of the
  noiseless expert the oracle reads exactly the Eq. 1–2 labels.

Two dials turn it down toward a learned meter, both seeded per state (a reading never depends on batching or order):
``noise`` σ multiplies v̂ by exp(σ·z), z ~ N(0, 1) (log-normal), and ``flip`` p flips b̂ with probability p (v̂ is
the expert's path length in tokens either way, so a flip to "completable" has a value to read). Two more imitate a
learned meter's two kinds of b̂ error, and read the trajectory's outcome to do so: ``false_negative`` p reads b̂ = 0
on a state of a *successful* trajectory with probability p, ``missed_failure`` p reads b̂ = 1 on a state of a
*failed* trajectory the planner knows cannot be completed in the turns left (a time-out the meter does not see).

It reads whole trajectories (their provenance, not just their messages), so it offers ``score_records`` rather than
prefix-by-prefix ``score``; ``meter.loading.read_states`` dispatches to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from deltattg.data.tokens import ActionTokens
from deltattg.data.trajectory import MAX_TOKENS_TO_GO, MeterOutput, Trajectory
from deltattg.envs.household.progress import ExpertPaths, replay
from deltattg.envs.household.world import State, World
from deltattg.errors import InputError
from deltattg.meter.prompt import prefix_hash

ORACLE = "oracle"
MAX_NOISE = 10.0  # σ: exp(10 z) already spans many orders of magnitude


@dataclass(frozen=True)
class OracleConfig:
    """``noise``: σ of the log-normal factor on v̂; ``flip``: probability of flipping b̂; ``false_negative`` and
    ``missed_failure``: probabilities of the two outcome-conditioned b̂ errors (module doc); ``seed`` of all."""

    noise: float = 0.0
    flip: float = 0.0
    seed: int = 0
    false_negative: float = 0.0
    missed_failure: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.noise) and 0 <= self.noise <= MAX_NOISE):
            raise ValueError(f"oracle noise must be a σ in [0, {MAX_NOISE:g}], got {self.noise}")
        for name in ("flip", "false_negative", "missed_failure"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"oracle {name.replace('_', ' ')} probability must be in [0, 1], got {getattr(self, name)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise ValueError(f"oracle seed must be an integer in [0, 2^32), got {self.seed!r}")


def exact_reading(distance: int, turns_left: int, tokens_to_go: int) -> MeterOutput:
    """(b, v) of a state whose optimal plan has ``distance`` actions and ``tokens_to_go`` tokens."""
    return MeterOutput(can_complete=distance <= turns_left, tokens_to_go=float(tokens_to_go))


def degraded(reading: MeterOutput, config: OracleConfig, rng: np.random.Generator, success: bool) -> MeterOutput:
    """The reading with b̂ flipped with probability ``flip``, v̂ scaled by exp(σ·z) (z standard normal), and the
    outcome-conditioned errors of a state of a trajectory that ended with ``success`` (module doc)."""
    flip, z, u = rng.random(), rng.standard_normal(), rng.random()  # all drawn always: a dial never shifts another's
    can = (not reading.can_complete) if flip < config.flip else reading.can_complete
    if success and u < config.false_negative:
        can = False
    elif not success and not reading.can_complete and u < config.missed_failure:
        can = True
    value = min((reading.tokens_to_go or 0.0) * math.exp(min(config.noise * z, 50.0)), MAX_TOKENS_TO_GO)
    return MeterOutput(can_complete=can, tokens_to_go=value)


def check_turn_limit(max_turns: int, actions: int) -> None:
    """A record cannot have taken more actions than the turn limit it says it ran under (every episode stops at its
    limit): such a limit would read every state "cannot complete", a success included. ``InputError`` on
    ``env.max_turns``."""
    if actions > max_turns:
        raise InputError(f"a turn limit of {max_turns} is smaller than the record's own {actions} actions: the "
                         "episode cannot have run under it", field="env.max_turns")


class ExpertTokens:
    """The tokens of the expert's remaining actions from a state (``ExpertPaths``), each action counted as ``labels``
    counts it (the assistant turn as ``tokenizer``'s chat template renders it)."""

    def __init__(self, tokenizer: Any):
        self._paths = ExpertPaths()
        self.action_tokens = ActionTokens(tokenizer)

    def __call__(self, world: World, state: State) -> int:
        return sum(map(self.action_tokens, self._paths(world, state)))


def tokenizer_name(tokenizer: Any) -> str:
    """What a meter id calls its tokenizer."""
    return getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__


class OracleMeter:
    """The planner as a progress meter (module doc). ``tokenizer`` counts tokens as ``labels`` does."""

    def __init__(self, tokenizer: Any, config: OracleConfig = OracleConfig()):
        self.tokenizer = tokenizer
        self.config = config
        self.expert_tokens = ExpertTokens(tokenizer)

    @property
    def meter_id(self) -> str:
        c = self.config
        name = tokenizer_name(self.tokenizer)
        errors = f"/false-negative={c.false_negative:g}/missed-failure={c.missed_failure:g}" if self.errs else ""
        return f"{ORACLE}/household/noise={c.noise:g}/flip={c.flip:g}{errors}/seed={c.seed}/tokenizer={name}"

    @property
    def errs(self) -> bool:
        c = self.config
        return bool(c.noise or c.flip or c.false_negative or c.missed_failure)

    def read_trajectory(self, trajectory: Trajectory, terminal: bool = False) -> list[MeterOutput]:
        """Readings of h_0..h_{T−1} (and h_T with ``terminal``); raises ``InputError`` if the record does not replay."""
        replayed = replay(trajectory)
        check_turn_limit(replayed.max_turns, len(replayed.states) - 1)
        distances = replayed.distances()
        count = len(distances) if terminal else len(distances) - 1
        messages = trajectory.messages or []
        cuts = [k for k, m in enumerate(messages) if m.get("role") == "assistant"] + [len(messages)]
        out = []
        for t in range(count):
            tokens = self.expert_tokens(replayed.world, replayed.states[t])
            reading = exact_reading(distances[t], replayed.max_turns - t, tokens)
            if self.errs:
                key = int(prefix_hash(messages[: cuts[t]])[:15], 16)
                rng = np.random.default_rng([self.config.seed, key, t])
                reading = degraded(reading, self.config, rng, trajectory.success)
            out.append(reading)
        return out

    def score_records(self, trajectories: Sequence[Trajectory], terminal: bool = False) -> list[list[MeterOutput]]:
        return [self.read_trajectory(t, terminal) for t in trajectories]
