"""The bad-input contract, one defect at a time (issue 10, items 6-8): every command stops at the first bad record or
option with ``deltattg: error: FILE:LINE: FIELD: what is wrong`` (or argparse's one line), exit status 2 and nothing
written; ``--skip-invalid`` skips and counts; local model paths never reach the Hugging Face Hub."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import time
from pathlib import Path
from unittest import mock

import pytest

from deltattg.cli import main
from deltattg.data.trajectory import MeterOutput

OK = lambda v: {"can_complete": True, "tokens_to_go": v}  # noqa: E731
GOOD = {"id": "a", "group": "g", "reward": 1.0, "success": True, "step_tokens": [3, 4], "meter": [OK(10), OK(5)]}
OTHER = {"id": "b", "group": "g", "reward": 0.0, "success": False, "step_tokens": [2],
         "meter": [{"can_complete": False, "tokens_to_go": None}]}


def write(path: Path, lines) -> Path:
    """Lines as given: bytes verbatim, dicts as JSON, strings as text."""
    with open(path, "wb") as handle:
        for line in lines:
            if isinstance(line, dict):
                line = json.dumps(line)
            handle.write((line if isinstance(line, bytes) else line.encode()) + b"\n")
    return path


def run(argv, capsys) -> tuple[int, str]:
    """Exit status and stderr of one in-process run; argparse's exits count as statuses."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def credit(src: Path, out: Path, *extra: str) -> list[str]:
    return ["credit", str(src), "--failure-cost", "100", "--out", str(out), *extra]


def only_inputs_left(folder: Path, *inputs: Path) -> bool:
    return sorted(folder.iterdir()) == sorted(inputs)


# ---- item 6: tracebacks --------------------------------------------------------------------------------------------
def test_invalid_utf8_names_file_and_line(tmp_path, capsys):
    src = write(tmp_path / "in.jsonl", [GOOD, b'{"id": "b\xff", "group": "g"}'])
    code, err = run(credit(src, tmp_path / "out.jsonl"), capsys)
    assert code == 2 and f"{src}:2: not valid UTF-8" in err and only_inputs_left(tmp_path, src)


def test_deeply_nested_json_is_an_input_error(tmp_path, capsys):
    src = write(tmp_path / "in.jsonl", [GOOD, "[" * 100_000, '{"id": ' + "[" * 500 + "]" * 500 + "}"])
    code, err = run(credit(src, tmp_path / "out.jsonl"), capsys)
    assert code == 2 and f"{src}:2: malformed JSON: nested deeper than" in err and only_inputs_left(tmp_path, src)


@pytest.mark.parametrize("field, value, message", [
    ("reward", 1e300, "reward: must be at most 1e+09 in magnitude"),
    ("step_tokens", [10**30, 4], "step_tokens[0]: must be at most 1,000,000,000"),
    ("step_tokens", [2**63, 4], "step_tokens[0]: must be at most"),
    ("meter", [OK(1e300), OK(5)], "meter[0].tokens_to_go: must be at most 1e+12"),
    ("meter", [{"logit": 1e300}, None], "meter[0].logit: must be at most"),
    ("meter", [{"can_complete": True, "tokens_to_go": 3, "probability": 1.5}, None], "meter[0].probability: must be in [0, 1]"),
    ("meter", [{"can_complete": False, "tokens_to_go": -3}, None], "meter[0].tokens_to_go: must be non-negative"),
])  # fmt: skip
def test_numbers_that_would_overflow_are_refused_on_input(tmp_path, capsys, field, value, message):
    src = write(tmp_path / "in.jsonl", [OTHER, {**GOOD, field: value}])
    code, err = run(credit(src, tmp_path / "out.jsonl"), capsys)
    assert code == 2 and f"{src}:2: {message}" in err and only_inputs_left(tmp_path, src)


@pytest.mark.parametrize("option, value", [("--cap", "inf"), ("--cap", "1e300"), ("--rho", "nan"), ("--rho", "1.5"),
                                           ("--failure-cost", "inf"), ("--failure-cost", "-5"), ("--epsilon", "0"),
                                           ("--cap", "x"), ("--share-cap", "0.5"), ("--share-cap", "nan"),
                                           ("--smooth", "0"), ("--trust", "magic")])  # fmt: skip
def test_non_finite_and_out_of_range_options_are_refused_at_parse_time(tmp_path, capsys, option, value):
    src = write(tmp_path / "in.jsonl", [GOOD, OTHER])
    code, err = run([*credit(src, tmp_path / "out.jsonl"), option, value], capsys)
    assert code == 2 and f"argument {option}: " in err and "Traceback" not in err
    assert only_inputs_left(tmp_path, src)


def test_an_even_running_median_is_refused_by_name(tmp_path, capsys):
    src = write(tmp_path / "in.jsonl", [GOOD, OTHER])
    code, err = run([*credit(src, tmp_path / "out.jsonl"), "--method", "deltattg_robust", "--smooth", "4"], capsys)
    assert code == 2 and "smooth (the running median's window) must be an odd integer" in err
    assert only_inputs_left(tmp_path, src)


@pytest.mark.parametrize("argv, message", [
    (["--oracle-noise", "inf"], "argument --oracle-noise"),
    (["--oracle-flip", "2"], "argument --oracle-flip"),
    (["--oracle-seed", "-1"], "argument --oracle-seed"),
])  # fmt: skip
def test_meter_options_are_checked(tmp_path, capsys, argv, message):
    src = write(tmp_path / "in.jsonl", [GOOD])
    code, err = run(["score", str(src), "--meter", "oracle", "--out", str(tmp_path / "o.jsonl"), *argv], capsys)
    assert code == 2 and message in err


class ConstantMeter:
    meter_id = "constant"

    def score(self, histories):
        return [MeterOutput(can_complete=True, tokens_to_go=float(100 - len(h))) for h in histories]


def apb(index: int, labels) -> dict:
    return {"total_index": index, "final_label": 1, "data_source": "toy",
            "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                         {"role": "tool", "content": "r"}, {"role": "assistant", "content": "b"}],
            "step_labels": labels}


@pytest.mark.parametrize("labels, message", [
    ([1, -1], "step_labels: must be an object"),
    ({"one": 1}, "step_labels: keys are message indices"),
    ({"1": "good"}, "step_labels['1']: must be -1, 0 or 1"),
    ({"1": 2}, "step_labels['1']: must be -1, 0 or 1"),
    ({"1": 0.5}, "step_labels['1']: must be -1, 0 or 1"),
    ({"1": True}, "step_labels['1']: must be -1, 0 or 1"),
])  # fmt: skip
def test_malformed_step_labels_in_eval_steps(tmp_path, capsys, labels, message):
    src = write(tmp_path / "apb.jsonl", [apb(0, {"1": 1, "3": -1}), apb(1, labels)])
    out = tmp_path / "eval.json"
    with mock.patch("deltattg.meter.loading.load_meter", lambda *a, **k: ConstantMeter()):
        code, err = run(["eval-steps", "--data", str(src), "--meter", "m", "--json", str(out), "--no-progress"], capsys)
        assert code == 2 and f"{src}:2: {message}" in err and not out.exists()
        write(src, [apb(0, {"1": 1, "3": -1})])  # the good record alone evaluates
        assert run(["eval-steps", "--data", str(src), "--meter", "m", "--json", str(out), "--no-progress"], capsys)[0] == 0


@pytest.mark.parametrize("command", ["labels", "credit"])
def test_out_naming_a_folder(tmp_path, capsys, command):
    src = write(tmp_path / "in.jsonl", [GOOD, OTHER])
    (tmp_path / "folder").mkdir()
    extra = ["--failure-cost", "100"] if command == "credit" else []
    code, err = run([command, str(src), "--out", str(tmp_path / "folder"), *extra], capsys)
    assert code == 2 and "folder: is a folder" in err
    assert list((tmp_path / "folder").iterdir()) == []


def test_corrupt_sqlite_cache_is_a_clear_error(tmp_path, capsys):
    from deltattg.errors import InputError
    from deltattg.meter.cache import ScoreCache

    corrupt = tmp_path / "cache.db"
    corrupt.write_bytes(b"this is not a database" * 100)
    with pytest.raises(InputError, match="cache.db: unusable SQLite cache"):
        ScoreCache(corrupt)
    other = tmp_path / "other.db"  # a database, but not a meter cache
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE readings (x)")
    with pytest.raises(InputError, match="not a meter cache"):
        ScoreCache(other)
    src = write(tmp_path / "in.jsonl", [GOOD])
    # The endpoint is never contacted: the cache is refused when the meter is built.
    code, err = run(["score", str(src), "--meter", "http://127.0.0.1:9/v1", "--meter-model", "m", "--cache",
                     str(corrupt), "--out", str(tmp_path / "o.jsonl")], capsys)  # fmt: skip
    assert code == 2 and "unusable SQLite cache" in err and not (tmp_path / "o.jsonl").exists()


def test_a_garbled_cache_row_is_read_again(tmp_path):
    from deltattg.meter.cache import ScoreCache

    with ScoreCache(tmp_path / "c.db") as cache:
        cache.put_many("m", {"h1": MeterOutput(True, 5.0), "h2": MeterOutput(True, 6.0)})
        cache._conn.execute("UPDATE readings SET reading = '{\"can_complete\": 3' WHERE prefix_hash = 'h1'")
        assert cache.get_many("m", ["h1", "h2"]) == {"h2": MeterOutput(True, 6.0)}


@pytest.mark.parametrize("content, message", [
    ('{"kind": "regression"', "meter_config.json: malformed JSON"),
    ("[1, 2]", "meter_config.json: expected a JSON object"),
    ('{"kind": "magic"}', "meter_config.json: kind: unknown meter kind 'magic'"),
    ('{"kind": "regression", "backbone": 3}', "meter_config.json: backbone: must name the backbone"),
    ('{"kind": "regression", "backbone": "b", "max_length": "long"}', "meter_config.json: max_length: must be a positive"),
    ('{"kind": "regression", "backbone": "b", "colour": 1}', "meter_config.json: colour: unknown settings"),
    (b'\xff\xfe', "meter_config.json: not valid UTF-8"),
])  # fmt: skip
def test_malformed_meter_config(tmp_path, capsys, content, message):
    meter = tmp_path / "meter"
    meter.mkdir()
    (meter / "meter_config.json").write_bytes(content if isinstance(content, bytes) else content.encode())
    src = write(tmp_path / "in.jsonl", [GOOD])
    code, err = run(["score", str(src), "--meter", str(meter), "--out", str(tmp_path / "o.jsonl")], capsys)
    assert code == 2 and message in err and not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize("content, message", [
    ("optim: {lr: [1\n", "c.yaml: not valid YAML: line 2"),
    ("optim:\n  lr: fast\n", "c.yaml: optim.lr: expected float"),
    ("optim:\n  lr: .nan\n", "c.yaml: optim.lr: must be a finite number"),
    ("rollout:\n  batch_size: [8]\n", "c.yaml: rollout.batch_size: expected int"),
    ("actor:\n  model: {a: 1}\n", "c.yaml: actor.model: expected a string"),
    ("- just\n- a list\n", "c.yaml: expected a mapping"),
    ("\xff", "c.yaml: not valid UTF-8"),
])  # fmt: skip
def test_malformed_train_config_names_the_file(tmp_path, capsys, content, message):
    config = tmp_path / "c.yaml"
    config.write_bytes(content.encode("latin-1"))
    code, err = run(["train", "--config", str(config), "--out", str(tmp_path / "run"), "--print-config"], capsys)
    assert code == 2 and message in err and not (tmp_path / "run").exists()


@pytest.mark.parametrize("episodes", ["0", "-3", "x", "10000001"])
def test_collect_episodes_must_be_positive(tmp_path, capsys, episodes):
    code, err = run(["collect", "--env", "household", "--short", "--policy", "expert", "--episodes", episodes,
                     "--out", str(tmp_path / "o.jsonl")], capsys)  # fmt: skip
    assert code == 2 and "argument --episodes" in err and not (tmp_path / "o.jsonl").exists()


def test_collect_alfworld_without_data_names_the_remedy(tmp_path, capsys):
    with mock.patch.dict(os.environ, {"ALFWORLD_DATA": ""}):
        code, err = run(["collect", "--env", "alfworld", "--policy", "expert", "--episodes", "1", "--out",
                         str(tmp_path / "o.jsonl")], capsys)  # fmt: skip
    assert code == 2 and ("--data" in err and "ALFWORLD_DATA" in err or "[alfworld]" in err)
    assert "Traceback" not in err and not (tmp_path / "o.jsonl").exists()


def test_collect_refuses_repeated_policies(tmp_path, capsys):
    code, err = run(["collect", "--env", "household", "--short", "--policy", "expert", "--policy", "expert:0",
                     "--episodes", "1", "--out", str(tmp_path / "o.jsonl")], capsys)  # fmt: skip
    assert code == 2 and "given more than once" in err


def test_skip_invalid_skips_undecodable_and_non_object_lines(tmp_path, capsys):
    src = write(tmp_path / "in.jsonl", [GOOD, b"\xff\xfe", "[1, 2]", "null", "[[[" * 10_000, '"text"', OTHER])
    out = tmp_path / "out.jsonl"
    code, err = run([*credit(src, out), "--skip-invalid"], capsys)
    assert code == 0 and "skipped 5 invalid record(s)" in err
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["a", "b"]


def test_lone_surrogates_are_refused(tmp_path, capsys):
    src = write(tmp_path / "in.jsonl", [GOOD, '{"id": "\\ud800", "group": "g", "reward": 1, "success": true, '
                                              '"step_tokens": [1]}'])
    code, err = run(credit(src, tmp_path / "out.jsonl"), capsys)
    assert code == 2 and f"{src}:2: not valid Unicode" in err


def test_malformed_message_parts_and_tool_calls(tmp_path, capsys):
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": [{"text": 5}]}]
    src = write(tmp_path / "in.jsonl", [{"id": 1, "group": "g", "reward": 1, "success": True, "messages": messages}])
    code, err = run(["labels", str(src), "--target", "steps", "--out", str(tmp_path / "o.jsonl")], capsys)
    assert code == 2 and "messages[1].content[0]" in err
    messages[1] = {"role": "assistant", "content": "", "tool_calls": [{"function": 7}]}
    write(src, [{"id": 1, "group": "g", "reward": 1, "success": True, "messages": messages}])
    code, err = run(["labels", str(src), "--target", "steps", "--out", str(tmp_path / "o.jsonl")], capsys)
    assert code == 2 and "messages[1].tool_calls[0]" in err


# ---- item 7: silent acceptance -------------------------------------------------------------------------------------
@pytest.mark.parametrize("content", [b"", b"\n  \n\n"])
def test_empty_input_is_an_error(tmp_path, capsys, content):
    src = tmp_path / "in.jsonl"
    src.write_bytes(content)
    code, err = run(["labels", str(src), "--out", str(tmp_path / "o.jsonl")], capsys)
    assert code == 2 and f"{src}: no records: the file is empty" in err and not (tmp_path / "o.jsonl").exists()


def test_nothing_left_after_skipping_is_an_error(tmp_path, capsys):
    src = write(tmp_path / "in.jsonl", ["{", "[]"])
    code, err = run([*credit(src, tmp_path / "o.jsonl"), "--skip-invalid"], capsys)
    assert code == 2 and "no valid records (2 invalid" in err


def test_duplicate_ids_are_an_error_and_skip_invalid_keeps_the_first(tmp_path, capsys):
    src = write(tmp_path / "in.jsonl", [GOOD, OTHER, {**GOOD, "reward": 0.5}])
    out = tmp_path / "out.jsonl"
    code, err = run(credit(src, out), capsys)
    assert code == 2 and f"{src}:3: id: duplicate trajectory id 'a' (first on line 1)" in err and not out.exists()
    code, err = run([*credit(src, out), "--skip-invalid"], capsys)
    assert code == 0 and "skipped 1 record(s) repeating an earlier id" in err
    assert [json.loads(line)["reward"] for line in out.read_text().splitlines()] == [1.0, 0.0]


@pytest.mark.parametrize("labels", [{"1": 2}, {"1": -3}, {"3": 0.5}])
def test_step_labels_outside_minus_one_to_one(tmp_path, capsys, labels):
    src = write(tmp_path / "apb.jsonl", [apb(0, labels)])
    with mock.patch("deltattg.meter.loading.load_meter", lambda *a, **k: ConstantMeter()):
        code, err = run(["eval-steps", "--data", str(src), "--meter", "m", "--no-progress"], capsys)
    assert code == 2 and "must be -1, 0 or 1" in err


@pytest.mark.parametrize("setting, message", [
    ("optim.lr=nan", "optim.lr: must be a finite number"),
    ("optim.lr=-1e-5", "optim.lr must be > 0"),
    ("optim.lr=0", "optim.lr must be > 0"),
    ("credit.failure_cost=-5", "failure cost C must be in (0"),
    ("credit.cap=inf", "credit.cap: must be a finite number"),
    ("credit.rho=nan", "credit.rho: must be a finite number"),
    ("loss.kl_coef=-0.1", "loss.kl_coef must be >= 0"),
    ("rollout.top_p=0", "rollout.top_p must be in (0, 1]"),
    ("rollout.temperature=-1", "rollout.temperature must be >= 0"),
    ("optim.max_grad_norm=inf", "optim.max_grad_norm: must be a finite number"),
    ("actor.dtype=float8", "actor.dtype must be one of"),
    ("run.steps=2.5", "run.steps: expected int"),
])  # fmt: skip
def test_non_finite_and_negative_train_settings(tmp_path, capsys, setting, message):
    code, err = run(["train", "--preset", "household-tiny", "--set", setting, "--print-config"], capsys)
    assert code == 2 and message in err


@pytest.mark.parametrize("argv", [
    ["credit", "--failure-cost", "-1"],
    ["eval-steps", "--meter", "m", "--failure-cost", "-1"],
    ["inspect", "--failure-cost", "0"],
])  # fmt: skip
def test_negative_failure_costs(tmp_path, capsys, argv):
    src = write(tmp_path / "in.jsonl", [GOOD])
    argv = [argv[0], *(["--data", str(src)] if argv[0] == "eval-steps" else [str(src)]), *argv[1:],
            *(["--out", str(tmp_path / "o")] if argv[0] != "eval-steps" else [])]
    code, err = run(argv, capsys)
    assert code == 2 and "argument --failure-cost: must be in (0, 1e+12]" in err


@pytest.mark.parametrize("command", ["labels", "credit", "score"])
def test_out_equal_to_the_input_is_refused(tmp_path, capsys, monkeypatch, command):
    src = write(tmp_path / "x.jsonl", [GOOD, OTHER])
    before = src.read_bytes()
    monkeypatch.chdir(tmp_path)
    extra = {"labels": [], "credit": ["--failure-cost", "100"], "score": ["--meter", "oracle"]}[command]
    for out in ("x.jsonl", "./x.jsonl", str(src)):
        code, err = run([command, "x.jsonl", "--out", out, *extra], capsys)
        assert code == 2 and "is also an input" in err
    link = tmp_path / "link.jsonl"
    link.symlink_to(src)
    code, err = run([command, "x.jsonl", "--out", str(link), *extra], capsys)
    assert code == 2 and "is also an input" in err
    assert src.read_bytes() == before


def test_eval_steps_json_equal_to_the_data_is_refused(tmp_path, capsys):
    src = write(tmp_path / "apb.jsonl", [apb(0, {"1": 1})])
    code, err = run(["eval-steps", "--data", str(src), "--meter", "m", "--json", str(src)], capsys)
    assert code == 2 and "is also an input" in err


@pytest.mark.parametrize("argv, flag", [
    (["eval-meter", "{pool}", "--meter", "{meter}", "--json", "{meter}/meter_config.json"], "--json"),
    (["eval-meter", "{pool}", "--meter", "oracle", "--reference", "{meter}", "--tokenizer", "{meter}/tok",
      "--json", "{meter}/head.pt"], "--json"),
    (["score", "{pool}", "--meter", "{meter}", "--out", "{meter}/head.pt"], "--out"),
    (["score", "{pool}", "--meter", "{meter},{meter}", "--out", "{meter}/sub/x.jsonl"], "--out"),
    (["eval-steps", "--data", "{pool}", "--meter", "{meter}", "--json", "{meter}/meter_config.json"], "--json"),
    (["guide", "--env", "household", "--short", "--actor", "random", "--episodes", "1", "--meter", "{meter}", "--json",
      "{meter}/head.pt"], "--json"),
    (["labels", "{pool}", "--labels", "td", "--bootstrap-meter", "{meter}", "--out", "{meter}/head.pt"], "--out"),
])  # fmt: skip
def test_an_output_inside_a_meter_it_reads_is_refused(tmp_path, capsys, argv, flag):
    """An output may not name or lie inside any input: the meter (a folder; one of an ensemble), the reference, the
    bootstrap meter. Refused naming the option, before anything is read; the meter is left as it was."""
    from test_meter_regression import tiny_meter

    meter = tmp_path / "meter"
    tiny_meter().save_pretrained(meter)
    before = {p.name: p.read_bytes() for p in meter.iterdir() if p.is_file()}
    pool = write(tmp_path / "pool.jsonl", [GOOD])
    code, err = run([arg.format(pool=pool, meter=meter) for arg in argv], capsys)
    assert code == 2 and f"{flag} {meter}/" in err and "lies inside an input" in err, err
    assert {p.name: p.read_bytes() for p in meter.iterdir() if p.is_file()} == before


def meter_for_turns(folder: Path, turns: int) -> Path:
    """A tiny regression meter whose input states the turns left of a ``turns``-turn limit, saved to ``folder``."""
    from dataclasses import replace as replaced

    from test_meter_regression import tiny_meter

    meter = tiny_meter()
    meter.config = replaced(meter.config, turn_limit=turns)
    meter.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("argv", [
    ["score", "{pool}", "--meter", "{meter}", "--out", "{tmp}/s.jsonl"],
    ["eval-meter", "{pool}", "--meter", "{meter}"],
    ["eval-meter", "{pool}", "--meter", "oracle", "--reference", "{meter}", "--tokenizer", "{meter}/backbone"],
    ["eval-steps", "--data", "{pool}", "--meter", "{meter}"],
    ["labels", "{pool}", "--labels", "td", "--bootstrap-meter", "{meter}", "--out", "{tmp}/l.jsonl"],
])  # fmt: skip
def test_a_meter_of_another_turn_limit_is_refused_on_records(tmp_path, capsys, argv):
    """A meter trained with the turns left of a 5-turn limit would read the turns left of records played with 12
    wrong: score, eval-meter (both meters), eval-steps and td labels refuse it naming the record, nothing written."""
    meter = meter_for_turns(tmp_path / "meter", 5)
    record = {**apb(0, {"1": 1}), "id": "a", "group": "g", "reward": 1.0, "success": True, "step_tokens": [3, 4],
              "env": {"name": "toy", "max_turns": 12}}
    pool = write(tmp_path / "pool.jsonl", [record])
    code, err = run([arg.format(pool=pool, meter=meter, tmp=tmp_path) for arg in argv], capsys)
    assert code == 2 and f"{pool}:1: env.max_turns: the record was played with a 12-turn limit" in err, err
    assert "was trained on episodes of 5 turns" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meter", "pool.jsonl"]


def test_guide_with_a_meter_of_another_turn_limit_is_a_usage_error(tmp_path, capsys):
    meter = meter_for_turns(tmp_path / "meter", 5)
    code, err = run(["guide", "--env", "household", "--short", "--actor", "random", "--episodes", "1", "--max-turns",
                     "12", "--meter", str(meter)], capsys)  # fmt: skip
    assert code == 2 and "trained on episodes of 5 turns" in err and "Traceback" not in err


def test_outputs_keep_the_mode_of_the_file_they_replace(tmp_path, capsys):
    src = write(tmp_path / "in.jsonl", [GOOD, OTHER])
    out = tmp_path / "out.jsonl"
    out.write_text("old\n")
    for mode in (0o644, 0o640, 0o600, 0o664):
        out.chmod(mode)
        assert run(credit(src, out), capsys)[0] == 0
        assert stat.S_IMODE(out.stat().st_mode) == mode and "old" not in out.read_text()


def test_new_outputs_get_the_umask_default(tmp_path, capsys):
    src = write(tmp_path / "in.jsonl", [GOOD, OTHER])
    for umask in (0o022, 0o027, 0o002):
        old = os.umask(umask)
        try:
            out = tmp_path / f"out-{umask:o}.jsonl"
            assert run(credit(src, out), capsys)[0] == 0
        finally:
            os.umask(old)
        assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask


# ---- item 8: local-looking specs never reach the Hub ---------------------------------------------------------------
def no_hub(*args, **kwargs):
    raise AssertionError("a local-looking spec reached transformers' from_pretrained")


@pytest.fixture
def hub_forbidden():
    with mock.patch("transformers.AutoTokenizer.from_pretrained", no_hub), \
         mock.patch("transformers.AutoModelForCausalLM.from_pretrained", no_hub):  # fmt: skip
        yield


@pytest.mark.parametrize("spec", ["./typo", "../no/such/tokenizer", "/no/such/dir", "~/no-such-deltattg-model",
                                  "sub/typo", "./typo::model.gguf"])  # fmt: skip
def test_a_missing_local_tokenizer_is_refused_at_once(tmp_path, capsys, monkeypatch, hub_forbidden, spec):
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "go"}]
    src = write(tmp_path / "in.jsonl", [{"id": 1, "group": "g", "reward": 1, "success": True, "messages": messages}])
    start = time.monotonic()
    code, err = run(["labels", str(src), "--out", "o.jsonl", "--tokenizer", spec], capsys)
    assert time.monotonic() - start < 10
    assert code == 2 and "no such file or folder" in err and "not looked up on the Hugging Face Hub" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o.jsonl").exists()


def test_a_folder_that_is_not_a_model_is_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    src = write(tmp_path / "in.jsonl", [GOOD])
    code, err = run(["labels", str(src), "--out", str(tmp_path / "o.jsonl"), "--tokenizer", str(tmp_path / "empty")],
                    capsys)
    assert code == 2 and "cannot load a tokenizer from this folder" in err and "Traceback" not in err


def test_a_missing_local_meter_is_refused_at_once(tmp_path, capsys, hub_forbidden):
    src = write(tmp_path / "in.jsonl", [GOOD])
    code, err = run(["score", str(src), "--meter", str(tmp_path / "no-meter"), "--out", str(tmp_path / "o.jsonl")],
                    capsys)
    assert code == 2 and "no-meter: no such file or folder" in err


def test_collect_with_a_missing_local_model(tmp_path, capsys, hub_forbidden):
    code, err = run(["collect", "--env", "household", "--short", "--policy", "lm:./no-model", "--episodes", "1",
                     "--out", str(tmp_path / "o.jsonl")], capsys)  # fmt: skip
    assert code == 2 and "./no-model: no such file or folder" in err


@pytest.mark.parametrize("argv", [["--set", "actor.model=./no-actor"], ["--method", "deltattg", "--meter", "./no-meter"]])
def test_train_refuses_a_missing_actor_or_meter_before_writing(tmp_path, capsys, monkeypatch, hub_forbidden, argv):
    monkeypatch.chdir(tmp_path)
    code, err = run(["train", "--preset", "household-tiny", "--out", "run", *argv], capsys)
    assert code == 2 and "no such file or folder" in err
    assert not (tmp_path / "run").exists()  # no config.yaml left behind


def test_train_refuses_a_malformed_meter_folder_before_writing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "meter").mkdir()
    (tmp_path / "meter" / "meter_config.json").write_text("{")
    code, err = run(["train", "--preset", "household-tiny", "--out", "run", "--method", "deltattg", "--meter", "meter"],
                    capsys)
    assert code == 2 and "meter_config.json: malformed JSON" in err and not (tmp_path / "run").exists()


# ---- issue 21: trajectories without actions ------------------------------------------------------------------------
def no_actions(index: int, reward: float) -> dict:
    """A trajectory that ended before its first action: no steps, no readings, the answer's log-prob before it."""
    return {"id": f"none{index}", "group": "g", "reward": reward, "success": reward > 0,
            "messages": [{"role": "user", "content": "go"}], "step_tokens": [], "meter": [], "answer_logprobs": [-1.0]}


ONE_ACTION = {"id": "one", "group": "g", "reward": 0.0, "success": False, "step_tokens": [3],
              "messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": "look"}],
              "meter": [{"can_complete": True, "tokens_to_go": 5, "logit": 0.5, "score": 0.2, "probability": 0.6}],
              "answer_logprobs": [-1.0, -0.5]}  # fmt: skip
COUNTS_TRAJECTORIES = {"igpo", "a2tgpo"}  # their outcome term counts each trajectory once (verl's GRPO), not its steps


def estimators() -> list[str]:
    from deltattg.credit import available_estimators

    return available_estimators()


@pytest.mark.parametrize("method", estimators())
@pytest.mark.parametrize("batch", ["only", "mixed"])
def test_trajectories_without_actions_get_no_step_credit(tmp_path, capsys, method, batch):
    # A batch of only action-less trajectories has zero step columns: the meter-reading estimators tracebacked
    # ("index 0 is out of bounds"), and GRPO gave the one with R = 1 A = 1/ε = 1e6 (a group without a single
    # step-expanded row). Such a trajectory has no token to credit: it is kept, with no step credit and, where the
    # statistics are over steps (Eq. 14, GiGPO, HGPO), A = 0 — it does not enter them.
    from deltattg.credit import get_estimator

    rows = [no_actions(0, 1.0), no_actions(1, 0.0)] + ([ONE_ACTION] if batch == "mixed" else [])
    src, out = write(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    code, err = run(credit(src, out, "--method", method), capsys)
    if get_estimator(method).records_problem() is not None:  # it reads what only the actor gives (DelTA, CrEST)
        assert code == 2 and "runs inside `deltattg train`" in err and not out.exists()
        return
    assert code == 0, err
    records = [json.loads(line) for line in out.read_text().splitlines()]
    for record in records[:2]:
        assert record["step_advantages"] == [] and record.get("step_weights", []) == []
        assert record["advantage"] == 0.0 or method in COUNTS_TRAJECTORIES
    assert all(abs(record["advantage"]) < 10 for record in records)
