"""The persistent score cache (SQLite, WAL) and the CachedMeter wrapper: dedup, cache use, contained failures."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
from contextlib import closing
from collections.abc import Sequence

import pytest

from deltattg.data.trajectory import MeterOutput
from deltattg.meter.base import CachedMeter, Meter, ScoreStats
from deltattg.meter.cache import ScoreCache
from deltattg.meter.prompt import prefix_hash

ROWS_PER_COMMIT = 200


def test_readings_round_trip_and_invalid_is_distinct_from_missing(tmp_path):
    readings = {
        "a": MeterOutput(True, 412),
        "b": MeterOutput(False, None),
        "c": None,  # invalid
        "d": MeterOutput(True, 3.5, logit=-1.25, score=0.5),
    }
    with ScoreCache(tmp_path / "sub" / "scores.sqlite") as cache:
        cache.put_many("meter-1", readings)
        assert cache.get_many("meter-1", ["a", "b", "c", "d", "missing"]) == readings
        assert cache.get_many("meter-2", ["a"]) == {}  # keyed by meter id too
        cache.put_many("meter-1", {"c": MeterOutput(True, 7)})  # later writes win
    with ScoreCache(tmp_path / "sub" / "scores.sqlite") as reopened:
        assert reopened.get_many("meter-1", ["c", "a"]) == {"c": MeterOutput(True, 7), "a": MeterOutput(True, 412)}
    with closing(sqlite3.connect(tmp_path / "sub" / "scores.sqlite")) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)  # WAL is a property of the file


WRITER = textwrap.dedent(
    """
    import sys
    from deltattg.data.trajectory import MeterOutput
    from deltattg.meter.cache import ScoreCache

    cache = ScoreCache(sys.argv[1])
    batch = 0
    while True:
        cache.put_many("m", {
            f"{batch}-{j}": MeterOutput(True, batch * 1000 + j) if j % 3 else None for j in range(int(sys.argv[2]))
        })
        print(batch, flush=True)
        batch += 1
    """
)


def test_a_sigkilled_writer_loses_nothing_it_committed_and_leaves_a_sound_file(tmp_path):
    path = tmp_path / "scores.sqlite"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(ROWS_PER_COMMIT)], stdout=subprocess.PIPE, text=True
    )
    try:
        reported = [int(writer.stdout.readline()) for _ in range(40)]  # it keeps writing while we read
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
        writer.stdout.close()
    assert writer.returncode == -signal.SIGKILL
    assert path.with_name(path.name + "-wal").exists()  # killed before any clean close: recovery goes through the WAL

    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with ScoreCache(path) as cache:
        found_per_batch = []
        for batch in range(reported[-1] + 1000):
            keys = [f"{batch}-{j}" for j in range(ROWS_PER_COMMIT)]
            found = cache.get_many("m", keys)
            expected = {k: MeterOutput(True, batch * 1000 + j) if j % 3 else None for j, k in enumerate(keys)}
            assert found in ({}, expected)  # each commit is all or nothing, and exact
            found_per_batch.append(bool(found))
        committed = sum(found_per_batch)
        assert found_per_batch == [True] * committed + [False] * (len(found_per_batch) - committed)
        assert reported[-1] < committed < len(found_per_batch)  # all it reported as committed is there
        cache.put_many("m", {"after": MeterOutput(False)})  # and the file takes writes again
        assert cache.get_many("m", ["after"]) == {"after": MeterOutput(False)}


class LengthMeter:
    """A real, tiny backend: reads a prefix as 'completable, 10 tokens per message left to go'; records its calls.

    A history whose last message says ``invalid`` gets an invalid reading; one saying ``explode`` makes the whole
    call raise, as a crashed backend would.
    """

    meter_id = "length-meter/v1"

    def __init__(self) -> None:
        self.calls: list[list[list[dict]]] = []

    def score(self, histories: Sequence[list[dict]]) -> list[MeterOutput | None]:
        self.calls.append(list(histories))
        if any(h[-1]["content"] == "explode" for h in histories):
            raise RuntimeError("backend crashed")
        return [None if h[-1]["content"] == "invalid" else MeterOutput(True, 10 * len(h)) for h in histories]


def history(*contents: str) -> list[dict]:
    return [{"role": "user", "content": c} for c in contents]


def test_the_tiny_backend_is_a_meter():
    assert isinstance(LengthMeter(), Meter)


def test_repeated_prefixes_are_read_once_and_answers_keep_the_input_order():
    backend = LengthMeter()
    meter = CachedMeter(backend)
    a, b, c = history("a"), history("a", "b"), history("a", "b", "c")
    batch = [a, b, a, c, [dict(m) for m in b], a]  # equal content counts as the same prefix
    assert meter.score(batch) == [MeterOutput(True, n) for n in (10, 20, 10, 30, 20, 10)]
    assert backend.calls == [[a, b, c]]
    assert meter.stats == ScoreStats(requested=6, distinct=3, cache_hits=0, scored=3, invalid=0, backend_errors=0)


def test_the_cache_serves_later_calls_and_later_runs(tmp_path):
    backend = LengthMeter()
    with ScoreCache(tmp_path / "scores.sqlite") as cache:
        meter = CachedMeter(backend, cache)
        meter.score([history("a"), history("a", "b")])
        assert meter.score([history("a", "b"), history("x")]) == [MeterOutput(True, 20), MeterOutput(True, 10)]
        assert backend.calls == [[history("a"), history("a", "b")], [history("x")]]
    rerun_backend = LengthMeter()
    with ScoreCache(tmp_path / "scores.sqlite") as cache:
        rerun = CachedMeter(rerun_backend, cache)
        assert rerun.score([history("x"), history("a")]) == [MeterOutput(True, 10), MeterOutput(True, 10)]
    assert rerun_backend.calls == [] and rerun.stats.cache_hits == 2


def test_invalid_readings_are_cached_only_when_asked(tmp_path):
    for cache_invalid, expected_calls in ((False, 2), (True, 1)):
        backend = LengthMeter()
        with ScoreCache(tmp_path / f"scores-{cache_invalid}.sqlite") as cache:
            meter = CachedMeter(backend, cache, cache_invalid=cache_invalid)
            assert meter.score([history("invalid")]) == [None]
            assert meter.score([history("invalid")]) == [None]
        assert len(backend.calls) == expected_calls
        assert meter.stats.invalid == expected_calls


def test_a_failing_backend_call_gives_invalid_readings_for_its_chunk_only_and_is_not_cached(tmp_path):
    backend = LengthMeter()
    with ScoreCache(tmp_path / "scores.sqlite") as cache:
        meter = CachedMeter(backend, cache, batch_size=2, cache_invalid=True)
        batch = [history("a"), history("b"), history("explode"), history("c"), history("d")]
        assert meter.score(batch) == [MeterOutput(True, 10), MeterOutput(True, 10), None, None, MeterOutput(True, 10)]
        assert [len(call) for call in backend.calls] == [2, 2, 1]  # chunks of batch_size distinct prefixes
        assert meter.stats.backend_errors == 1 and meter.stats.invalid == 2
        assert set(cache.get_many(meter.meter_id, [prefix_hash(h) for h in batch])) == {
            prefix_hash(h) for h in (history("a"), history("b"), history("d"))
        }


def test_a_backend_returning_the_wrong_number_of_readings_is_a_failure():
    class ShortMeter(LengthMeter):
        def score(self, histories: Sequence[list[dict]]) -> list[MeterOutput | None]:
            return super().score(histories)[:-1]

    meter = CachedMeter(ShortMeter())
    assert meter.score([history("a"), history("b")]) == [None, None]
    assert meter.stats.backend_errors == 1


def test_batch_size_must_be_positive():
    with pytest.raises(ValueError):
        CachedMeter(LengthMeter(), batch_size=0)
