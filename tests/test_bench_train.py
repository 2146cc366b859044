"""``bench/bench_train.py --report-only`` on runs written by hand: the table's numbers are the runs' own."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import bench_script

from deltattg.regime.seeds import shared_settings_hash

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench_train():
    return bench_script("bench_train")


def write_run(folder: Path, curve: list[float], step_seconds: list[float], code: str = "abc",
              test: float | None = None) -> None:
    """A run's metrics: evaluations at steps 0, 10, 20 (and the test split's at the last, where given) and one record
    per training step with its time; stamped as made by code revision ``code`` with its seed folder's shared
    settings (which name the seed folder, as the regime's do: its actor)."""
    folder.mkdir(parents=True)
    records = [{"step": 10 * k, "eval/greedy_success": value} for k, value in enumerate(curve)]
    if test is not None:
        records[-1]["test/greedy_success"] = test
    records += [{"step": k + 1, "time/step": seconds} for k, seconds in enumerate(step_seconds)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sorted(records, key=lambda r: r["step"])))
    settings = folder.parent / "train.yaml"
    if not settings.exists():
        settings.write_text(f"actor: {{model: {folder.parent / 'actor'}}}\nrun: {{seed: 0}}\n")
    stamp = {"code": code, "prepared_by": code, "arm": folder.name, "prepared_with": f"{folder.parent.name} settings",
             "shared_config_sha256": shared_settings_hash(folder.parent)}  # a preparation per seed
    (folder / "bench.json").write_text(json.dumps(stamp))


def test_report_only_tabulates_the_runs(tmp_path, bench_train, capsys):
    # Seed 0: GRPO 0.2 -> 0.4, GiGPO 0.2 -> 0.6; seed 1: GRPO 0.3 -> 0.5, GiGPO 0.3 -> 0.5.
    # GiGPO's final - GRPO's: +20 and 0 points -> mean +10.0, t interval 10 ± 12.706·14.142/√2 = [−117.1, +137.1],
    # exact permutation p = 4/4 (every flip of (20, 0) has |mean| = 10); median step time over both seeds 3.0 s.
    # On the test split: GRPO 0.40 / 0.50, GiGPO 0.50 / 0.80 -> differences +10 and +30 points: mean +20.0, SD 14.1.
    write_run(tmp_path / "seed-0" / "grpo", [0.2, 0.3, 0.4], [1.0, 1.0], test=0.4)
    write_run(tmp_path / "seed-1" / "grpo", [0.3, 0.4, 0.5], [1.0, 2.0], test=0.5)
    write_run(tmp_path / "seed-0" / "gigpo", [0.2, 0.5, 0.6], [2.0, 3.0], test=0.5)
    write_run(tmp_path / "seed-1" / "gigpo", [0.3, 0.4, 0.5], [4.0, 3.0], test=0.8)
    bench_train.main(["--arms", "gigpo", "--seeds", "0", "1", "--out", str(tmp_path), "--report-only",
                      "--summary", str(tmp_path / "summary.json")])
    table = (tmp_path / "bench_train.md").read_text()
    summary = [line.split(" | ") for line in table.splitlines() if line.startswith("| g")][:2]  # then per-seed rows
    rows = {cells[0].strip("| "): cells for cells in summary}
    assert rows["grpo"][2].startswith("45.0") and rows["gigpo"][2].startswith("55.0")  # final success, seed mean
    assert rows["gigpo"][4] == "+10.0 [−117.1, +137.1] p=1.000"  # the paired final difference to GRPO
    assert rows["gigpo"][7] == "0 / 2"  # collapses
    assert rows["grpo"][-1].strip(" |") == "1.00" and rows["gigpo"][-1].strip(" |") == "3.00"  # median s / step
    assert "abc: 4 runs" in table
    test_row = next(line for line in table.split("## Final success on the test split")[1].splitlines()
                    if line.startswith("| gigpo"))
    cells = [cell.strip() for cell in test_row.strip("|").split("|")]
    assert cells[1].startswith("65.0") and cells[2].startswith("+20.0") and cells[3] == "14.1"
    assert 0 < float(cells[4]) < 1
    assert (tmp_path / "bench_train.png").stat().st_size > 0
    assert "adding the grpo arm" in capsys.readouterr().err
    summary = json.loads((tmp_path / "summary.json").read_text())  # what the docs' tables are generated from
    assert summary["name"] == "bench_train" and summary["command"].endswith("--summary " + str(tmp_path / "summary.json"))
    assert summary["tables"]["arms"]["rows"][1][4] == "+10.0 [−117.1, +137.1] p=1.000"
    assert summary["tables"]["test"]["columns"][2] == "test − GRPO (points)"
    assert summary["machine"]["runs"][0]["seeds"] == [0, 1]  # where the runs ran, by their stamps
    assert ["gigpo", "1", "30.0", "50.0"] in [row[:4] for row in summary["tables"]["seeds"]["rows"]]
    assert [row[0] for row in summary["tables"]["training"]["rows"]] == ["grpo", "gigpo"]
    text = (tmp_path / "bench_train.json").read_text()  # strict JSON: no NaN or Infinity tokens (two seeds: some
    json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in bench_train.json"))  # bounds are ∞)


def test_the_accounting_counts_a_refreshed_meters_completions_as_consumed_during_rl(tmp_path, bench_train):
    """An arm whose meter is refreshed from the current actor's completions consumed their episodes and tokens during
    RL, beside its rollouts; GRPO consumed its rollouts alone."""
    import argparse

    from deltattg.regime.stages import Arm

    arms = [Arm.parse("grpo"), Arm.parse("deltattg_robust[meter.refresh_every=1,meter.refresh_labels=best-of-k]")]
    step = {"rollout/trajectories": 64, "cumulative_response_tokens": 1000}
    refresh = {"meter/refresh_completion_episodes": 100, "meter/refresh_completer_tokens": 500}
    records = {arms[0].name: [[step, step | {"cumulative_response_tokens": 2000}]],
               arms[1].name: [[step | refresh, step | refresh | {"cumulative_response_tokens": 2000}]]}  # fmt: skip
    rows = bench_train.accounting_rows(argparse.Namespace(out=tmp_path, seeds=[0]), arms, records)
    assert [row[3:5] for row in rows] == [["128", "2,000"], ["328", "3,000"]]


def test_a_one_seed_table_says_why_it_has_no_spread(tmp_path, bench_train):
    """One seed has no standard deviation and no power: the test table says "n/a (1 seed)", never "nan"."""
    write_run(tmp_path / "seed-0" / "grpo", [0.2, 0.3, 0.4], [1.0], test=0.4)
    write_run(tmp_path / "seed-0" / "gigpo", [0.2, 0.5, 0.6], [1.0], test=0.5)
    bench_train.main(["--arms", "gigpo", "--seeds", "0", "--out", str(tmp_path), "--report-only"])
    table = (tmp_path / "bench_train.md").read_text()
    row = next(line for line in table.split("## Final success on the test split")[1].splitlines()
               if line.startswith("| gigpo"))
    assert row.count("n/a (1 seed)") == 2 and "nan" not in table


def test_report_refuses_runs_of_different_revisions_unless_told(tmp_path, bench_train, capsys):
    write_run(tmp_path / "seed-0" / "grpo", [0.2, 0.3, 0.4], [1.0], code="old")
    write_run(tmp_path / "seed-0" / "deltattg-oracle", [0.2, 0.5, 0.6], [1.0], code="new")
    args = ["--arms", "grpo", "deltattg@oracle", "--seeds", "0", "--out", str(tmp_path), "--report-only"]
    with pytest.raises(SystemExit) as exit_info:
        bench_train.main(args)
    assert exit_info.value.code == 2 and "different code revisions" in capsys.readouterr().err
    bench_train.main([*args, "--allow-mixed"])
    table = (tmp_path / "bench_train.md").read_text()
    assert "**mixed** (--allow-mixed)" in table and "old: 1 runs" in table and "new: 1 runs" in table
    # A run of other shared settings (its seed's train.yaml changed after it ran) is refused too.
    (tmp_path / "seed-0" / "train.yaml").write_text("run: {seed: 1}\n")
    with pytest.raises(SystemExit):
        bench_train.main(args)
    assert "other shared settings" in capsys.readouterr().err


@pytest.mark.slow  # ~25 s: bench_train.py --quick in a subprocess
def test_a_generative_arm_trains_its_meter_on_the_pool_and_reads_it_in_rl(tmp_path):
    """``deltattg@generative`` in the quick regime with a tiny random LM as the generative model: the seed's meter is
    fine-tuned on a sample of its pool (turns left in its prompts, a temperature fitted on held-out pool states), and
    the arm's RL steps read it (readings of every queried state, the meter's time on the clock)."""
    from test_meter_generative import tiny_meter as tiny_generative

    model = tmp_path / "lm"
    tiny_generative().save_pretrained(model)
    out = tmp_path / "bench"
    command = [sys.executable, str(REPO / "bench" / "bench_train.py"), "--quick", "--arms", "grpo",
               "deltattg@generative", "--seeds", "0", "--out", str(out), "--set", f"generative_model={model}",
               "--set", "generative_trajectories=3"]  # as users run it: its workers are spawned processes
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads((out / "seed-0" / "meter-generative" / "meter_config.json").read_text())
    assert config["kind"] == "generative" and config["turn_limit"] == 6 and config["readout"] == "both"  # quick: 6 turns
    report = json.loads((out / "seed-0" / "meter-generative" / "train_report.json").read_text())
    assert report["stage"] == "sft" and report["calibration"]["states"] > 0
    trained_on = report["examples"]  # every decision state of the 3 sampled trajectories (one example each)
    assert 3 <= trained_on <= 3 * 6
    records = [json.loads(line) for line in (out / "seed-0" / "deltattg-generative" / "metrics.jsonl").open()]
    steps = [r for r in records if r.get("step", 0) > 0 and "time/meter" in r]
    assert len(steps) == 2 and all(r["time/meter"] > 0 and r["meter_share"] > 0 for r in steps)
    assert "deltattg@generative" in (out / "bench_train.md").read_text()


def config_options() -> dict:
    from deltattg.regime.config import QUICK

    return QUICK["env_options"]


@pytest.mark.slow  # ~20 s: bench_train.py --quick in a subprocess
def test_a_labelled_arm_learns_its_meter_from_completions_and_reports_the_test_split(tmp_path):
    """``deltattg@best-of-k`` in the quick regime: the seed's pool is labelled by completions (here a noisy expert,
    a cheap completer; the benchmark's arms complete with the base actor), the labels kept beside the seed's other
    stages, a meter trained on them (with the features ``--set`` asks for) that names its source; every run ends with a test-split evaluation that the
    report tabulates."""
    out = tmp_path / "bench"
    command = [sys.executable, str(REPO / "bench" / "bench_train.py"), "--quick", "--arms", "grpo",
               "deltattg@best-of-k", "--seeds", "0", "--out", str(out), "--set", "label_completer=expert:0.3",
               "--set", "meter_pooling=last+mean"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    seed = out / "seed-0"
    config = json.loads((seed / "meter-best-of-k" / "meter_config.json").read_text())
    assert config["pooling"] == "last+mean"  # the regime's meter_* fields reach the meter it trains
    assert config["labels"] == {"source": "best-of-k", "completer": "expert:0.3", "completions": 1, "seed": 0,
                                "environment": {"env": "household", "size": "short", "options": config_options(),
                                                "data": None},
                                "max_turns": 6, "tokenizer": "actor"}
    cost = json.loads((seed / "meter-best-of-k" / "labels_report.json").read_text())["cost"]
    assert cost["completion_episodes"] > 0 and cost["unreplayable"] == 0
    labels = [json.loads(line) for line in (seed / "labels-best-of-k.jsonl").open()]
    assert labels and all(r["source"] == "best-of-k" for r in labels)
    for arm in ("grpo", "deltattg-best-of-k"):
        records = [json.loads(line) for line in (seed / arm / "metrics.jsonl").open()]
        assert "test/greedy_success" in records[-1] and sum("test/greedy_success" in r for r in records) == 1
    assert "## Final success on the test split (test, 3 tasks)" in (out / "bench_train.md").read_text()
    costs = json.loads((seed / "costs.json").read_text())  # the accounting: what each arm consumed before RL
    pool = [json.loads(line) for line in (seed / "pool.jsonl").open()]
    assert costs["pool"]["episodes"] == len(pool)
    assert costs["labels"]["best-of-k"] == {"episodes": cost["completion_episodes"], "env_steps": cost["env_steps"],
                                            "completer_tokens": cost["completer_tokens"]}
    table = (out / "bench_train.md").read_text().split("## What each arm consumed")[1].split("## Per seed")[0]
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table.splitlines() if line.startswith("| ")}
    assert rows["grpo"][1:3] == ["0", "0"]
    assert rows["deltattg@best-of-k"][1] == f"{len(pool) + cost['completion_episodes']:,}"
    during = sum(r.get("rollout/trajectories", 0) for r in map(json.loads, (seed / "grpo" / "metrics.jsonl").open()))
    assert during > 0 and rows["grpo"][3] == f"{during:,}" and rows["deltattg@best-of-k"][5].strip(" |") == "1"


def test_runs_of_other_regime_settings_or_numerics_are_not_paired(tmp_path, bench_train, capsys):
    """Two seeds that ran different regime settings (the seed aside), torch versions or CPU capabilities, or one
    seed's arms on actors and meters prepared with different settings, are refused (their figures would be pooled as
    one comparison) unless --allow-mixed, which says so in the table. Each seed's own preparation (its settings
    include the seed) is not a difference."""
    for seed in (0, 1):
        for arm in ("grpo", "gigpo"):
            write_run(tmp_path / f"seed-{seed}" / arm, [0.2, 0.3, 0.4], [1.0])
    args = ["--arms", "gigpo", "--seeds", "0", "1", "--out", str(tmp_path), "--report-only"]
    bench_train.main(args)  # alike: reported
    capsys.readouterr()
    for key, value, what in (("regime_sha256", "lr-3e-4", "runs of different regime settings"),
                             ("cpu_capability", "AVX512", "runs of different CPU capabilities"),
                             ("prepared_with", "seed-0 settings", "prepared with different settings")):  # fmt: skip
        stamp_file = tmp_path / "seed-1" / "gigpo" / "bench.json"
        stamp = json.loads(stamp_file.read_text())
        stamp_file.write_text(json.dumps({**stamp, key: value}))
        with pytest.raises(SystemExit) as exit_info:
            bench_train.main(args)
        assert exit_info.value.code == 2 and what in capsys.readouterr().err
        bench_train.main([*args, "--allow-mixed"])
        mixed = [line for line in (tmp_path / "bench_train.md").read_text().split("; ") if "**mixed**" in line]
        assert len(mixed) == 1 and what in mixed[0]
        stamp_file.write_text(json.dumps(stamp))


def test_the_report_says_which_seeds_ran_on_which_machine(tmp_path, bench_train, capsys):
    """A report names the machines its runs' stamps name, with their seeds, wherever it is drawn (an archive gathers
    runs of several machines): in its text and in its summary, whose docs line says it. Runs of different CPU models
    are not paired unless told; a run stamped before stamps named the CPU model says so."""
    machines = {0: "AMD EPYC 7B13", 1: "AMD EPYC 7B13", 2: "Intel(R) Xeon(R) Processor", 3: None}
    for seed, cpu in machines.items():
        for arm in ("grpo", "gigpo"):
            write_run(tmp_path / f"seed-{seed}" / arm, [0.2, 0.3, 0.4], [1.0])
            stamp_file = tmp_path / f"seed-{seed}" / arm / "bench.json"
            stamp = {**json.loads(stamp_file.read_text()), "torch": "2.13.0+cpu", "cpu_capability": "AVX2"}
            stamp_file.write_text(json.dumps({**stamp, "cpu": cpu} if cpu else stamp))
    args = ["--arms", "gigpo", "--seeds", "0", "1", "2", "3", "--out", str(tmp_path), "--report-only",
            "--summary", str(tmp_path / "summary.json")]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        bench_train.main(args)
    assert exit_info.value.code == 2 and "runs of different CPU models" in capsys.readouterr().err
    bench_train.main([*args, "--allow-mixed"])
    where = ("seeds 0–1 on AMD EPYC 7B13 (torch 2.13.0+cpu, AVX2); seed 2 on Intel(R) Xeon(R) Processor (torch "
             "2.13.0+cpu, AVX2); seed 3 on a CPU whose model the runs did not stamp (torch 2.13.0+cpu, AVX2)")
    assert f"Machines: {where}." in (tmp_path / "bench_train.md").read_text()
    line = bench_script("summary").render(json.loads((tmp_path / "summary.json").read_text()), "arms")
    assert f"; {where}.</sub>" in line and "cores" not in line  # not the machine the report was drawn on


@pytest.mark.parametrize("setting, named", [("meter_pooling=mean", "meter_pooling must be one of last, last+mean"),
                                              ("meter_init=bert", "meter_init must be one of actor, scratch")])
def test_a_meter_setting_out_of_range_is_refused_before_anything_is_made(tmp_path, bench_train, capsys, setting,
                                                                        named):
    out = tmp_path / "bench"
    with pytest.raises(SystemExit) as exit_info:
        bench_train.main(["--quick", "--arms", "grpo", "--seeds", "0", "--out", str(out), "--set", setting])
    assert exit_info.value.code == 2 and named in capsys.readouterr().err
    assert not out.exists()


def test_a_second_benchmark_on_the_same_out_is_refused_before_it_writes(tmp_path, bench_train, capsys):
    from deltattg.rollout.output import held_folder

    out = tmp_path / "bench"
    with held_folder(out):
        with pytest.raises(SystemExit) as exit_info:
            bench_train.main(["--quick", "--arms", "grpo", "--seeds", "0", "--out", str(out)])
    assert exit_info.value.code == 2 and "another run" in capsys.readouterr().err
    assert not (out / "seed-0").exists()


def test_work_made_otherwise_is_refused_not_replaced(tmp_path, bench_train, capsys):
    """A rerun into the same --out with a setting that shapes the actor or meters changed (--set meter_epochs=...)
    is refused before anything is written, naming the difference, and the old work stays; --allow-mixed reuses it as
    it is. A finished run of other settings (--set optim.lr) is refused the same way, not replaced in place. A
    prepared actor's files are all readable alike (the weights are not 0600 while the rest are 0644)."""
    from deltattg.regime.seeds import StaleWork, prepare_seed, run_arm, stale_work

    folder = tmp_path / "seed-0"
    config = bench_train.regime_config(quick=True, seed=0, threads=1, budget=False)
    prepare_seed(config, folder, bench_train.Meters())
    first = json.loads((folder / "bench.json").read_text())
    modes = {p.name: p.stat().st_mode & 0o777 for p in (folder / "actor").iterdir()}
    assert len(set(modes.values())) == 1, modes
    (folder / "actor" / "marker").write_text("made before")
    prepare_seed(config, folder, bench_train.Meters())  # the same settings: kept
    assert (folder / "actor" / "marker").exists()
    changed = config.replace(meter_epochs=config.meter_epochs + 1)
    assert stale_work(changed, folder) and "preparation_sha256" in stale_work(changed, folder)[0]
    with pytest.raises(StaleWork, match="preparation_sha256"):
        prepare_seed(changed, folder, bench_train.Meters())
    assert (folder / "actor" / "marker").exists() and json.loads((folder / "bench.json").read_text()) == first
    prepare_seed(changed, folder, bench_train.Meters(), allow_mixed=True)  # reused as it is
    assert (folder / "actor" / "marker").exists()
    arm = bench_train.Arm.parse("grpo")
    run_arm(config, folder, arm)
    finished = (folder / "grpo" / "metrics.jsonl").read_text()
    faster = config.replace(**{"optim.lr": 3e-4})
    assert any("a finished run of other settings" in line for line in stale_work(faster, folder, [arm]))
    with pytest.raises(StaleWork, match="regime_sha256"):
        run_arm(faster, folder, arm)
    assert (folder / "grpo" / "metrics.jsonl").read_text() == finished
    # the command line refuses before preparing anything
    with pytest.raises(SystemExit) as exit_info:
        bench_train.main(["--quick", "--arms", "grpo", "--seeds", "0", "--out", str(tmp_path), "--set",
                          "optim.lr=3e-4"])
    assert exit_info.value.code == 2 and "a finished run of other settings" in capsys.readouterr().err
    assert (folder / "grpo" / "metrics.jsonl").read_text() == finished


def test_report_only_names_what_is_missing(tmp_path, bench_train, capsys):
    """--report-only on an --out that does not exist, a seed that never ran or an arm that never ran: exit 2 naming
    it, no traceback, nothing created."""
    with pytest.raises(SystemExit) as exit_info:
        bench_train.main(["--arms", "grpo", "--seeds", "0", "--out", str(tmp_path / "nowhere"), "--report-only"])
    assert exit_info.value.code == 2 and "no such folder" in capsys.readouterr().err
    assert not (tmp_path / "nowhere").exists()
    write_run(tmp_path / "seed-0" / "grpo", [0.2, 0.3, 0.4], [1.0])
    for seeds, arms, what in ((["0", "1"], ["grpo"], "seed 1 never ran here"),
                              (["0"], ["grpo", "gigpo"], "arm gigpo never ran for seed 0")):
        with pytest.raises(SystemExit) as exit_info:
            bench_train.main(["--arms", *arms, "--seeds", *seeds, "--out", str(tmp_path), "--report-only"])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and what in err and "Traceback" not in err


def test_the_regime_sets_every_trainer_setting_its_runs_read():
    """Every trainer setting the regime's runs read comes from RegimeConfig (or the trainer's dataclass defaults),
    none from a preset: resolving a seed's train.yaml under the trainer preset it used to sit on gives the same
    configuration, and a nested setting (optim.lr, loss.kl_coef) reaches the run."""
    import tempfile

    import yaml as pyyaml

    from deltattg.regime.config import RegimeConfig
    from deltattg.regime.stages import trainer_settings
    from deltattg.train import resolve

    config = RegimeConfig().replace(**{"optim.lr": 2e-4, "loss.kl_coef": 0.01})
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "train.yaml"
        path.write_text(pyyaml.safe_dump(trainer_settings(config, "/actor", "window"), sort_keys=False))
        ours = resolve(None, path, ["algo.method=grpo", "run.out=/run"])
        preset = resolve("household-tiny", path, ["algo.method=grpo", "run.out=/run"])
    assert dataclasses.replace(preset, preset=None) == ours
    assert ours.optim.lr == 2e-4 and ours.loss.kl_coef == 0.01 and ours.optim.recompute_old_logprobs is False
    assert (ours.loss, ours.optim, ours.credit) == (config.loss, config.optim, config.credit)


def test_an_archive_redraws_the_same_tables_and_gathers_seeds_from_several_outs(tmp_path, bench_train, capsys):
    """``--archive`` keeps what the report reads (train.yaml, stamps, the report's metrics) of runs under two
    ``--out`` folders in one folder; ``--report-only`` on it gives the tables the runs give. A run archived from
    another run, or an unfinished one, is refused and the archive is left as it was."""
    first, second, archive = tmp_path / "a", tmp_path / "b", tmp_path / "archive"
    runs = ((first, 0, [0.2, 0.3, 0.4], [0.2, 0.5, 0.6]), (second, 1, [0.3, 0.4, 0.5], [0.3, 0.4, 0.5]))
    for out, seed, grpo, gigpo in runs:
        write_run(out / f"seed-{seed}" / "grpo", grpo, [1.0, 2.0], test=0.4 + seed / 10)
        write_run(out / f"seed-{seed}" / "gigpo", gigpo, [2.0, 3.0], test=0.5 + seed / 10)
        for name in ("grpo", "gigpo"):  # a reading neither the report nor a collapse's diagnosis takes is not archived
            metrics = out / f"seed-{seed}" / name / "metrics.jsonl"
            metrics.write_text(metrics.read_text().replace('"time/step"', '"loss": 1.0, "approx_kl": 0.18, "time/step"'))
        bench_train.main(["--arms", "gigpo", "--seeds", str(seed), "--steps", "20", "--out", str(out),
                          "--report-only", "--archive", str(archive)])
    assert "archived 5 files" in capsys.readouterr().err
    actor = (archive / "seed-0").resolve() / "actor"  # the archived folder's path, not the run's
    assert (archive / "seed-0" / "train.yaml").read_text() == f"actor: {{model: {actor}}}\nrun: {{seed: 0}}\n"
    archived = (archive / "seed-0" / "grpo" / "metrics.jsonl").read_text()
    assert "loss" not in archived and archived.count('"approx_kl": 0.18') == 2  # kept on both training steps
    args = ["--arms", "gigpo", "--seeds", "0", "1", "--steps", "20", "--report-only", "--summary"]
    bench_train.main([*args, str(tmp_path / "from-archive.json"), "--out", str(archive)])
    for seed, out in ((0, first), (1, second)):  # the same runs gathered by hand, with everything they logged
        shutil.copytree(out / f"seed-{seed}", tmp_path / "gathered" / f"seed-{seed}")
    bench_train.main([*args, str(tmp_path / "from-runs.json"), "--out", str(tmp_path / "gathered")])
    tables = [json.loads((tmp_path / f"{name}.json").read_text())["tables"] for name in ("from-archive", "from-runs")]
    assert tables[0] == tables[1] and tables[0]["test"]["rows"][1][2].startswith("+10.0")
    assert "mixed" not in (archive / "bench_train.md").read_text()  # the archived settings hash as the runs' stamps
    before = {p: p.read_bytes() for p in archive.rglob("*") if p.is_file()}
    for name in ("grpo", "gigpo"):  # seed 1 run again by another revision
        stamp = second / "seed-1" / name / "bench.json"
        stamp.write_text(json.dumps({**json.loads(stamp.read_text()), "code": "def", "prepared_by": "def"}))
    unfinished = first / "seed-2" / "grpo"
    write_run(unfinished, [0.2, 0.3], [1.0])
    write_run(first / "seed-2" / "gigpo", [0.2, 0.3], [1.0])
    for out, seed, why in ((second, 1, "archived from another run"), (first, 2, "not a finished, stamped run")):
        with pytest.raises(SystemExit) as exit_info:
            bench_train.main(["--arms", "gigpo", "--seeds", str(seed), "--steps", "20", "--out", str(out),
                              "--report-only", "--archive", str(archive)])
        assert exit_info.value.code == 2 and why in capsys.readouterr().err
    assert {p: p.read_bytes() for p in archive.rglob("*") if p.is_file()} == before


def test_the_current_policys_states_come_from_the_recommended_arm_before_grpo(bench_train, tmp_path):
    """``--meter-fit`` adds GRPO first; the current-policy states are still those of the arm whose meter is judged:
    the recommended arm's latest checkpoint, else an arm that reads a meter, GRPO's only when nothing else ran."""
    from deltattg.regime.config import RECOMMENDED_ARM
    from deltattg.regime.stages import Arm

    grpo, oracle, recommended = (Arm.parse(spec) for spec in ("grpo", "deltattg@oracle", RECOMMENDED_ARM))
    arms = [grpo, oracle, recommended]
    assert bench_train.current_policy(tmp_path, arms) is None
    for arm, step in ((grpo, 80), (oracle, 40)):
        (tmp_path / arm.folder / "checkpoints" / f"step-{step}").mkdir(parents=True)
    assert bench_train.current_policy(tmp_path, arms) == tmp_path / oracle.folder / "checkpoints/step-40/actor"
    for step in (10, 20):
        (tmp_path / recommended.folder / "checkpoints" / f"step-{step}").mkdir(parents=True)
    assert bench_train.current_policy(tmp_path, arms) == tmp_path / recommended.folder / "checkpoints/step-20/actor"
    assert bench_train.current_policy(tmp_path, [grpo]) == tmp_path / grpo.folder / "checkpoints/step-80/actor"


@pytest.mark.slow
def test_meter_fit_reports_what_credit_reads_for_the_recommended_meter_by_default(tmp_path):
    """``--meter-fit`` without ``--arms`` fits the recommended arm's meter and reads every row — its meter, its
    labels, the belief reference, the planner — on one set of states per table, held-out and training, with Δ and
    sibling ranking; ``--summary`` lists the numbers as records. Once an arm has run, the states its actor visits are
    read too."""
    from deltattg.regime.config import RECOMMENDED_ARM

    out, summary = tmp_path / "bench", tmp_path / "fit.json"
    command = [sys.executable, str(REPO / "bench" / "bench_train.py"), "--quick", "--meter-fit", "--seeds", "0",
               "--out", str(out), "--summary", str(summary)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.loads(summary.read_text())["meters"]
    assert {r["state_set"] for r in records} == {"held-out", "training"}
    for state_set in ("held-out", "training"):
        rows = {r["meter"]: r for r in records if r["state_set"] == state_set}
        recommended = [r for r in rows.values() if r["recommended"]]
        assert len(recommended) == 1 and recommended[0]["label_source"] == RECOMMENDED_ARM.split("@")[1]
        assert {"labels: best-of-k", "belief", "oracle"} <= set(rows)
        assert len({r["states"] for r in rows.values()}) == 1 and rows["oracle"]["states"] > 50  # one set of states
        oracle = rows["oracle"]
        assert oracle["delta_spearman"] == 1.0 and oracle["delta_sign_agreement"] == 1.0
        assert oracle["sibling_ranking"] == 1.0 and oracle["sibling_pairs"] > 10
        assert rows["belief"]["b_balanced_accuracy"] >= 0.9 and rows["belief"]["delta_spearman"] >= 0.85
        for key in ("delta_spearman", "delta_sign_agreement", "sibling_ranking", "b_balanced_accuracy"):
            assert key in recommended[0]
    assert "### On the meters' own training states" in done.stdout
    assert "current policy" not in {r["state_set"] for r in records}  # nothing has run yet

    trained = subprocess.run(command[:2] + ["--quick", "--arms", "grpo", "--seeds", "0", "--out", str(out)],
                             capture_output=True, text=True, timeout=900)  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["meter"]: r for r in json.loads(summary.read_text())["meters"] if r["state_set"] == "current policy"}
    assert "labels: best-of-k" not in rows and {"belief", "oracle"} <= set(rows)  # no labels on those states
    assert rows["oracle"]["states"] > 20 and rows["oracle"]["delta_spearman"] == 1.0
    assert "grpo/checkpoints/step-" in done.stderr


def test_a_prepared_seed_runs_its_arms_while_the_next_seed_prepares(bench_train, capsys):
    """Two processes, seed 0 prepared at once and seed 1's preparation slow: seed 0's runs take the free process
    instead of waiting for seed 1's preparation (seed 1's preparation ends only once seed 0's last run has ended; a
    scheduler that waits for both preparations would never get there and time out); every line is printed once."""
    import concurrent.futures
    import threading

    arms = [bench_train.Arm.parse(name) for name in ("grpo", "deltattg@oracle")]
    seed_0_done, ran = threading.Event(), []

    def prepare(seed: int) -> str:
        if seed == 1 and not seed_0_done.wait(timeout=10):
            raise TimeoutError("seed 0's runs waited for seed 1's preparation")
        return f"prepared {seed}"

    def run(seed: int, arm) -> str:
        ran.append((seed, arm.name))
        if [s for s, _ in ran].count(0) == len(arms):
            seed_0_done.set()
        return f"ran {seed} {arm.name}"

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        bench_train.run_seeds(pool, 2, [0, 1], arms, prepare, run)
    assert ran[:2] == [(0, "grpo"), (0, "deltattg@oracle")] and sorted(ran[2:]) == [(1, "deltattg@oracle"), (1, "grpo")]
    lines = capsys.readouterr().out.splitlines()
    assert sorted(lines) == sorted(["prepared 0", "prepared 1", "ran 0 grpo", "ran 0 deltattg@oracle", "ran 1 grpo",
                                    "ran 1 deltattg@oracle"])
