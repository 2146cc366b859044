"""``deltattg labels`` / ``credit`` on hand examples, and bad input: a clear error naming file and line, exit ≠ 0,
no output file left behind."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import assert_refused_on_records
from deltattg.cli import main


def write(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def traj(id, group, success, step_tokens, meter):
    return {"id": id, "group": group, "reward": float(success), "success": success, "step_tokens": step_tokens, "meter": meter}


OK = lambda v: {"can_complete": True, "tokens_to_go": v}  # noqa: E731
FAIL = {"can_complete": False, "tokens_to_go": None}


def test_credit_hand_example(tmp_path):
    # The hand example of test_credit_examples: success, n = [10, 20, 30], TTG [100, 60, 20] -> w = [29, 29, 17]/23.
    src = write(tmp_path / "in.jsonl", [traj("a", "g", True, [10, 20, 30], [OK(100), OK(60), OK(20)]),
                                         traj("b", "g", False, [5], [FAIL])])
    out = tmp_path / "out.jsonl"
    assert main(["credit", str(src), "--failure-cost", "1000", "--out", str(out)]) == 0
    a, b = [json.loads(line) for line in out.read_text().splitlines()]
    assert a["step_weights"] == pytest.approx([29 / 23, 29 / 23, 17 / 23], rel=1e-5)
    assert a["step_advantages"] == pytest.approx([a["advantage"] * w for w in a["step_weights"]])
    assert a["credit"] == "redistributed" and b["credit"] == "all_unsuccessful"
    assert a["meter"] == [OK(100), OK(60), OK(20)]  # the input record is repeated as it was


def test_labels_hand_example(tmp_path, tiny_tokenizer):
    messages = [{"role": "user", "content": "put the mug"}, {"role": "assistant", "content": "go to mug"},
                {"role": "user", "content": "ok"}, {"role": "assistant", "content": "take mug"}]
    src = write(tmp_path / "in.jsonl", [{"id": 1, "group": "g", "reward": 1, "success": True, "messages": messages,
                                         "step_tokens": [4, 3]}])
    out = tmp_path / "labels.jsonl"
    assert main(["labels", str(src), "--out", str(out), "--terminal", "--no-progress"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["step"], r["tokens_to_go"]) for r in rows] == [("1", 0, 7), ("1", 1, 3), ("1", 2, 0)]
    assert rows[1]["messages"] == messages[:3]


GOOD = traj("a", "g", True, [3, 4], [OK(10), OK(5)])
BAD_INPUTS = {
    "malformed JSON": (['{"id": "x", "group"'], 1, "malformed JSON"),
    "missing field": ([{k: v for k, v in GOOD.items() if k != "reward"}], 1, "reward: missing required field"),
    "negative tokens": ([dict(GOOD, step_tokens=[3, -1])], 1, "step_tokens[1]: must be a non-negative integer"),
    "fractional tokens": ([dict(GOOD, step_tokens=[2.5, 4])], 1, "step_tokens[0]: must be a non-negative integer"),
    "meter length": ([dict(GOOD, meter=[OK(3)])], 1, "meter: has 1 entries but the trajectory has 2 steps"),
    "NaN reward": (['{"id": "a", "group": "g", "reward": NaN, "success": true, "step_tokens": [1], "meter": [null]}'],
                   1, "NaN is not valid JSON"),
    "inf meter": (['{"id": "a", "group": "g", "reward": 1, "success": true, "step_tokens": [1], '
                   '"meter": [{"can_complete": true, "tokens_to_go": Infinity}]}'], 1, "Infinity is not valid JSON"),
    "overflowing number": (['{"id": "a", "group": "g", "reward": 1e400, "success": true, "step_tokens": [1]}'], 1,
                           "reward: must be finite"),
    "completable without count": ([dict(GOOD, meter=[OK(None), OK(3)])], 1, "meter[0].tokens_to_go"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_names_file_and_line_and_writes_nothing(tmp_path, capsys, case):
    records, line, message = BAD_INPUTS[case]
    src = write(tmp_path / "in.jsonl", [GOOD, *records])  # the bad record sits on line 2
    out = tmp_path / "out.jsonl"
    assert main(["credit", str(src), "--failure-cost", "100", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{src}:{line + 1}:" in err and message in err
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [src]  # no temporary file left either


def test_skip_invalid_reports_the_count(tmp_path, capsys):
    src = write(tmp_path / "in.jsonl", [GOOD, dict(GOOD, step_tokens=[-1, 2]), dict(GOOD, id="b", success=False, reward=0)])
    out = tmp_path / "out.jsonl"
    assert main(["credit", str(src), "--failure-cost", "100", "--out", str(out), "--skip-invalid"]) == 0
    assert "skipped 1 invalid record" in capsys.readouterr().err
    assert len(out.read_text().splitlines()) == 2


def test_method_specific_reading_missing(tmp_path, capsys):
    src = write(tmp_path / "in.jsonl", [GOOD])
    assert main(["credit", str(src), "--method", "logit", "--out", str(tmp_path / "o.jsonl")]) == 2
    assert f"{src}:1: meter[0].logit" in capsys.readouterr().err


def test_an_estimator_that_reads_the_actor_is_refused_on_records(tmp_path, capsys):
    """DelTA's ω needs the actor's hidden states, which no record carries: ``credit`` and ``inspect`` refuse it (the
    record's ``reads`` says so), naming where it runs, and write nothing."""
    src = write(tmp_path / "in.jsonl", [GOOD])
    message = "delta reads the actor's token hidden states: it runs inside `deltattg train`"
    assert_refused_on_records(tmp_path, capsys, src, "delta", message)
    from deltattg.credit import CreditConfig
    from deltattg.credit.records import assign_credit
    from deltattg.data.sources import read_trajectory_file

    with pytest.raises(ValueError, match="runs inside `deltattg train`"):
        assign_credit(read_trajectory_file(str(src)).items, "delta", CreditConfig())


def test_failure_cost_is_required_and_config_checked(tmp_path):
    src = write(tmp_path / "in.jsonl", [GOOD])
    for extra in ([], ["--failure-cost", "100", "--cap", "0.5"], ["--failure-cost", "100", "--rho", "2"]):
        with pytest.raises(SystemExit) as exc:
            main(["credit", str(src), "--out", str(tmp_path / "o.jsonl"), *extra])
        assert exc.value.code == 2
    assert not (tmp_path / "o.jsonl").exists()


def test_console_script_exit_status(tmp_path):
    src = write(tmp_path / "in.jsonl", ['{"id": 1'])
    result = subprocess.run([sys.executable, "-m", "deltattg", "labels", str(src), "--out", str(tmp_path / "o.jsonl")],
                            capture_output=True, text=True)
    assert result.returncode == 2 and f"{src}:1: malformed JSON" in result.stderr
    assert not (tmp_path / "o.jsonl").exists()


def test_existing_output_survives_a_failed_run(tmp_path):
    src = write(tmp_path / "in.jsonl", [GOOD, dict(GOOD, step_tokens=[1])])
    out = tmp_path / "out.jsonl"
    out.write_text("previous results\n")
    assert main(["credit", str(src), "--failure-cost", "100", "--out", str(out)]) == 2
    assert out.read_text() == "previous results\n"


def test_methods_lists_every_estimator_with_what_it_reads(capsys):
    from deltattg.credit import available_estimators

    assert main(["methods"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.split()[0] for line in lines if not line.startswith(" ")]
    assert names == available_estimators()
    reads = {name: line.strip() for name, line in zip(names, (l for l in lines if l.startswith(" ")))}
    assert reads["grpo"] == "reads: outcome"
    assert reads["deltattg"].startswith("reads: outcome, meter readings of the decision states (can_complete), "
                                        "the failure cost C; options: rho=0.2, cap=5.0")
    assert "(score)" in reads["value"] and "failure cost" not in reads["value"]
    assert "(logit)" in reads["logit"] and "logit_clip=10.0" in reads["logit"]
    assert "rho=" not in reads["rho0"]
    assert reads["delta"] == ("reads: outcome, token hidden states (the actor's: deltattg train only); options: "
                              "delta_lambda_min=0.8, delta_lambda_max=1.2, delta_refine=1")


def test_a_closed_pipe_ends_quietly_with_141():
    """``deltattg methods | head -1``: the reader is gone before the command writes (its end of the pipe closed)."""
    process = subprocess.Popen([sys.executable, "-m", "deltattg", "methods"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    process.stdout.close()
    err = process.stderr.read()
    assert process.wait(timeout=120) == 141 and "Traceback" not in err


def test_verl_tasks_writes_one_row_per_task_and_nothing_on_a_bad_split(tmp_path, capsys):
    import pandas as pd

    out = tmp_path / "tasks.parquet"
    assert main(["verl-tasks", "--env", "household", "--short", "--limit", "4", "--out", str(out)]) == 0
    rows = pd.read_parquet(out)
    assert len(rows) == 4 and set(rows["agent_name"]) == {"deltattg_env"}
    specs = [json.loads(info["deltattg_task"]) for info in rows["extra_info"]]
    assert [s["task"]["split"] for s in specs] == ["train"] * 4 and len({s["task"]["id"] for s in specs}) == 4
    assert all(s["env"]["name"] == "household" for s in specs)
    bad = tmp_path / "bad.parquet"
    with pytest.raises(SystemExit) as exit_info:
        main(["verl-tasks", "--env", "household", "--split", "nope", "--out", str(bad)])
    assert exit_info.value.code == 2 and "unknown split 'nope'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [out]


def test_credit_and_inspect_take_every_record_estimators_option_from_its_registry_record(tmp_path, capsys):
    """The options of ``credit`` and ``inspect`` are built from the registry's ``Option`` records: each one's flag with
    its help, refused at parse time outside its domain; ``--logit-clip`` (a setting no hand-written list had) reaches
    the ``logit`` estimator: clipping at L = 1 equals reading logits already clipped to [−1, 1]."""
    from deltattg.cli.records import record_options

    for command in ("credit", "inspect"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        shown = " ".join(capsys.readouterr().out.split())
        for option in record_options():
            assert option.flag in shown and " ".join(option.help.split()) in shown, (command, option.name)
    src = write(tmp_path / "in.jsonl", [traj("a", "g", True, [3, 4, 5], [{"logit": 0.5}, {"logit": 3.0}, {"logit": -4.0}]),
                                         traj("b", "g", False, [2], [{"logit": -1.0}])])  # fmt: skip
    clipped = write(tmp_path / "clipped.jsonl", [traj("a", "g", True, [3, 4, 5], [{"logit": 0.5}, {"logit": 1.0},
                                                                                 {"logit": -1.0}]),
                                                 traj("b", "g", False, [2], [{"logit": -1.0}])])  # fmt: skip

    def weights(path, *extra):
        out = tmp_path / f"{path.stem}{len(extra)}.jsonl"
        assert main(["credit", str(path), "--method", "logit", "--out", str(out), *extra]) == 0
        return json.loads(out.read_text().splitlines()[0])["step_weights"]

    assert weights(src, "--logit-clip", "1") == pytest.approx(weights(clipped, "--logit-clip", "1"))
    assert weights(src) != pytest.approx(weights(src, "--logit-clip", "1"))
    for flag, value in (("--logit-clip", "0"), ("--alpha", "101"), ("--ig-beta", "1.5"), ("--norm", "max")):
        with pytest.raises(SystemExit) as exit_info:
            main(["credit", str(src), "--method", "logit", "--out", str(tmp_path / "x.jsonl"), flag, value])
        assert exit_info.value.code == 2 and f"argument {flag}:" in capsys.readouterr().err


def test_json_reports_write_an_undefined_statistic_as_null(tmp_path):
    """``eval-meter --json`` / ``eval-steps --json`` / ``guide --json`` / ``inspect.json`` go through ``write_json``:
    a Spearman of fewer than three states (NaN) is ``null``, never the ``NaN`` that strict JSON readers refuse."""
    from deltattg.data.jsonl import loads_strict, write_json

    write_json(tmp_path / "r.json", {"spearman": float("nan"), "rows": [1.5, float("inf")], "n": 2})
    assert loads_strict((tmp_path / "r.json").read_text()) == {"spearman": None, "rows": [1.5, None], "n": 2}


def test_options_of_documented_settings_take_their_help_and_default_from_the_field():
    """Every option of ``train-meter``, ``collect`` and ``evaluate`` that sets a documented dataclass field
    (``deltattg.settings.setting``: the regression meter, its training, sampling, the run) shows that field's meaning
    and default, so the library's default and the command line's cannot drift apart."""
    import argparse
    from dataclasses import fields

    from deltattg.cli import build_parser
    from deltattg.meter.regression import RegressionConfig
    from deltattg.meter.train_regression import RegressionTrainConfig
    from deltattg.rollout.policies import SamplingConfig
    from deltattg.train.config import RunConfig

    settings = {"train-meter": (RegressionConfig, RegressionTrainConfig), "collect": (SamplingConfig,),
                "evaluate": (SamplingConfig, RunConfig)}
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    for command, configs in settings.items():
        documented = {f.name: f for config in configs for f in fields(config) if "help" in f.metadata}
        shown = {action.dest: action for action in commands[command]._actions if action.dest in documented}
        assert set(shown) == set(documented), (command, set(documented) - set(shown))
        for name, action in shown.items():
            assert action.help.startswith(documented[name].metadata["help"]), (command, name)
            assert action.default == documented[name].default, (command, name)
