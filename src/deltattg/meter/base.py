"""The one meter interface: read a batch of decision prefixes into progress readings (§3.1; Algorithm 1, lines 9–12).

A backend — the endpoint client here, the in-process HF generative meter and the regression meter elsewhere —
implements :class:`Meter`. It reads every history it is given (with greedy decoding where it generates), returns one
reading per history in order, and answers ``None`` for a reading it could not get or parse (never a guess).

:class:`CachedMeter` wraps any backend with what every caller wants: identical prefixes are read once per batch,
readings persist in a :class:`~deltattg.meter.cache.ScoreCache` across runs, and a backend that raises turns its
chunk into invalid readings (so Algorithm 1 falls back for those groups) counted in :class:`ScoreStats`, never into an
exception in the training loop.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from deltattg.data.trajectory import MeterOutput, state_prefixes
from deltattg.meter.cache import ScoreCache
from deltattg.meter.prompt import prefix_hash

logger = logging.getLogger(__name__)


@runtime_checkable
class Meter(Protocol):
    """A progress meter f_φ(h) = (b̂, v̂) over decision prefixes h (lists of OpenAI chat messages)."""

    @property
    def meter_id(self) -> str:
        """Names everything that determines the readings (weights, prompt version, budget): the cache key."""
        ...

    def score(self, histories: Sequence[list[dict]]) -> list[MeterOutput | None]:
        """One reading per history, in order; ``None`` for an invalid one."""
        ...


@dataclass
class ScoreStats:
    """Running counts of a :class:`CachedMeter`, in prefixes unless named otherwise."""

    requested: int = 0  # prefixes asked for, repeats included
    distinct: int = 0  # distinct prefixes among them (per call)
    cache_hits: int = 0  # distinct prefixes answered by the cache (valid or invalid)
    scored: int = 0  # distinct prefixes sent to the backend
    invalid: int = 0  # of those, prefixes that came back invalid (a failed backend call counts its whole chunk)
    backend_errors: int = 0  # backend calls that raised or returned the wrong number of readings


class CachedMeter:
    """A :class:`Meter` that deduplicates, caches and contains failures of ``meter``.

    Cache misses go to the backend in chunks of ``batch_size`` distinct prefixes; each chunk's readings are committed
    before the next is read, so a killed run keeps what it paid for. Valid readings are cached; invalid ones only with
    ``cache_invalid`` (for backends whose invalid answers repeat, e.g. greedy in-process decoding — not an endpoint
    client, whose ``None`` may be a timeout). Readings of a chunk whose backend call failed are never cached.
    """

    def __init__(
        self, meter: Meter, cache: ScoreCache | None = None, *, batch_size: int = 64, cache_invalid: bool = False
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.meter = meter
        self.cache = cache
        self.batch_size = batch_size
        self.cache_invalid = cache_invalid
        self.stats = ScoreStats()

    @property
    def meter_id(self) -> str:
        return self.meter.meter_id

    @property
    def turn_limit(self) -> int | None:
        """The backend meter's turn limit (its input states the turns left), or ``None``."""
        return getattr(self.meter, "turn_limit", None)

    def score(self, histories: Sequence[list[dict]]) -> list[MeterOutput | None]:
        """One reading per history, in order; ``None`` for an invalid one. Never raises for the backend's sake."""
        keys = [prefix_hash(h) for h in histories]
        first = dict(zip(keys, histories))  # one history per distinct prefix, in first-seen order
        readings = self.cache.get_many(self.meter_id, first) if self.cache is not None else {}
        self.stats.requested += len(keys)
        self.stats.distinct += len(first)
        self.stats.cache_hits += len(readings)
        missing = [key for key in first if key not in readings]
        for start in range(0, len(missing), self.batch_size):
            chunk = missing[start : start + self.batch_size]
            fresh = self._read([first[key] for key in chunk])
            if fresh is not None:
                fresh_readings = dict(zip(chunk, fresh))
                readings.update(fresh_readings)
                self._store(fresh_readings)
        return [readings.get(key) for key in keys]

    def _read(self, histories: list[list[dict]]) -> list[MeterOutput | None] | None:
        """The backend's readings of one chunk, or ``None`` when the call failed (logged and counted)."""
        self.stats.scored += len(histories)
        try:
            out = list(self.meter.score(histories))
            if len(out) != len(histories):
                raise ValueError(f"returned {len(out)} readings for {len(histories)} histories")
        except Exception:  # a backend failure must not reach the training loop
            self._failed(len(histories))
            return None
        self.stats.invalid += sum(reading is None for reading in out)
        return out

    def _failed(self, prefixes: int) -> None:
        logger.exception("meter %s failed on a chunk of %d prefixes", self.meter_id, prefixes)
        self.stats.backend_errors += 1
        self.stats.invalid += prefixes

    def _store(self, readings: dict[str, MeterOutput | None]) -> None:
        if self.cache is None:
            return
        keep = {key: r for key, r in readings.items() if r is not None or self.cache_invalid}
        if keep:
            self.cache.put_many(self.meter_id, keep)


class CachedTrajectoryMeter(CachedMeter):
    """A :class:`CachedMeter` over a backend that reads all decision states of a trajectory together
    (``score_trajectories``: the generative meter on one shared key/value cache). A trajectory whose every state is
    cached is not read; any other is read whole, ``batch_size`` trajectories per backend call, and all its states'
    readings are stored. ``score`` (guidance's candidates) still reads prefix by prefix."""

    def score_trajectories(self, trajectories: Sequence[list[dict]]) -> list[list[MeterOutput | None]]:
        """Readings of states t = 0..T of each trajectory (T + 1 each); ``None`` for an invalid one. Never raises for
        the backend's sake: a failed call leaves its trajectories' readings ``None``."""
        keys = [[prefix_hash(h) for h in state_prefixes(list(m), terminal=True)] for m in trajectories]
        distinct = {key for row in keys for key in row}
        readings = self.cache.get_many(self.meter_id, distinct) if self.cache is not None else {}
        self.stats.requested += sum(map(len, keys))
        self.stats.distinct += len(distinct)
        self.stats.cache_hits += len(readings)
        missing = list({keys[i][-1]: i for i, row in enumerate(keys) if any(k not in readings for k in row)}.values())
        for start in range(0, len(missing), self.batch_size):
            chunk = missing[start : start + self.batch_size]
            states = sum(len(keys[i]) for i in chunk)
            self.stats.scored += states
            try:
                out = self.meter.score_trajectories([trajectories[i] for i in chunk])  # type: ignore[attr-defined]
                if [len(row) for row in out] != [len(keys[i]) for i in chunk]:
                    raise ValueError("returned the wrong number of readings")
            except Exception:  # a backend failure must not reach the training loop
                self._failed(states)
                continue
            fresh = {key: reading for i, row in zip(chunk, out) for key, reading in zip(keys[i], row)}
            self.stats.invalid += sum(r is None for row in out for r in row)
            readings.update(fresh)
            self._store(fresh)
        return [[readings.get(key) for key in row] for row in keys]
