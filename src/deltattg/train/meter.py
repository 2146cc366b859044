"""What the training loop adds around the frozen meter (loading it and reading states live in
:mod:`deltattg.meter.loading`): the generative readout an estimator needs, E.4's final-score readings, and the check
that every reading carries what the estimator reads."""

from __future__ import annotations

import math
from dataclasses import replace

from deltattg.data.trajectory import MeterOutput


def readout_for(reading: str) -> str:
    """The generative meter's readout that yields ``reading`` (``required_reading`` of the estimator)."""
    return {"can_complete": "answer", "logit": "logit"}.get(reading, "answer")


def with_outcome_scores(readings: list[list[MeterOutput | None]]) -> list[list[MeterOutput | None]]:
    """E.4 (+value) needs a final-score estimate S_φ(h). A reading without ``score`` but with a completion logit
    gets S = σ(logit), the predicted probability of success — the final-score estimate of a 0/1 reward when the
    meter was trained on outcomes only (a regression meter with ``regression_weight=0``)."""

    def scored(r: MeterOutput | None) -> MeterOutput | None:
        if r is None or r.score is not None or r.logit is None:
            return r
        return replace(r, score=1.0 / (1.0 + math.exp(-r.logit)))

    return [[scored(r) for r in row] for row in readings]


def check_reading(readings: list[list[MeterOutput | None]], reading: str, method: str) -> None:
    """Every valid reading carries the field ``method`` reads (``required_reading``)."""
    for row in readings:
        for r in row:
            if r is not None and getattr(r, reading) is None:
                raise ValueError(f"algo.method {method} reads {reading!r}, which this meter's readings lack")
