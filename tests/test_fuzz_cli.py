"""Fuzzing the command line's bad-input contract: random bytes, random JSON values and random mutations of valid
records (and random option values) fed to ``labels``, ``credit``, ``score``, ``eval-steps``, ``collect``, ``inspect``,
``guide``, ``evaluate``, ``train-meter`` and ``verl-tasks``.

Whatever the input, a run ends with exit status 0 or 2 (``score`` also 3: no valid reading), never with an exception
(a traceback), and its output is either absent (always so after a failure) or a complete JSONL file of objects (or
``train-meter``'s whole meter folder, ``verl-tasks``' whole parquet file); no temporary file is left behind. Commands run in-process
(``deltattg.cli.main``) for speed.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import tempfile
from pathlib import Path
from unittest import mock

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from deltattg.cli import main  # noqa: E402
from deltattg.data.trajectory import MeterOutput  # noqa: E402
from conftest import collect_household, save_household_tokenizer  # noqa: E402

# Deterministic by default (the same examples every run, about 10 s in all); DELTATTG_FUZZ_EXAMPLES=N explores N random
# examples per command instead.
EXPLORE = int(os.environ.get("DELTATTG_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=EXPLORE or 150, deadline=None, derandomize=not EXPLORE, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FEWER = settings(FUZZ, max_examples=EXPLORE or 100)  # score and collect: each run costs more


# ---- valid records to start from ---------------------------------------------------------------------------------
OK = lambda v: {"can_complete": True, "tokens_to_go": v}  # noqa: E731
FAIL = {"can_complete": False, "tokens_to_go": None}
SCORED = [
    {"id": "a", "group": "g", "reward": 1.0, "success": True, "step_tokens": [3, 4],
     "meter": [{**OK(10), "logit": 1.5, "score": 0.7}, {**OK(5), "logit": 2.0, "score": 0.9}]},
    {"id": "b", "group": "g", "reward": 0.0, "success": False, "step_tokens": [2],
     "meter": [{**FAIL, "logit": -1.0, "score": 0.1}]},
    {"id": "c", "group": "h", "reward": 1.0, "success": True, "policy": "p",
     "messages": [{"role": "user", "content": "put the mug"}, {"role": "assistant", "content": "go to mug"},
                  {"role": "tool", "content": "ok"}, {"role": "assistant", "content": [{"text": "take mug"}],
                                                      "tool_calls": [{"function": {"name": "take", "arguments": "{}"}}]}],
     "step_tokens": [4, 3], "meter": [OK(7), None],
     "steps": [{"observation": "o", "token_ids": [1, 2], "logprobs": [-0.1, -0.2], "reward": 0.0}, {"reward": 1.0}]},
]


def apb_record(index: int, labels: dict) -> dict:
    """A small AgentProcessBench record (converted on the fly by the reader)."""
    return {"total_index": index, "query_index": index // 2, "data_source": "toy", "final_label": 1 if index % 2 else -1,
            "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "search a"},
                         {"role": "tool", "content": "r"}, {"role": "assistant", "content": "answer b"}],
            "step_labels": labels}


LABELLED = [apb_record(0, {"1": 1, "3": -1}), apb_record(1, {"1": 0, "3": 1}), apb_record(2, {"3": 1})]


@pytest.fixture(scope="module")
def household(tmp_path_factory):
    """A saved word tokenizer and a small household pool (what ``score --meter oracle`` can replay)."""
    root = tmp_path_factory.mktemp("fuzz")
    save_household_tokenizer(root / "tok")
    pool = collect_household(root / "pool.jsonl", ["expert", "expert:0.5"], 2, "--group-size", "2", "--max-turns", "6")
    records = [json.loads(line) for line in pool.read_text().splitlines()]
    return root / "tok", records


# ---- strategies ----------------------------------------------------------------------------------------------------
SPECIAL = [None, True, False, 0, -1, 1, 2, 1.5, -0.5, 10**30, -(10**30), 2**63, 1e308, -1e308, 1e-320, "", "x", "1",
           "NaN", [], {}, [None], {"a": 1}, [[[[[]]]]], "\ud800"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
                    st.sampled_from(SPECIAL))
numbers = st.one_of(st.integers(-3, 3), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                    st.sampled_from([10**9, 10**9 + 1, 10**12, 10**30, -(10**30), 2**63, 1e308, -1e308, 1e-320, 0.5]))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                           max_leaves=12)


def to_line(value) -> str:
    """JSON text of ``value`` as Python writes it (NaN / Infinity included: the reader must refuse them)."""
    try:
        return json.dumps(value)
    except (ValueError, RecursionError):
        return "null"


def paths(value, prefix=()):
    """Every (container, key) pair inside a JSON value."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield value, key
            yield from paths(child)
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield value, index
            yield from paths(child)


@st.composite
def mutated(draw, records: list[dict]) -> list[str]:
    """The valid records with 1-3 random edits: a value replaced, a key dropped or added, a record repeated, a line
    cut short or turned into bytes that are not UTF-8."""
    records = copy.deepcopy(records)
    lines: list[str | bytes] = []
    for _ in range(draw(st.integers(1, 3))):
        record = draw(st.sampled_from(records))
        choice = draw(st.sampled_from(["replace", "replace", "number", "number", "drop", "add", "repeat"]))
        top = draw(st.sampled_from(sorted(record)))  # a field first, then a place inside it: long lists do not dominate
        places = [(record, top), *paths(record[top])]
        numeric = [(c, k) for c, k in places if isinstance(c[k], (int, float)) and not isinstance(c[k], bool)]
        if choice == "number" and numeric:
            container, key = draw(st.sampled_from(numeric))
            container[key] = copy.deepcopy(draw(numbers))
        elif choice == "replace" and places:
            container, key = draw(st.sampled_from(places))
            container[key] = copy.deepcopy(draw(json_values))  # never mutate a drawn value in place
        elif choice == "drop" and places:
            container, key = draw(st.sampled_from(places))
            container.pop(key)
        elif choice == "add":
            record[draw(st.text(max_size=6))] = copy.deepcopy(draw(json_values))
        elif choice == "repeat":
            records.append(copy.deepcopy(record))
    lines = [to_line(r) for r in records]
    tail = draw(st.sampled_from(["", "", "", "cut", "bytes", "blank", "array"]))
    if tail == "cut":
        lines[-1] = lines[-1][: draw(st.integers(0, max(len(lines[-1]) - 1, 0)))]
    elif tail == "bytes":
        lines.insert(draw(st.integers(0, len(lines))), "\udcff\udcfe{")  # written with surrogateescape: invalid UTF-8
    elif tail == "blank":
        lines.append("   ")
    elif tail == "array":
        lines.append("[" * 5000)
    return lines


def inputs(records: list[dict]):
    """Input files: random bytes, lines of random JSON values, or mutated valid records."""
    return st.one_of(
        st.binary(max_size=200).map(lambda b: [b]),
        st.lists(json_values.map(to_line), min_size=0, max_size=3),
        mutated(records),
        mutated(records),
        mutated(records),
    )


def write_input(path: Path, lines) -> Path:
    with open(path, "wb") as handle:
        for line in lines:
            handle.write(line if isinstance(line, bytes) else (line + "\n").encode("utf-8", "surrogateescape"))
    return path


BAD_NUMBERS = ["-1", "nan", "inf", "-inf", "abc", "", "1e400", "0x10", "1e13"]
SWITCH = True  # a flag without a value


def options(data, specs) -> list[str]:
    """Options for one run from ``(flag, good values, bad values)`` specs: each flag absent or with a good value, and
    in about one run in three one flag with a bad value instead (so most runs reach the input path)."""
    argv: list[str] = []
    spoiled = [flag for flag, _, bad in specs if bad]
    bad_flag = data.draw(st.sampled_from([None, None, *([None] * len(spoiled)), *spoiled]))
    for flag, good, bad in specs:
        value = data.draw(st.sampled_from(list(bad))) if flag == bad_flag else data.draw(st.sampled_from([None, *good]))
        if value is SWITCH:
            argv.append(flag)
        elif value is not None:
            argv += [flag, value]
    return argv


# ---- the contract --------------------------------------------------------------------------------------------------
def run(argv: list[str], folder: Path, outputs: list[Path], allowed=(0, 2)) -> int:
    """Run the CLI in-process and check the contract; any exception escapes (and fails the test)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse and usage errors
            code = exc.code
    assert code in allowed, (code, argv, err.getvalue()[-2000:])
    if code == 2:
        assert "error:" in err.getvalue(), err.getvalue()
    for out in outputs:
        if code != 0:
            assert not out.exists(), f"{out} written by a failed run"
        elif out.exists() and out.suffix == ".jsonl":
            text = out.read_text(encoding="utf-8")
            assert text == "" or text.endswith("\n")
            assert all(isinstance(json.loads(line), dict) for line in text.split("\n")[:-1])  # not splitlines: U+2028
    leftovers = [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert not leftovers, leftovers
    return code


@contextlib.contextmanager
def scratch():
    with tempfile.TemporaryDirectory() as name:
        yield Path(name)


# ---- labels ----------------------------------------------------------------------------------------------------------
@FUZZ
@given(data=st.data())
def test_labels(household, data):
    tokenizer, pool = household
    lines = data.draw(inputs(SCORED + pool[:2]))
    extra = options(data, [("--target", ["ttg", "steps", "score"], ["bogus"]), ("--terminal", [SWITCH], []),
                           ("--skip-invalid", [SWITCH], []), ("--tokenizer", [str(tokenizer)], ["./no-such-tok"])])
    with scratch() as folder:
        src, out = write_input(folder / "in.jsonl", lines), folder / "out.jsonl"
        code = run(["labels", str(src), "--out", str(out), "--no-progress", *extra], folder, [out])
        assert (code == 0) == out.exists()


# ---- credit ----------------------------------------------------------------------------------------------------------
@FUZZ
@given(data=st.data())
def test_credit(data):
    from deltattg.credit import available_estimators

    lines = data.draw(inputs(SCORED))
    extra = options(data, [("--method", sorted(available_estimators()), ["bogus"]),
                           ("--failure-cost", ["100", "100", "1", "1e12", "6144"], BAD_NUMBERS),
                           ("--rho", ["0", "0.2", "1"], ["1.5", "-0.1", "nan"]),
                           ("--cap", ["1", "5", "1e12"], ["0.5", "inf", "1e13"]),
                           ("--epsilon", ["1e-6", "1"], ["0", "-1", "nan"]),
                           ("--skip-invalid", [SWITCH], []), ("--table", [SWITCH], [])])
    with scratch() as folder:
        src, out = write_input(folder / "in.jsonl", lines), folder / "out.jsonl"
        code = run(["credit", str(src), "--out", str(out), *extra], folder, [out])
        assert (code == 0) == out.exists()


# ---- score (the household oracle: the cheapest real meter) ----------------------------------------------------------
@FEWER
@given(data=st.data())
def test_score(household, data):
    tokenizer, pool = household
    lines = data.draw(inputs(pool[:3]))
    extra = options(data, [("--oracle-noise", ["0", "0.5", "3"], BAD_NUMBERS),
                           ("--oracle-flip", ["0", "0.3", "1"], ["1.5", *BAD_NUMBERS]),
                           ("--oracle-seed", ["0", "7"], ["-1", "x", "99999999999"]),
                           ("--skip-invalid", [SWITCH], []), ("--skip-zero-advantage", [SWITCH], [])])
    with scratch() as folder:
        src, out = write_input(folder / "in.jsonl", lines), folder / "out.jsonl"
        code = run(["score", str(src), "--out", str(out), "--meter", "oracle", "--tokenizer", str(tokenizer),
                    "--no-progress", *extra], folder, [out], allowed=(0, 2, 3))
        assert (code == 0) == out.exists()


# ---- eval-steps (a stand-in meter: the input path is what is fuzzed) ------------------------------------------------
class ConstantMeter:
    """Reads every state as completable with fewer tokens to go the longer the prefix (logits too)."""

    meter_id = "constant"

    def score(self, histories):
        return [MeterOutput(can_complete=True, tokens_to_go=float(100 - len(h)), logit=float(len(h)))
                for h in histories]


@FUZZ
@given(data=st.data())
def test_eval_steps(data):
    lines = data.draw(inputs(LABELLED))
    extra = options(data, [("--failure-cost", ["1", "50", "6144", "1e12"], BAD_NUMBERS),
                           ("--skip-invalid", [SWITCH], []), ("--readout", ["binary", "expected"], ["bogus"])])
    with scratch() as folder, mock.patch("deltattg.meter.loading.load_meter", lambda *a, **k: ConstantMeter()):
        src, out = write_input(folder / "in.jsonl", lines), folder / "results.json"
        code = run(["eval-steps", "--data", str(src), "--meter", "m", "--json", str(out), "--no-progress", *extra],
                   folder, [out])
        if code == 0:
            assert isinstance(json.loads(out.read_text()), dict)
        else:
            assert not out.exists()


# ---- collect's options ------------------------------------------------------------------------------------------------
@FEWER
@given(data=st.data())
def test_collect_options(data):
    policies = data.draw(st.permutations(["expert", "expert:0.3", "random", "expert:2", "expert:nan",
                                          "lm:./no-such-model", "greedy", "expert:0"]))[: data.draw(st.integers(1, 3))]
    extra = [arg for p in policies for arg in ("--policy", p)]
    extra += options(data, [("--episodes", ["1", "2", "3"], ["0", "-1", "x", "1.5", "10000000"]),
                            ("--group-size", ["1", "2"], ["0", "-3", "x"]),
                            ("--max-turns", ["1", "4"], ["0", "-1", "1e3"]),
                            ("--temperature", ["0", "1"], ["-1", "nan", "inf"]),
                            ("--seed", ["0", "3"], ["-1", "x"]),
                            ("--split", ["train", "valid_unseen"], ["nosuch"])])
    env = data.draw(st.sampled_from([["--env", "household", "--short"], ["--env", "household", "--short"],
                                     ["--env", "household", "--short"], ["--env", "alfworld"], ["--env", "nosuch"]]))
    if "--episodes" not in extra:
        extra += ["--episodes", "1"]
    if "--max-turns" not in extra:
        extra += ["--max-turns", "5"]
    with scratch() as folder, mock.patch.dict(os.environ, {"ALFWORLD_DATA": ""}):
        out = folder / "pool.jsonl"
        code = run(["collect", *env, *extra, "--out", str(out), "--no-progress"], folder, [out])
        assert (code == 0) == out.exists()


# ---- inspect (the planner replays the household pool; the other records have no provenance) ---------------------------
@settings(FUZZ, max_examples=EXPLORE or 40)  # every successful run draws a picture
@given(data=st.data())
def test_inspect(household, data):
    tokenizer, pool = household
    lines = data.draw(inputs(pool[:4]))  # household rollouts: every method without a meter can run on them
    extra = options(data, [("--methods", ["grpo", "grpo,gigpo", "hgpo,gigpo", "grpo,deltattg"],
                            ["bogus", "", "grpo,delta"]),
                           ("--failure-cost", ["100", "6144"], BAD_NUMBERS),
                           ("--env", ["household"], ["alfworld"]),
                           ("--show", ["1", "4"], ["0", "-2", "x"]),
                           ("--skip-invalid", [SWITCH], [])])
    with scratch() as folder:
        src, out = write_input(folder / "in.jsonl", lines), folder / "report"
        code = run(["inspect", str(src), "--out", str(out), "--tokenizer", str(tokenizer), *extra], folder,
                   [out / "inspect.json"])  # fmt: skip
        assert (code == 0) == (out / "inspect.json").is_file()


# ---- guide's and evaluate's options (household short: small, fast runs) -----------------------------------------------
FEW = settings(FUZZ, max_examples=EXPLORE or 30)  # each run plays episodes
ACTORS = ["expert", "expert:0.5", "random", "expert:2", "lm:./no-such-model", "greedy", "reflexion:./no-such-model"]


@FEW
@given(data=st.data())
def test_guide_options(household, data):
    tokenizer, _ = household
    extra = options(data, [("--actor", ACTORS, []),
                           ("--episodes", ["1", "2", "50"], ["0", "-1", "x", "51", "1e3"]),
                           ("--candidates", ["1", "3"], ["0", "-2", "65", "x"]),
                           ("--max-turns", ["1", "4"], ["0", "-1", "1e3"]),
                           ("--temperature", ["0", "1"], ["-1", "nan", "inf"]),
                           ("--seed", ["0", "3"], ["-1", "x"]),
                           ("--split", ["train", "valid_unseen"], ["nosuch", ""]),
                           ("--tokenizer", [str(tokenizer)], ["./no-such-tok"])])  # fmt: skip
    extra += [] if "--actor" in extra else ["--actor", "expert:0.5"]
    extra += [] if "--episodes" in extra else ["--episodes", "2"]
    extra += [] if "--max-turns" in extra else ["--max-turns", "3"]
    extra += [] if "--tokenizer" in extra else ["--tokenizer", str(tokenizer)]
    with scratch() as folder:
        out = folder / data.draw(st.sampled_from(["guide.json", "new/guide.json"]))
        code = run(["guide", "--env", "household", "--short", "--meter", "oracle", *extra, "--json", str(out),
                    "--no-progress"], folder, [out])  # fmt: skip
        assert (code == 0) == out.is_file()
        if code == 0:
            report = json.loads(out.read_text())
            assert report["episodes"] == len(set(report["tasks"])) == int(extra[extra.index("--episodes") + 1])
        else:
            assert list(folder.iterdir()) == []


@FEW
@given(data=st.data())
def test_evaluate_options(data):
    extra = options(data, [("--actor", ACTORS, []),
                           ("--episodes", ["1", "3", "50"], ["0", "-1", "x", "51", "1e3"]),
                           ("--max-turns", ["1", "4"], ["0", "-1", "1e3"]),
                           ("--temperature", ["0", "1"], ["-1", "nan", "inf"]),
                           ("--seed", ["0", "3"], ["-1", "x"]),
                           ("--threads", ["0", "1"], ["-1", "x"]),
                           ("--split", ["valid_unseen", "valid_seen,valid_unseen"], ["nosuch", "valid_seen,"])])
    extra += [] if "--actor" in extra else ["--actor", "expert:0.5"]
    extra += [] if "--episodes" in extra else ["--episodes", "2"]
    extra += [] if "--max-turns" in extra else ["--max-turns", "3"]
    extra += [] if "--split" in extra else ["--split", "valid_unseen"]
    with scratch() as folder:
        out = folder / data.draw(st.sampled_from(["run", "new/run"]))
        code = run(["evaluate", "--env", "household", "--short", *extra, "--out", str(out), "--no-progress"], folder,
                   [out])  # fmt: skip
        if code == 0:
            episodes = (out / "episodes.jsonl").read_text(encoding="utf-8").splitlines()
            groups = {json.loads(line)["group"] for line in episodes}
            report = json.loads((out / "results.json").read_text())
            assert len(groups) == len(episodes) == report["episodes"] == int(extra[extra.index("--episodes") + 1])
            assert sorted(p.name for p in out.iterdir()) == ["episodes.jsonl", "results.json", "results.md"]
        else:
            assert list(folder.iterdir()) == []  # nothing written: no folder, no lock file


# ---- train-meter (a tiny regression backbone, one head epoch: a run costs about a second) ----------------------
@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    """The backbone folder of a tiny saved regression meter (what ``--model`` reads)."""
    from test_meter_regression import tiny_meter

    folder = tmp_path_factory.mktemp("meter")
    tiny_meter().save_pretrained(folder)
    return folder / "backbone"


@settings(FUZZ, max_examples=EXPLORE or 25)
@given(data=st.data())
def test_train_meter(household, backbone, data):
    tokenizer, pool = household
    lines = data.draw(inputs(pool[:3]))
    extra = options(data, [("--max-length", ["48", "512"], ["0", "-3", "x"]),
                           ("--batch-size", ["4"], ["0", "x"]),
                           ("--ensemble", ["2"], ["0", "-1"]),
                           ("--layer", ["1", "2"], ["0", "3", "x"]),  # 3: beyond the backbone's 2 layers
                           ("--calibration-fraction", ["0.5"], ["0.9", "-0.1", "nan"]),
                           ("--turn-limit", ["auto", "none", "6"], ["0", "-1", "x"]),
                           ("--pooling", ["last+mean"], ["bogus"]),
                           ("--target", ["score"], ["bogus"]),
                           ("--lr", ["0.01"], ["0", "nan", "-1"]),
                           ("--seed", ["3"], ["-1", "x"]),
                           ("--tokenizer", [str(tokenizer)], ["./no-such-tok"]),
                           ("--kind", [], ["generative", "bogus"]),  # generative: refused (--head-epochs is given)
                           ("--stage", [], ["sft"]),  # a generative meter's option
                           ("--split", [], ["./no-such-split.json"]),
                           ("--skip-invalid", [SWITCH], [])])
    with scratch() as folder:
        src, out = write_input(folder / "in.jsonl", lines), folder / "meter"
        code = run(["train-meter", str(src), "--out", str(out), "--model", str(backbone), "--head-epochs", "1",
                    *extra], folder, [out])  # fmt: skip
        assert (code == 0) == out.exists() and not (folder / ".meter.partial").exists()
        if code == 0:
            assert {"meter_config.json", "head.pt", "train_report.json"} <= {p.name for p in out.iterdir()}


# ---- verl-tasks (household short tasks: a run costs a fraction of a second) ---------------------------------------
@FEWER
@given(data=st.data())
def test_verl_tasks_options(data):
    import pyarrow.parquet as pq

    extra = options(data, [("--split", ["train", "valid_unseen"], ["nosuch", "", "valid_seen,"]),
                           ("--limit", ["1", "3"], ["0", "-1", "x", *BAD_NUMBERS[:3]]),
                           ("--short", [SWITCH], []), ("--data", ["/nonexistent"], [])])
    extra += [] if "--limit" in extra else ["--limit", "2"]
    with scratch() as folder:
        out = folder / data.draw(st.sampled_from(["t.parquet", "new/t.parquet", "t.parquet/"]))
        code = run(["verl-tasks", "--env", "household", *extra, "--out", str(out), "--no-progress"], folder, [out])
        if code == 0:
            rows = pq.read_table(out).to_pylist()
            assert len(rows) == int(extra[extra.index("--limit") + 1])
            assert all(row["agent_name"] == "deltattg_env" for row in rows)
        else:
            assert [p for p in folder.rglob("*") if p.is_file()] == []  # nothing written
