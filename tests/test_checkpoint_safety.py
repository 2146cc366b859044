"""Checkpoints never run code, a run folder belongs to one run, a corrupt checkpoint is named (and skipped on request),
and a trained meter loads from any working directory.

Every ``.pt`` file deltattg loads is read weights-only: a pickle whose ``__reduce__`` would create a marker file is
refused with a clear error (exit 2 at the CLI) and the marker never appears. The training runs are tiny (the
``test_train`` actor, GRPO, no evaluation) and shared: one template run, copied by each test.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
from pathlib import Path

import pytest
import torch

from deltattg.cli import main
from deltattg.meter.loading import load_meter
from deltattg.meter.train_regression import (
    RegressionTrainConfig,
    checkpoint_folders,
    train_regression_meter,
    trajectory_examples,
)
from deltattg.data.pt_files import CheckpointError
from deltattg.train.checkpoint import checkpoints, rng_state, set_rng_state
from deltattg.train.trainer import train
from test_meter_cli import apb_record
from test_meter_regression import synthetic_set, tiny_meter
from test_train import ScriptedOutcomes, actor_dir, small_config, without_timing  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Payload:
    """Unpickling this creates ``marker``: what a hostile checkpoint file would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))


def plant(path: Path, marker: Path, style: str = "torch") -> None:
    """Replace ``path`` with a file whose unpickling runs the payload: a ``torch.save`` archive or a bare pickle."""
    content = {"step": Payload(marker), "state": {}, "param_groups": []}
    if style == "torch":
        torch.save(content, path)
    else:
        path.write_bytes(pickle.dumps(content))


@pytest.mark.parametrize("style", ["torch", "pickle"])
def test_the_payload_is_live(tmp_path, style):
    """Without weights-only loading the planted file does run code (so the refusals below mean something)."""
    marker = tmp_path / "ran"
    plant(tmp_path / "evil.pt", marker, style)
    if style == "torch":
        torch.load(tmp_path / "evil.pt", weights_only=False)
    else:
        pickle.loads((tmp_path / "evil.pt").read_bytes())
    assert marker.exists()


# ---- the actor trainer's run folder ------------------------------------------------------------------------------------
def config_for(out: Path, actor: Path, *extra: str):
    return small_config(out, actor, "grpo", None, "eval.every=0", "run.save_every=1", *extra)


@pytest.fixture(scope="module")
def template(tmp_path_factory, actor_dir) -> tuple[Path, list[dict]]:
    """A finished 2-step GRPO run with checkpoints step-1 and step-2, and its records."""
    out = tmp_path_factory.mktemp("template") / "run"
    records = train(config_for(out, actor_dir), make_env=ScriptedOutcomes())
    assert [p.name for p in checkpoints(out)] == ["step-1", "step-2"]
    return out, records


@pytest.fixture
def run(tmp_path, template) -> Path:
    out = tmp_path / "run"
    shutil.copytree(template[0], out)
    config = out / "config.yaml"  # the copy is its own run folder: run.out points at it
    config.write_text(config.read_text().replace(str(template[0]), str(out)))
    return out


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def cli(*args: str) -> int:
    """``deltattg ARGS``'s exit status (usage errors leave through ``SystemExit``)."""
    try:
        return main(list(args))
    except SystemExit as exc:
        return int(exc.code)


def train_cli(*args: str) -> int:
    return cli("train", *args)


@pytest.mark.parametrize("style", ["torch", "pickle"])
@pytest.mark.parametrize("name", ["trainer_state.pt", "optimizer.pt"])
def test_a_planted_pickle_in_a_checkpoint_is_refused_without_running(run, tmp_path, actor_dir, capsys, name, style):
    marker = tmp_path / "ran"
    plant(run / "checkpoints" / "step-2" / name, marker, style)
    before = snapshot(run)
    assert train_cli("--out", str(run), "--resume") == 2
    err = capsys.readouterr().err
    assert f"step-2/{name}" in err and "refused to load" in err and "Traceback" not in err
    assert not marker.exists()
    assert snapshot(run) == before  # refused before anything was written
    with pytest.raises(CheckpointError, match="refused to load"):  # the library says the same
        train(config_for(run, actor_dir), resume=run / "checkpoints" / "step-2")
    assert not marker.exists()


def test_rng_states_are_stored_weights_only_and_restore_exactly(tmp_path):
    random.seed(1)
    import numpy as np

    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1), np.random.standard_normal()  # cached Gaussians are part of the state
    torch.save(rng_state(), tmp_path / "rng.pt")
    expected = (random.random(), random.gauss(0, 1), np.random.random(), np.random.standard_normal(), torch.rand(2))
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    again = (random.random(), random.gauss(0, 1), np.random.random(), np.random.standard_normal(), torch.rand(2))
    assert expected[:4] == again[:4] and torch.equal(expected[4], again[4])


def test_a_fresh_run_refuses_a_folder_that_holds_a_run(run, actor_dir, capsys):
    before = snapshot(run)
    assert train_cli("--config", str(run / "config.yaml"), "--out", str(run)) == 2
    err = capsys.readouterr().err
    assert str(run) in err and "--resume" in err and "--overwrite" in err and "Traceback" not in err
    assert snapshot(run) == before  # nothing written: not even config.yaml
    with pytest.raises(CheckpointError, match="already holds a run"):
        train(config_for(run, actor_dir, "run.steps=1"), make_env=ScriptedOutcomes())
    assert snapshot(run) == before


def test_overwrite_clears_the_old_run_first(run, actor_dir):
    old = json.loads((run / "run.json").read_text())["run_id"]
    (run / "notes.txt").write_text("mine")  # not a run file: left alone
    records = train(config_for(run, actor_dir, "run.steps=1"), overwrite=True, make_env=ScriptedOutcomes())
    assert [r["step"] for r in records] == [1]
    assert [p.name for p in checkpoints(run)] == ["step-1"]  # the old run's step-2 is gone
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1]
    new = json.loads((run / "run.json").read_text())["run_id"]
    assert new != old and torch.load(run / "checkpoints" / "step-1" / "trainer_state.pt")["run_id"] == new
    assert (run / "notes.txt").read_text() == "mine"
    assert train_cli("--out", str(run), "--resume", "--overwrite") == 2  # contradictory


def test_resume_refuses_another_runs_checkpoint(run, tmp_path, template, actor_dir, capsys):
    other = json.loads((run / "run.json").read_text()) | {"run_id": "someone-else"}
    (run / "run.json").write_text(json.dumps(other))  # this folder's run is not the one that wrote the checkpoints
    before = snapshot(run)
    assert train_cli("--out", str(run), "--resume") == 2
    err = capsys.readouterr().err
    assert "belongs to run" in err and "step-2" in err and "Traceback" not in err
    assert snapshot(run) == before
    fresh = tmp_path / "fresh"  # a checkpoint of one run does not continue in another folder
    with pytest.raises(CheckpointError, match="no run identity"):
        train(config_for(fresh, actor_dir), resume=template[0] / "checkpoints" / "step-1")
    assert not fresh.exists()


# ---- corrupt checkpoints and stray folders -----------------------------------------------------------------------------
def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


CORRUPTIONS = {
    "optimizer.pt": truncate,
    "trainer_state.pt": lambda p: p.write_bytes(b"garbage" * 100),
    "actor/model.safetensors": truncate,
    "actor/config.json": lambda p: p.write_text("{not json"),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_a_corrupt_latest_checkpoint_is_named(run, capsys, name):
    CORRUPTIONS[name](run / "checkpoints" / "step-2" / name)
    before = snapshot(run)
    assert train_cli("--out", str(run), "--resume") == 2
    err = capsys.readouterr().err
    assert f"step-2/{name}" in err and "latest-valid" in err and "Traceback" not in err
    assert snapshot(run) == before
    CORRUPTIONS[name](run / "checkpoints" / "step-1" / name)  # nothing intact left: latest-valid says so
    assert train_cli("--out", str(run), "--resume", "latest-valid") == 2
    err = capsys.readouterr().err
    assert "no intact checkpoint" in err and f"step-1/{name}" in err and "Traceback" not in err


def test_latest_valid_falls_back_to_the_newest_intact_checkpoint(run, template, actor_dir, capsys):
    truncate(run / "checkpoints" / "step-2" / "optimizer.pt")
    (run / "checkpoints" / "notes").mkdir()  # stray folders: ignored, never parsed as a step
    (run / "checkpoints" / "step-2-backup").mkdir()
    train(config_for(run, actor_dir), resume="latest-valid", make_env=ScriptedOutcomes())
    assert "skipping the corrupt checkpoint" in capsys.readouterr().err
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [without_timing(r) for r in logged] == [without_timing(r) for r in template[1]]  # step 2 redone exactly
    assert [p.name for p in checkpoints(run)] == ["step-1", "step-2"]
    assert (run / "checkpoints" / "notes").is_dir()


def test_stray_folders_under_checkpoints_are_ignored(run):
    (run / "checkpoints" / "notes").mkdir()
    (run / "checkpoints" / "step-old").mkdir()
    (run / "checkpoints" / "step-9.txt").write_text("")
    assert [p.name for p in checkpoints(run)] == ["step-1", "step-2"]


# ---- the regression meter's files ----------------------------------------------------------------------------------------
def meter_data(meter):
    windows, examples = [], []
    for messages, tokens in synthetic_set(4, seed=4):
        w, e = trajectory_examples(meter, messages, True, tokens, len(windows))
        windows += w
        examples += e
    return windows, examples


def test_a_planted_pickle_in_the_meter_trainer_state_is_refused(tmp_path):
    out = tmp_path / "meter"
    config = RegressionTrainConfig(output_dir=str(out), freeze_backbone=False, epochs=1, batch_size=2, save_every=1,
                                   progress=False)  # fmt: skip
    meter = tiny_meter(seed=5)
    train_regression_meter(meter, *meter_data(meter), config)
    latest = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    marker = tmp_path / "ran"
    plant(latest / "trainer_state.pt", marker)
    meter = tiny_meter(seed=5)
    with pytest.raises(CheckpointError, match="refused to load") as info:
        train_regression_meter(meter, *meter_data(meter), config)
    assert str(latest / "trainer_state.pt") in str(info.value) and not marker.exists()
    (out / "checkpoint-notes").mkdir()  # a stray folder is ignored, never parsed as a step
    assert checkpoint_folders(out)[-1] == latest


def test_planted_pickles_in_a_saved_meter_never_run(tmp_path, capsys):
    meter = tiny_meter()
    data = meter_data(meter)
    out = tmp_path / "meter"
    config = RegressionTrainConfig(output_dir=str(out), head_epochs=1, progress=False)
    train_regression_meter(meter, *data, config)
    marker = tmp_path / "ran"
    plant(out / "features.pt", marker)  # a cache: not loadable as plain data, so recomputed
    train_regression_meter(tiny_meter(), *data, config)
    assert not marker.exists() and isinstance(torch.load(out / "features.pt")["windows"], dict)
    meter.backbone.save_pretrained(out / "backbone")  # the test's backbone has no spec to load from: store it
    meter.tokenizer.save_pretrained(out / "backbone")
    settings = json.loads((out / "meter_config.json").read_text())
    (out / "meter_config.json").write_text(json.dumps(settings | {"backbone": "backbone"}))
    load_meter(out)  # loads as it is
    plant(out / "head.pt", marker)
    with pytest.raises(CheckpointError, match="refused to load"):
        load_meter(out)
    src = tmp_path / "apb.jsonl"
    src.write_text(json.dumps(apb_record(0, True, 2)) + "\n")
    assert cli("score", str(src), "--meter", str(out), "--out", str(tmp_path / "s.jsonl"), "--no-progress") == 2
    assert "head.pt" in capsys.readouterr().err and not (tmp_path / "s.jsonl").exists()
    assert not marker.exists()


def test_a_meter_trained_with_a_relative_model_path_loads_from_anywhere(tmp_path, monkeypatch):
    work = tmp_path / "work"
    backbone = tiny_meter()
    backbone.backbone.save_pretrained(work / "models" / "tiny")
    backbone.tokenizer.save_pretrained(work / "models" / "tiny")
    (work / "data.jsonl").write_text("".join(json.dumps(apb_record(i, i % 2 == 0, 1 + i % 3)) + "\n" for i in range(4)))
    monkeypatch.chdir(work)
    assert main(["train-meter", "data.jsonl", "--out", "meters/m", "--model", "models/tiny", "--tokenizer",
                 "models/tiny", "--head-epochs", "1"]) == 0  # fmt: skip
    stored = json.loads((work / "meters" / "m" / "meter_config.json").read_text())["backbone"]
    assert Path(stored).is_absolute() or (work / "meters" / "m" / stored).is_dir(), stored
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    meter = load_meter(work / "meters" / "m")
    readings = meter.score_trajectories([apb_record(0, True, 2)["messages"]])
    assert len(readings[0]) == 3


# ---- one writer per run folder --------------------------------------------------------------------------------------
HOLD_LOCK = """
import sys
from pathlib import Path
from deltattg.train.checkpoint import run_lock
with run_lock(Path(sys.argv[1])):
    print("locked", flush=True)
    sys.stdin.read()
"""


def test_a_run_folder_another_process_writes_is_refused_until_that_process_ends(tmp_path, actor_dir):
    import subprocess
    import sys

    out = tmp_path / "shared"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = snapshot(out)
        with pytest.raises(CheckpointError, match=rf"in use by another run \(process {holder.pid}\)") as refused:
            train(config_for(out, actor_dir, "run.steps=1"), overwrite=True, make_env=ScriptedOutcomes())
        assert str(out) in str(refused.value)
        assert snapshot(out) == before  # not even the overwrite ran: nothing of the other run is cleared
    finally:
        holder.kill()  # SIGKILL: no clean-up of its own; the OS drops the lock
        holder.wait()
    records = train(config_for(out, actor_dir, "run.steps=1"), make_env=ScriptedOutcomes())
    assert [r["step"] for r in records] == [1]


def test_a_run_that_fails_before_writing_leaves_no_folder(tmp_path, actor_dir):
    out = tmp_path / "never"
    with pytest.raises(ValueError):
        train(small_config(out, actor_dir, "deltattg", tmp_path / "no-meter-here", "eval.every=0"),
              make_env=ScriptedOutcomes())  # fmt: skip
    assert not out.exists()


def test_interleaved_or_broken_metrics_are_named_by_file_and_line(run):
    from deltattg.errors import InputError
    from deltattg.train import read_metrics

    path = run / "metrics.jsonl"
    lines = path.read_text().splitlines()
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    path.write_text("\n".join([lines[0], lines[1], lines[1]]) + "\n")  # a second writer repeating step 2
    with pytest.raises(InputError, match=rf"{path}:3: step 2 after step 2: .* two processes wrote this file"):
        read_metrics(run)
    path.write_text(lines[0] + "\n{\"step\": 2,\n")
    with pytest.raises(InputError, match=rf"{path}:2: not a JSON record"):
        read_metrics(run)
    path.write_text(lines[0] + '\n{"loss": 1.0}\n')
    with pytest.raises(InputError, match=rf"{path}:2: not a metrics record"):
        read_metrics(run)
