"""What the training loop adds around the frozen meter (loading it and reading states live in
:mod:`deltattg.meter.loading`): the generative readout an estimator needs and the check that every reading carries
what the estimator reads."""

from __future__ import annotations

from deltattg.data.trajectory import MeterOutput


def readout_for(reading: str) -> str:
    """The generative meter's readout that yields ``reading`` (``required_reading`` of the estimator)."""
    return {"can_complete": "answer", "logit": "logit"}.get(reading, "answer")


def check_reading(readings: list[list[MeterOutput | None]], reading: str, method: str) -> None:
    """Every valid reading carries the field ``method`` reads (``required_reading``)."""
    for row in readings:
        for r in row:
            if r is not None and getattr(r, reading) is None:
                raise ValueError(f"algo.method {method} reads {reading!r}, which this meter's readings lack")
