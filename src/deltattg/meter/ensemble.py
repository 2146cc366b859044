"""An ensemble of progress meters read pessimistically (ours; the robust credit's ensemble option).

Several meters — trained from other seeds, on other pools, or of other kinds — read the same decision states, and a
state's reading combines theirs (:func:`pessimistic_reading`): the completion probability is the members' mean less
their spread, so a state on which the meters disagree reads as less likely to be completed (conservative ensembles
curb a learned reward's over-optimisation: Coste et al., arXiv 2310.02743). ``load_meter("a,b,c")`` builds one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from deltattg.data.trajectory import MeterOutput, state_prefixes
from deltattg.meter.base import Meter


def member_probability(reading: MeterOutput) -> float:
    """A member's p̃: its calibrated probability, else its b̂ as 0/1."""
    return float(reading.probability) if reading.probability is not None else float(bool(reading.can_complete))


def pessimistic_reading(readings: Sequence[MeterOutput | None]) -> MeterOutput | None:
    """The members' readings of one state combined: p̃ = max(mean − standard deviation, 0) of their p̃ (population
    standard deviation), b̂ = [p̃ ≥ ½], v̂ the mean of the members' v̂ (those that give one; ``None`` if none does).
    Invalid (``None``) when any member's reading is invalid or lacks b̂: an ensemble does not guess for a member."""
    if not readings or any(r is None or r.can_complete is None for r in readings):
        return None
    p = [member_probability(r) for r in readings]  # type: ignore[arg-type]
    mean = sum(p) / len(p)
    spread = math.sqrt(sum((x - mean) ** 2 for x in p) / len(p))
    probability = max(mean - spread, 0.0)
    values = [r.tokens_to_go for r in readings if r.tokens_to_go is not None]  # type: ignore[union-attr]
    return MeterOutput(can_complete=probability >= 0.5, tokens_to_go=sum(values) / len(values) if values else None,
                       probability=probability)  # fmt: skip


class MeterEnsemble:
    """A :class:`~deltattg.meter.base.Meter` over several meters, each state's reading :func:`pessimistic_reading`
    of theirs. The members must share a turn limit (they read the same episodes)."""

    def __init__(self, meters: Sequence[Meter]):
        if len(meters) < 2:
            raise ValueError(f"an ensemble needs at least two meters, got {len(meters)}")
        limits = {getattr(m, "turn_limit", None) for m in meters}
        if len(limits) > 1:
            raise ValueError(f"the ensemble's meters were trained for different turn limits: {sorted(map(str, limits))}")
        self.meters = list(meters)
        self.turn_limit = limits.pop()

    @property
    def meter_id(self) -> str:
        return "ensemble(" + ",".join(m.meter_id for m in self.meters) + ")/pessimistic"

    def score(self, histories: Sequence[list[dict]]) -> list[MeterOutput | None]:
        """Each history read by every member, combined state by state."""
        columns = [m.score(histories) for m in self.meters]
        return [pessimistic_reading(list(row)) for row in zip(*columns)]

    def score_trajectories(self, trajectories: Sequence[Sequence[dict]]) -> list[list[MeterOutput | None]]:
        """Every decision state t = 0..T of each trajectory (T + 1 readings each), each member reading them its own
        fastest way (one pass per trajectory for a regression meter)."""
        columns = [self._member_states(m, trajectories) for m in self.meters]
        return [[pessimistic_reading(list(state)) for state in zip(*rows)] for rows in zip(*columns)]

    @staticmethod
    def _member_states(meter: Any, trajectories: Sequence[Sequence[dict]]) -> list[list[MeterOutput | None]]:
        if hasattr(meter, "score_trajectories"):
            return meter.score_trajectories(trajectories)
        return [meter.score(state_prefixes(list(messages), terminal=True)) for messages in trajectories]
