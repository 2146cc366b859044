"""``deltattg score`` and ``eval-steps`` with a real (tiny) regression meter saved to disk, and step-quality scoring
by hand."""

from __future__ import annotations

import json
import math

import pytest

from conftest import exit_status
from deltattg.cli import main
from deltattg.data.trajectory import MeterOutput
from deltattg.meter.step_quality import baseline_rows, labelled_steps, step_judgements, step_quality
from test_meter_regression import tiny_meter


def test_step_judgements_by_hand():
    # costs c = [100, 60, C=500, 0]: Δ = [40, -440, 500] -> beneficial, harmful, beneficial; an invalid reading voids
    # the two steps next to it; equal costs are a tie (0).
    readings = [MeterOutput(True, 100), MeterOutput(True, 60), MeterOutput(False), MeterOutput(True, 0)]
    assert step_judgements(readings, 500) == [1, -1, 1]
    assert step_judgements([MeterOutput(True, 5), None, MeterOutput(True, 5)], 500) == [None, None]
    assert step_judgements([MeterOutput(True, 5), MeterOutput(True, 5)], 500) == [0]


def test_expected_cost_readout_by_hand():
    # p = σ(0) = 0.5: c = 0.5·100 + 0.5·500 = 300; p = σ(ln 3) = 0.75: c = 0.75·40 + 0.25·500 = 155 -> Δ = 145 > 0.
    import math

    readings = [MeterOutput(False, 100.0, logit=0.0), MeterOutput(True, 40.0, logit=math.log(3))]
    assert step_judgements(readings, 500, "expected") == [1]
    assert step_judgements(readings, 500, "binary") == [1]  # C = 500 -> 40
    assert step_judgements([MeterOutput(True, 5.0), MeterOutput(True, 1.0)], 500, "expected") == [None]  # no logit


def test_step_quality_by_hand():
    # labels +1,+1,+1,-1,-1 (and a neutral 0 that is dropped); judgements +1,-1,0,-1,None.
    # Correct: step 0 (+1) and step 3 (-1) -> accuracy 2/5; recall(+1) = 1/3, recall(-1) = 1/2 -> balanced 5/12.
    pairs = [(1, 1), (1, -1), (1, 0), (-1, -1), (-1, None), (0, 1)]
    q = step_quality(pairs)
    assert (q.steps, q.beneficial, q.harmful, q.correct, q.ties, q.invalid) == (5, 3, 2, 2, 1, 1)
    assert q.accuracy == pytest.approx(2 / 5) and q.balanced_accuracy == pytest.approx(5 / 12)
    always = baseline_rows(pairs)["always-beneficial"]
    assert always.accuracy == pytest.approx(3 / 5) and always.balanced_accuracy == pytest.approx(0.5)


def test_labelled_steps_map_message_indices_to_steps():
    messages = [{"role": "user"}, {"role": "assistant"}, {"role": "tool"}, {"role": "assistant"}]
    assert labelled_steps(messages, {"1": 1, "3": -1}) == {0: 1, 1: -1}


def apb_record(index: int, success: bool, actions: int) -> dict:
    messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": f"goal {actions}"}]
    for _ in range(actions):
        messages += [{"role": "assistant", "content": "go to the mug"}, {"role": "tool", "content": "next"}]
    labels = {str(2 + 2 * t): (1 if (t + index) % 3 else -1) for t in range(actions)}
    labels[str(2)] = 0
    return {"total_index": index, "query_index": index // 2, "data_source": "toy", "final_label": 1 if success else -1,
            "messages": messages, "step_labels": labels}


@pytest.fixture(scope="module")
def meter_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("meter") / "tiny"
    tiny_meter().save_pretrained(folder)
    return folder


def test_score_adds_one_reading_per_action(tmp_path, meter_dir):
    src = tmp_path / "apb.jsonl"
    src.write_text("".join(json.dumps(apb_record(i, i % 2 == 0, 1 + i % 3)) + "\n" for i in range(6)))
    out = tmp_path / "scored.jsonl"
    assert main(["score", str(src), "--meter", str(meter_dir), "--out", str(out), "--no-progress",
                 "--tokenizer", str(meter_dir / "backbone")]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [len(r["meter"]) for r in records] == [1 + i % 3 for i in range(6)]
    assert all(set(m) == {"can_complete", "tokens_to_go", "logit", "probability"} for r in records for m in r["meter"])
    # The scored file is exactly what `credit` consumes.
    credit = tmp_path / "credit.jsonl"
    assert main(["credit", str(out), "--failure-cost", "500", "--out", str(credit), "--tokenizer",
                 str(meter_dir / "backbone")]) == 0
    assert len(credit.read_text().splitlines()) == 6


def test_eval_steps_counts_and_json(tmp_path, meter_dir, capsys):
    records = [apb_record(i, i % 2 == 0, 2 + i % 3) for i in range(8)]
    src = tmp_path / "apb.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    split = tmp_path / "split.json"
    split.write_text(json.dumps({"train": [0, 1, 2, 3], "test": [4, 5, 6, 7]}))
    out = tmp_path / "eval.json"
    assert main(["eval-steps", "--meter", str(meter_dir), "--data", str(src), "--split", str(split), "--json", str(out),
                 "--no-progress", "--readout", "binary", "expected"]) == 0
    results = json.loads(out.read_text())
    test_labels = [v for r in records[4:] for v in r["step_labels"].values() if v != 0]
    pooled = results["pooled"]
    assert pooled["meter (binary)"]["steps"] == pooled["meter (expected)"]["steps"] == len(test_labels)
    assert pooled["always-beneficial"]["accuracy"] == pytest.approx(sum(v > 0 for v in test_labels) / len(test_labels))
    assert 0.0 <= pooled["meter (expected)"]["balanced_accuracy"] <= 1.0
    assert pooled["meter (expected)"]["invalid"] == 0  # the regression meter gives a logit for every state
    assert "always-beneficial" in capsys.readouterr().out


def test_eval_steps_without_labels_is_an_input_error(tmp_path, meter_dir, capsys):
    src = tmp_path / "plain.jsonl"
    src.write_text(json.dumps({"id": 1, "group": "g", "reward": 1, "success": True,
                               "messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": "go"}]}) + "\n")
    assert main(["eval-steps", "--meter", str(meter_dir), "--data", str(src), "--no-progress"]) == 2
    assert "step_labels" in capsys.readouterr().err


def test_a_score_meter_feeds_the_value_ablation_and_only_it(tmp_path, meter_dir, capsys):
    """``train-meter --target score`` learns the final reward at every state; its readings carry ``score`` (and the
    logit), which ``--method value`` reads, and no (b̂, v̂), which ``deltattg`` refuses naming the field."""
    src = tmp_path / "apb.jsonl"
    src.write_text("".join(json.dumps(apb_record(i, i % 2 == 0, 1 + i % 3)) + "\n" for i in range(6)))
    folder = tmp_path / "score-meter"
    assert main(["train-meter", str(src), "--out", str(folder), "--model", str(meter_dir / "backbone"), "--target",
                 "score", "--head-epochs", "2", "--tokenizer", str(meter_dir / "backbone")]) == 0  # fmt: skip
    assert json.loads((folder / "meter_config.json").read_text())["target"] == "score"
    scored = tmp_path / "scored.jsonl"
    assert main(["score", str(src), "--meter", str(folder), "--out", str(scored), "--no-progress"]) == 0
    readings = [m for line in scored.read_text().splitlines() for m in json.loads(line)["meter"]]
    assert readings and all(set(m) == {"logit", "score"} for m in readings)
    credit = tmp_path / "credit.jsonl"
    common = ["--failure-cost", "500", "--tokenizer", str(meter_dir / "backbone"), "--out", str(credit)]
    assert main(["credit", str(scored), "--method", "value", *common]) == 0
    assert main(["credit", str(scored), "--method", "deltattg", *common[:-2], "--out", str(tmp_path / "x.jsonl")]) == 2
    assert f"{scored}:1: meter[0].can_complete:" in capsys.readouterr().err


def test_train_meter_no_progress_prints_no_bar(tmp_path, meter_dir, capfd):
    """``train-meter --no-progress``, as every other long command has: no feature or training bar on stderr (they
    are drawn without it)."""
    src = tmp_path / "apb.jsonl"
    src.write_text("".join(json.dumps(apb_record(i, i % 2 == 0, 1 + i % 3)) + "\n" for i in range(6)))
    common = ["--model", str(meter_dir / "backbone"), "--head-epochs", "2", "--tokenizer", str(meter_dir / "backbone")]
    assert main(["train-meter", str(src), "--out", str(tmp_path / "a"), *common]) == 0
    assert "head epochs" in capfd.readouterr().err  # drawn by default
    assert main(["train-meter", str(src), "--out", str(tmp_path / "b"), "--no-progress", *common]) == 0
    err = capfd.readouterr().err
    assert "head epochs" not in err and "it/s" not in err and "saved the meter" in err


def test_train_meter_delta_weight_reaches_the_loss_and_needs_the_backbone(tmp_path, meter_dir, capsys):
    """``--delta-weight`` trains the step change with the backbone (``--full``): the meter it gives differs from the
    one the same seed gives without it; without ``--full`` it is a usage error before any work, nothing at --out."""
    import torch

    src = tmp_path / "apb.jsonl"
    src.write_text("".join(json.dumps(apb_record(i, i % 2 == 0, 1 + i % 3)) + "\n" for i in range(6)))
    common = ["--model", str(meter_dir / "backbone"), "--tokenizer", str(meter_dir / "backbone"), "--full",
              "--epochs", "1", "--no-progress"]
    assert main(["train-meter", str(src), "--out", str(tmp_path / "plain"), *common]) == 0
    assert main(["train-meter", str(src), "--out", str(tmp_path / "delta"), "--delta-weight", "3", *common]) == 0
    plain, delta = (torch.load(tmp_path / name / "head.pt", weights_only=True) for name in ("plain", "delta"))
    assert any(not torch.equal(plain[k], delta[k]) for k in plain)
    capsys.readouterr()
    assert exit_status(["train-meter", str(src), "--out", str(tmp_path / "x"), *common[:4], "--delta-weight", "1"]) == 2
    err = capsys.readouterr().err
    assert "--delta-weight" in err and "needs --full" in err
    assert not (tmp_path / "x").exists()


def test_score_loss_by_hand():
    import torch

    from deltattg.meter.regression import score_loss

    # BCE(0 logit vs 1) = ln 2; smooth-L1 on scores |0.5 − 1| = 0.5 < 1 -> 0.5·0.5² = 0.125, |0 − 0| = 0 -> mean 0.0625.
    outputs = torch.tensor([[0.0, 0.5], [0.0, 0.0]])
    loss = score_loss(outputs, torch.tensor([True, False]), torch.tensor([1.0, 0.0]))
    assert loss.item() == pytest.approx(math.log(2) + 0.0625, rel=1e-6)


def test_train_meter_marks_the_turns_left_calibrates_and_the_trainer_checks_the_limit(tmp_path, capsys):
    from conftest import collect_household

    src = collect_household(tmp_path / "pool.jsonl", ["expert:0.5", "random"], 8, "--max-turns", "6")
    backbone = tmp_path / "tiny"
    tiny_meter().save_pretrained(backbone)
    common = ["--model", str(backbone / "backbone"), "--head-epochs", "1", "--tokenizer", str(backbone / "backbone")]
    meter = tmp_path / "meter"
    assert main(["train-meter", str(src), "--out", str(meter), "--calibration-fraction", "0.25", *common]) == 0
    err = capsys.readouterr().err
    assert "turns left of a 6-turn limit" in err and "completion temperature" in err and "held-out states" in err
    config = json.loads((meter / "meter_config.json").read_text())
    report = json.loads((meter / "train_report.json").read_text())
    assert config["turn_limit"] == 6 and config["temperature"] == report["calibration"]["temperature"] > 0
    assert (meter / "reliability.png").is_file() and report["calibration"]["bins_after"]
    assert main(["train-meter", str(src), "--out", str(tmp_path / "plain"), "--turn-limit", "none", *common]) == 0
    assert json.loads((tmp_path / "plain" / "meter_config.json").read_text())["turn_limit"] is None
    scored = tmp_path / "scored.jsonl"
    assert main(["score", str(src), "--meter", str(meter), "--out", str(scored), "--no-progress"]) == 0
    readings = [m for line in scored.read_text().splitlines() for m in json.loads(line)["meter"]]
    assert all(0 <= m["probability"] <= 1 for m in readings)
    # A meter trained for 6 turns cannot read 8-turn episodes: the trainer refuses before any rollout.
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["train", "--preset", "household-tiny", "--method", "deltattg_robust", "--meter", str(meter),
              "--set", "rollout.max_turns=8", "--set", "run.steps=1", "--out", str(tmp_path / "run")])
    assert exited.value.code == 2
    assert "trained on episodes of 6 turns" in capsys.readouterr().err and not (tmp_path / "run" / "metrics.jsonl").exists()
    with pytest.raises(SystemExit):  # argparse refuses a fraction that would hold out most of the tasks
        main(["train-meter", str(src), "--out", str(tmp_path / "x"), "--calibration-fraction", "0.9", *common])


# ---- train-meter, eval-meter and score on hostile input (issue 21) ----------------------------------------------

def apb_file(folder, count: int = 6):
    src = folder / "apb.jsonl"
    src.write_text("".join(json.dumps(apb_record(i, i % 2 == 0, 1 + i % 3)) + "\n" for i in range(count)))
    return src


def files_under(folder) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_train_meter_never_writes_into_its_model_or_tokenizer(tmp_path, meter_dir, capsys):
    """``--out`` naming the --model (or --tokenizer) folder, a folder inside it or one holding it is refused before any
    work, and the model is left byte for byte as it was."""
    import shutil

    model, tokenizer = tmp_path / "models" / "base", tmp_path / "tok"
    shutil.copytree(meter_dir / "backbone", model)
    shutil.copytree(meter_dir / "backbone", tokenizer)
    src = apb_file(tmp_path)
    before = files_under(tmp_path)
    for out, option in ((model, "--model"), (model / "meter", "--model"), (model.parent, "--model"),
                        (tokenizer, "--tokenizer")):  # fmt: skip
        assert exit_status(["train-meter", str(src), "--out", str(out), "--model", str(model), "--tokenizer",
                          str(tokenizer), "--head-epochs", "1"]) == 2  # fmt: skip
        err = capsys.readouterr().err
        assert f"the {option} folder" in err and "training" not in err, err
        assert files_under(tmp_path) == before
    assert exit_status(["train-meter", str(src), "--out", str(src), "--model", str(model)]) == 2  # --out is the data
    assert "also an input" in capsys.readouterr().err and files_under(tmp_path) == before


def test_an_interrupted_train_meter_leaves_no_meter_and_the_next_run_resumes(tmp_path, meter_dir, capsys,
                                                                           monkeypatch):
    """Ctrl-C while the head trains: exit 130, no --out at all (the features computed so far wait in the work folder
    next to it), and the same command then reuses them and publishes the whole meter; ``score`` names what a folder
    that is not a whole meter lacks."""
    from deltattg.meter import train_regression as training

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    src, out, work = apb_file(tmp_path), tmp_path / "meter", tmp_path / ".meter.partial"
    argv = ["train-meter", str(src), "--out", str(out), "--model", str(meter_dir / "backbone"), "--head-epochs", "1"]
    monkeypatch.setattr(training, "train_head_on_features", interrupted)
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert not out.exists() and (work / "features.pt").is_file() and f"kept in {work}" in err
    cached = (work / "features.pt").stat().st_mtime_ns
    monkeypatch.undo()
    assert main(argv) == 0
    assert not work.exists() and {p.name for p in out.iterdir()} == {"features.pt", "head.pt", "meter_config.json",
                                                                     "train_report.json"}  # fmt: skip
    assert (out / "features.pt").stat().st_mtime_ns == cached  # read again, not recomputed
    # Retraining into the meter's folder replaces its files, keeps the others and reads the features again.
    (out / "notes.txt").write_text("mine")
    head = (out / "head.pt").read_bytes()
    assert main([*argv, "--seed", "1"]) == 0
    assert (out / "notes.txt").read_text() == "mine" and (out / "head.pt").read_bytes() != head and not work.exists()
    assert (out / "features.pt").stat().st_mtime_ns == cached
    # Folders that are not a whole meter: what an interrupted run used to leave, and a meter without its head.
    half, headless = tmp_path / "half", tmp_path / "headless"
    half.mkdir()
    headless.mkdir()
    (half / "features.pt").write_bytes((out / "features.pt").read_bytes())
    (headless / "meter_config.json").write_text((out / "meter_config.json").read_text())
    capsys.readouterr()
    for folder, message in ((half, "not a meter: no meter_config.json (nor an HF model's config.json); it holds "
                                   "features.pt: a train-meter run that did not finish"),
                            (headless, "not a complete meter: no head.pt")):
        scored = tmp_path / "scored.jsonl"
        assert exit_status(["score", str(src), "--meter", str(folder), "--out", str(scored), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert f"{folder}: {message}" in err and not scored.exists(), err


def test_train_meter_refuses_an_unwritable_out_before_any_work(tmp_path, meter_dir, capsys):
    src = apb_file(tmp_path)
    for out in (src / "meter", "/proc/deltattg-meter"):  # under a file; somewhere nobody can create a folder
        assert main(["train-meter", str(src), "--out", str(out), "--model", str(meter_dir / "backbone")]) == 2
        err = capsys.readouterr().err
        assert f"{out}: cannot write" in err and "training" not in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["apb.jsonl"]


@pytest.mark.parametrize("kind", ["regression", "generative"])
def test_train_meter_refuses_an_out_folder_that_holds_something_else(kind, tmp_path, capsys):
    """A non-empty --out that is not a meter (a model folder, notes) used to get the meter's README.md and
    config.json written over its own; it is refused before anything is read or written."""
    src = apb_file(tmp_path)
    out = tmp_path / "notes"
    out.mkdir()
    (out / "README.md").write_text("mine")
    before = files_under(tmp_path)
    assert exit_status(["train-meter", str(src), "--kind", kind, "--model", "tiny", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out}: is a folder holding something other than a meter" in err and "Traceback" not in err
    assert files_under(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["apb.jsonl", "notes"]


def test_train_meter_checks_every_option_before_it_says_or_writes_anything(tmp_path, meter_dir, capsys):
    """Options of the other kind of meter, a prompt budget below the generative meter's instruction and a GRPO batch
    that is not a multiple of its group: exit 2, no "training" line, nothing written."""
    from test_meter_generative import tiny_meter as tiny_generative

    src = apb_file(tmp_path)
    generative = tmp_path / "generative"
    tiny_generative().save_pretrained(generative)
    backbone = str(meter_dir / "backbone")
    cases = [(["--model", backbone, "--stage", "sft"], "--stage trains a generative meter"),
             (["--model", backbone, "--lora"], "--lora trains a generative meter"),
             (["--kind", "generative", "--model", str(generative), "--ensemble", "2", "--head-epochs", "3"],
              "--ensemble, --head-epochs train a regression meter"),
             (["--kind", "generative", "--model", str(generative), "--max-length", "5"], "cannot hold even the meter"),
             (["--kind", "generative", "--model", str(generative), "--stage", "sft+grpo", "--batch-size", "3"],
              "must be divisible by num_generations")]  # fmt: skip
    before = files_under(tmp_path)
    for extra, message in cases:
        assert exit_status(["train-meter", str(src), "--out", str(tmp_path / "meter"), *extra]) == 2
        out, err = capsys.readouterr()
        assert message in err and "training" not in out + err, (extra, err)
        assert files_under(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["apb.jsonl",
                                                                                                 "generative"]


def test_a_generative_meter_is_published_whole(tmp_path, capsys):
    from test_meter_generative import tiny_meter as tiny_generative

    src = apb_file(tmp_path, 2)
    generative = tmp_path / "generative"
    tiny_generative().save_pretrained(generative)
    out = tmp_path / "meter"
    assert main(["train-meter", str(src), "--out", str(out), "--kind", "generative", "--model", str(generative),
                 "--stage", "sft", "--max-length", "256", "--batch-size", "4"]) == 0  # fmt: skip
    assert "training a generative meter on 2 trajectories" in capsys.readouterr().err
    assert {"meter_config.json", "config.json", "model.safetensors"} <= {p.name for p in out.iterdir()}
    assert not (tmp_path / ".meter.partial").exists()


def test_a_generative_meter_calibrates_its_completion_probability(tmp_path, capsys):
    """``--calibration-fraction`` on a generative meter: the temperature of p̃ = σ((log p(true) − log p(false)) / T)
    is fitted on held-out tasks and saved with the meter, the report holds the ECE and the reliability diagram's
    points, the diagram is drawn, and the saved meter reads p̃ with that temperature."""
    from conftest import collect_household
    from test_meter_generative import tiny_meter as tiny_generative

    src = collect_household(tmp_path / "pool.jsonl", ["expert:0.5", "random"], 4, "--max-turns", "4")
    generative = tmp_path / "generative"
    tiny_generative().save_pretrained(generative)
    out = tmp_path / "meter"
    assert main(["train-meter", str(src), "--out", str(out), "--kind", "generative", "--model", str(generative),
                 "--stage", "sft", "--max-length", "480", "--batch-size", "4", "--calibration-fraction", "0.25",
                 "--lr", "0.005"]) == 0  # fmt: skip
    assert "completion temperature" in capsys.readouterr().err
    config = json.loads((out / "meter_config.json").read_text())
    fit = json.loads((out / "train_report.json").read_text())["calibration"]
    assert config["readout"] == "both" and config["temperature"] == fit["temperature"] > 0
    assert fit["states"] > 0 and sum(b["states"] for b in fit["bins_after"]) == fit["states"]
    assert (out / "reliability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from deltattg.data.trajectory import state_prefixes
    from deltattg.meter.generative import GenerativeMeter

    messages = json.loads(src.read_text().splitlines()[0])["messages"]
    readings = GenerativeMeter.from_pretrained(str(out), readout="logit").score_trajectories([messages])[0]
    assert len(readings) == len(state_prefixes(messages, terminal=True))
    assert [r.probability for r in readings] == pytest.approx(
        [1 / (1 + math.exp(-r.logit / fit["temperature"])) for r in readings])


def test_eval_meter_and_score_refuse_input_without_states_and_an_unwritable_output_up_front(tmp_path, meter_dir,
                                                                                             capsys):
    empty = tmp_path / "no-actions.jsonl"
    empty.write_text(json.dumps({"id": "a", "group": "g", "reward": 0, "success": False, "step_tokens": [],
                                 "messages": [{"role": "user", "content": "go"}]}) + "\n")
    common = ["--meter", str(meter_dir), "--tokenizer", str(meter_dir / "backbone"), "--no-progress"]
    assert main(["eval-meter", str(empty), *common]) == 2
    out, err = capsys.readouterr()
    assert f"{empty}: no decision state to read" in err and "nan" not in out, err
    src = apb_file(tmp_path)
    for target in (src / "fit.json", "/proc/deltattg-fit/fit.json"):
        assert main(["eval-meter", str(src), *common, "--json", str(target)]) == 2
        out, err = capsys.readouterr()
        assert f"{target}: cannot write" in err and "completion accuracy" not in out, err
        # score too: refused before its meter is even looked for
        assert main(["score", str(src), "--meter", str(tmp_path / "no-meter"), "--out", str(target)]) == 2
        assert f"{target}: cannot write" in capsys.readouterr().err


def test_a_meter_reading_nan_everywhere_measures_nothing(tmp_path, capsys):
    """A head that outputs NaN reads every state as invalid: ``score`` writes nothing (exit 3) and ``eval-meter``
    prints no NaN percentages (exit 3), both saying why."""
    import torch

    meter = tiny_meter()
    with torch.no_grad():
        meter.head.net[-1].bias[0] = float("nan")
    folder = tmp_path / "nan-meter"
    meter.save_pretrained(folder)
    src = apb_file(tmp_path)
    common = ["--meter", str(folder), "--tokenizer", str(folder / "backbone"), "--no-progress"]
    assert main(["score", str(src), "--out", str(tmp_path / "scored.jsonl"), *common]) == 3
    assert "no valid reading" in capsys.readouterr().err and not (tmp_path / "scored.jsonl").exists()
    assert main(["eval-meter", str(src), "--json", str(tmp_path / "fit.json"), *common]) == 3
    out, err = capsys.readouterr()
    assert f"every state of {src} as null" in err and "nan" not in out and not (tmp_path / "fit.json").exists()
