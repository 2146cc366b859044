"""DeltaTTG vs GRPO on the built-in household environment over paired seeds, and the RL step time new ÷ old.

Per seed (the demo's stages with that seed): a tiny actor behaviour-cloned on noisy-expert episodes, a trajectory
pool and a regression meter (only when an arm reads the learned meter), then every arm from that same actor and seed
for ``--steps`` steps (same tasks in the same order, batch, group size, learning rate), evaluated greedily on
``--eval-tasks`` held-out tasks every ``--eval-every`` steps. Arms are ``deltattg.regime.stages.Arm`` specs:

    grpo                      outcome advantages only (Eq. 14)
    deltattg                  DeltaTTG with the learned regression meter (outcome labels, Eq. 1–2)
    deltattg_robust@best-of-k robust DeltaTTG with a meter learned from best-of-k labels (the recommended planner-free
                              arm; no planner anywhere)
    deltattg@generative       DeltaTTG with the paper's generative meter (SmolLM2 fine-tuned by SFT on a sample of
                              the pool: RegimeConfig.generative_*; it reads every state of a trajectory on one
                              shared prefix, and on a CPU it is the step's largest cost)
    deltattg@oracle           DeltaTTG with the household planner as the meter (what a perfect meter buys)
    deltattg@belief           DeltaTTG with the belief reference (the planner averaged over the worlds the history
                              allows: what a meter reading the history could buy at best)
    deltattg@oracle:0.5:0.1   the oracle with log-normal noise σ = 0.5 on v̂ and b̂ flipped with probability 0.1
    deltattg@oracle:0:0:FN:MF the oracle with a learned meter's b̂ errors: false b̂ = 0 on successes, missed b̂ = 0
                              on failures, with these probabilities
    deltattg_robust@ensemble:3  the pessimistic ensemble of 3 learned meters (other model seeds, same pool)
    deltattg_robust[smooth=1] credit settings (CreditConfig fields) of an arm
    pos@oracle, rho0, ...     the E.4 ablations, with either meter

Outputs under ``--out``: ``seed-N/`` (actor, pool, meter, one folder per arm with its ``metrics.jsonl``) and
``bench_train.md`` / ``.json`` / ``.png``: per arm and seed the final greedy success, the area under the success curve
and the step at which it reaches GRPO's final mean success; over seeds the mean with a 95 % Student t interval, the
paired per-seed difference to GRPO with its t interval and exact paired permutation p-value, the steps-to-reach ratio
(percentile bootstrap) and the number of seeds that collapsed (held-out success ≤ 5 % at an evaluation after the
start). Nothing is asserted: read the intervals; one whose interval includes 0 is "no difference".

Seeds are prepared and run by ``deltattg.regime.seeds`` (what ``deltattg demo`` runs too). Every seed and every run is
stamped (``bench.json`` in its folder) with the code revision it ran (the git commit, ``+dirty.DIFF`` for uncommitted
changes), the settings that shaped it and the machine's numerics. Work made as it would be made now is reused; work
made otherwise (another revision, a changed ``--set``, a forgotten ``--quick``) is never replaced: the command
refuses before it makes anything, naming the difference, unless ``--allow-mixed`` (which reuses it as it is) — use
another ``--out`` to make it anew. The report refuses to pair runs of different revisions or settings unless
``--allow-mixed`` too, and then its table says which arms ran which revision.
``--report-only`` redraws from the runs. ``--archive DIR`` also copies what the report reads of each run (seed
settings, stamps, metrics; no checkpoints) to ``DIR``, where seeds run under several ``--out`` folders gather and
``--report-only --out DIR`` redraws the tables: the household table's runs are kept that way in ``bench/results``.

``--speed N`` instead times N training steps of GRPO from one seed's actor with the old step (θ_old recomputed by a
forward pass, every row reading its own prompt: ``optim.recompute_old_logprobs=true run.share_prompts=false``) and
the new one, interleaved (old, new, new, old) in one process, and prints the median step times and their ratio;
``--overhead N`` times every arm the same way and prints each one's step time ÷ the first arm's (GRPO).

    .venv/bin/python bench/bench_train.py --seeds 0 1 2 3 4 --jobs 2                  # docs/benchmarks.md#the-household-rl-regime
    .venv/bin/python bench/bench_train.py --arms grpo --set optim.lr=3e-4 --out runs/lr3e-4  # one knob of the regime
    .venv/bin/python bench/bench_train.py --speed 8
    .venv/bin/python bench/bench_train.py --overhead 4 --arms grpo gigpo hgpo igpo a2tgpo delta crest deltattg
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import math
import shlex
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from deltattg.regime.comparison import (
    COLLAPSE_AT,
    CURVE_METRIC,
    Estimate,
    area_under_curve,
    first_step_reaching,
    seed_curves_png,
    success_curve,
    summarize,
)
from deltattg.regime.config import RECOMMENDED_ARM, RegimeConfig, regime_config
from deltattg.regime.seeds import (
    COSTS_FILE,
    SETTINGS_FILE,
    STAMP,
    Meters,
    finished,
    meter_folder,
    meters_read,
    prepare_seed,
    read_stamp,
    refuse_stale,
    ran_shared_settings,
    run_arm,
    settings_moved,
    stale_work,
)
from deltattg.regime.stages import (
    GENERATIVE_METER,
    Arm,
    label_settings,
    labelled_meter,
    policy_states,
    pool_labels,
    process_settings,
    train_meter,
)
from deltattg.data.jsonl import atomic_output
from deltattg.report import markdown_table, percent, spread, three_decimals
from deltattg.settings import setting_default, setting_help
from deltattg.summaries import finite, machine_text
from deltattg.train import read_metrics, resolve, train
from deltattg.train.side_passes import REFRESH_EPISODES, REFRESH_TOKENS

RUN_LENGTH = ("steps", "eval_every", "eval_tasks")  # RegimeConfig fields the command line sets directly
DEFAULT_ARMS = ("grpo", RECOMMENDED_ARM, "deltattg@oracle", "deltattg@belief")  # the paired comparison of the docs


# ---- running -------------------------------------------------------------------------------------------------------
def seed_config(args: argparse.Namespace, seed: int) -> RegimeConfig:
    config = regime_config(quick=args.quick, seed=seed, threads=1, budget=False)
    given = {name: getattr(args, name) for name in RUN_LENGTH}
    return config.replace(**{k: v for k, v in given.items() if v is not None}, **{k: v for k, v in args.set})


def prepare(args: argparse.Namespace, seed: int, meters: Meters) -> str:
    """One seed's base actor, pool, labels and meters (in its own process: one torch thread)."""
    start = time.perf_counter()
    with process_settings(1):
        prepare_seed(seed_config(args, seed), args.out / f"seed-{seed}", meters, allow_mixed=args.allow_mixed)
    return f"[bench] seed {seed} prepared: {time.perf_counter() - start:.0f} s"


def run_one(args: argparse.Namespace, seed: int, arm: Arm) -> str:
    """One arm of one seed (in its own process), unless its finished run is already there."""
    start = time.perf_counter()
    _, reused = run_arm(seed_config(args, seed), args.out / f"seed-{seed}", arm, allow_mixed=args.allow_mixed)
    return f"[bench] seed {seed} {arm.name}: " + ("already there" if reused else f"{time.perf_counter() - start:.0f} s")


def run_seeds(pool: concurrent.futures.Executor, jobs: int, seeds: Sequence[int], arms: Sequence[Arm],
              prepare_seed_: Callable[[int], str], run_arm_: Callable[[int, Arm], str]) -> None:
    """Every seed's preparation and its (seed, arm) runs on ``pool``, ``jobs`` at once, printing each one's line as it
    ends. A free process takes the next run of a prepared seed (the earliest seed first), else prepares the next seed:
    finished seeds accumulate in order (a long benchmark stopped part way keeps every seed it finished), and no
    process waits for another seed's preparation (a seed already prepared starts its runs at once)."""
    unprepared, runnable = list(seeds), []
    running: dict[concurrent.futures.Future, int | None] = {}  # a preparation's future -> its seed; a run's -> None
    while unprepared or runnable or running:
        while len(running) < jobs and (runnable or unprepared):
            if runnable:
                running[pool.submit(run_arm_, *runnable.pop(0))] = None
            else:
                seed = unprepared.pop(0)
                running[pool.submit(prepare_seed_, seed)] = seed
        done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
        for future in done:
            seed = running.pop(future)
            print(future.result(), flush=True)
            if seed is not None:
                runnable += [(seed, arm) for arm in arms]
        runnable.sort(key=lambda unit: seeds.index(unit[0]))  # the earliest seed's runs first


def run_all(args: argparse.Namespace, arms: Sequence[Arm]) -> None:
    """The seeds' preparations and (seed, arm) runs, ``--jobs`` processes at once (:func:`run_seeds`); refused before
    anything is made where a seed's preparation or a finished run was made otherwise (unless ``--allow-mixed``)."""
    import functools
    import multiprocessing

    if not args.allow_mixed:
        refuse_stale([line for seed in args.seeds
                      for line in stale_work(seed_config(args, seed), args.out / f"seed-{seed}", arms)])
    meters = meters_read(arms)
    jobs = max(args.jobs, 1)
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        run_seeds(pool, jobs, args.seeds, arms, functools.partial(prepare, args, meters=meters),
                  functools.partial(run_one, args))


# ---- reporting -----------------------------------------------------------------------------------------------------
def load_curves(args: argparse.Namespace, arms: Sequence[Arm]) -> tuple[list[int], dict[str, np.ndarray], dict]:
    """Eval steps, ``[seeds, evals]`` greedy success per arm, and every run's records."""
    records = {a.name: [read_metrics(args.out / f"seed-{s}" / a.folder) for s in args.seeds] for a in arms}
    curves, steps = {}, None
    for name, runs in records.items():
        pairs = [success_curve(r) for r in runs]
        steps = steps or pairs[0][0]
        if any(p[0] != steps for p in pairs):
            raise ValueError(f"arm {name}: the seeds' runs were evaluated at different steps")
        curves[name] = np.array([p[1] for p in pairs])
    return steps or [], curves, records


def settings_of_runs(args: argparse.Namespace, section: str, key: str) -> object:
    """A trainer setting as the seeds' ``train.yaml`` files (what their runs ran) hold it: the one value they share,
    or every value joined with "mixed" where they differ (the report says what ran, not what the command line asks)."""
    values = []
    for seed in args.seeds:
        settings = yaml.safe_load((args.out / f"seed-{seed}" / "train.yaml").read_text()) or {}
        values.append((settings.get(section) or {}).get(key))
    distinct = list(dict.fromkeys(map(str, values)))
    return values[0] if len(distinct) == 1 else "mixed: " + " / ".join(distinct)


def test_finals(records: dict[str, list[list[dict]]]) -> dict[str, np.ndarray]:
    """Per arm, ``[seeds]`` greedy success on the test split after the last step, for the arms whose every run has it
    (``eval.test_split``: a split no setting was chosen on)."""
    out = {}
    for name, runs in records.items():
        values = [next((r[TEST_METRIC] for r in reversed(run) if TEST_METRIC in r), None) for run in runs]
        if runs and all(v is not None for v in values):
            out[name] = np.array(values, dtype=float)
    return out


TEST_METRIC = "test/greedy_success"


def median_step_time(runs: Sequence[Sequence[dict]]) -> float:
    """Median seconds per training step over every step of every seed."""
    return statistics.median(r["time/step"] for records in runs for r in records if r.get("step", 0) > 0
                             and "time/step" in r)  # fmt: skip


TRAINING_READINGS = (  # (column, metric, which steps, format): what each arm's training did, mean over seeds
    ("entropy, last 10 steps", "entropy", "last", "{:.3f}"),
    ("A = 0 trajectories per step, last 10", "credit/zero_advantage", "last", "{:.1f}"),
    ("largest step share", "spread/largest_share", "all", "{:.3f}"),
    ("credit moved from GRPO's places %", "spread/moved", "all", "{:.1%}"),
    ("trust τ", "trust/tau", "all", "{:.2f}"),
)


ACCOUNTING_HEADER = ("arm", "episodes before RL (pool + label completions)", "completer tokens before RL",
                     "episodes during RL", "actor tokens during RL", "runs one meter serves")  # fmt: skip


def before_rl(costs: dict, arm: Arm) -> tuple[int, int]:
    """The environment episodes and completer tokens ``arm``'s meter consumed before RL, from a seed's ``costs.json``:
    a learned meter reads the pool and its labels' completions; GRPO and the planner-based meters read none."""
    if arm.meter not in ("learned", "generative"):
        return 0, 0
    labels = costs["labels"].get(arm.labels, {}) if arm.meter == "learned" else {}
    return costs["pool"]["episodes"] + labels.get("episodes", 0), labels.get("completer_tokens", 0)


def accounting_rows(args: argparse.Namespace, arms: Sequence[Arm], records: dict[str, list[list[dict]]]) -> list[list[str]]:
    """Per arm, the mean over seeds of what it consumed before RL (:func:`before_rl`; "-" where a seed's preparation
    predates ``costs.json``) and during RL (rollout episodes and the actor's response tokens, with the completions of
    a meter refreshed from the current actor's: ``meter.refresh_labels=best-of-k``), and how many of the compared
    arms read one seed's meter."""
    readers = Counter((arm.meter_folder, arm.members) for arm in arms)
    costs = [args.out / f"seed-{seed}" / COSTS_FILE for seed in args.seeds]
    recorded = [json.loads(path.read_text()) for path in costs] if all(path.is_file() for path in costs) else []

    def mean_of(values: Sequence[float]) -> str:
        return f"{statistics.mean(values):,.0f}" if values else "-"

    rows = []
    for arm in arms:
        spent = [before_rl(seed_costs, arm) for seed_costs in recorded]
        runs = records[arm.name]
        episodes = [sum(r.get("rollout/trajectories", 0) + r.get(REFRESH_EPISODES, 0) for r in run) for run in runs]
        tokens = [max((r.get("cumulative_response_tokens", 0) for r in run), default=0)
                  + sum(r.get(REFRESH_TOKENS, 0) for r in run) for run in runs]  # fmt: skip
        rows.append([arm.name, mean_of([e for e, _ in spent]), mean_of([t for _, t in spent]),
                     mean_of(episodes) if any(episodes) else "-", mean_of(tokens) if any(tokens) else "-",
                     "-" if arm.meter_folder is None else str(readers[arm.meter_folder, arm.members])])  # fmt: skip
    return rows


def training_readings(runs: Sequence[Sequence[dict]]) -> list[str]:
    """Each :data:`TRAINING_READINGS` column of one arm: the mean over its seeds of the per-run mean ("-" where the
    arm does not log it)."""
    cells = []
    for _, metric, which, form in TRAINING_READINGS:
        per_run = []
        for records in runs:
            values = [r[metric] for r in records if r.get("step", 0) > 0 and metric in r]
            values = values[-10:] if which == "last" else values
            if values:
                per_run.append(sum(values) / len(values))
        cells.append(form.format(sum(per_run) / len(per_run)).replace("%", "") if per_run else "-")
    return cells


PAIRED_ALIKE = {"regime_sha256": "regime settings", "torch": "torch versions", "cpu_capability": "CPU capabilities",
                "cpu": "CPU models"}
# A seed's preparation settings include the seed: alike across one seed's arms, not across seeds (the regime's hash,
# seed aside, already holds every other preparation setting).


def check_stamps(args: argparse.Namespace, arms: Sequence[Arm]) -> list[str]:
    """Which code revision each arm's runs ran, one line per revision; a ``ValueError`` naming the runs when runs of
    different revisions, shared settings, regime settings (the seed aside), torch versions or CPU capabilities would
    be paired, or a run's revision is unknown (not a git checkout) — unless ``--allow-mixed``."""
    by_code: dict[str, list[str]] = {}
    alike: dict[str, dict[str, list[str]]] = {key: {} for key in PAIRED_ALIKE}
    problems = []
    for seed in args.seeds:
        folder = args.out / f"seed-{seed}"
        preparations: dict[str, list[str]] = {}
        for arm in arms:
            stamp = read_stamp(folder / arm.folder) or {}
            preparations.setdefault(str(stamp.get("prepared_with")), []).append(arm.name)
            code, prepared = str(stamp.get("code")), str(stamp.get("prepared_by"))
            key = code if prepared == code else f"{code} (actor and meter by {prepared})"
            by_code.setdefault(key, []).append(f"seed {seed} {arm.name}")
            for name in PAIRED_ALIKE:
                alike[name].setdefault(str(stamp.get(name)), []).append(f"seed {seed} {arm.name}")
            if not ran_shared_settings(stamp, folder):
                problems.append(f"{folder / arm.folder}: ran other shared settings than {folder / 'train.yaml'}"
                                if stamp else f"{folder / arm.folder}: no {STAMP} (a run killed before its end, or one from before runs were stamped)")
            elif stamp.get("code") is None:
                problems.append(f"{folder / arm.folder}: its code revision is unknown (not run from a git checkout)")
        if len(preparations) > 1:
            problems.append(f"{folder}: its arms ran on actors and meters prepared with different settings: " + "; ".join(
                f"{value} ({', '.join(names)})" for value, names in preparations.items()))
    if len(by_code) > 1:
        problems.append("runs of different code revisions: " + "; ".join(
            f"{code} ({len(runs)} runs, e.g. {runs[0]})" for code, runs in by_code.items()))
    for name, groups in alike.items():
        if len(groups) > 1:
            problems.append(f"runs of different {PAIRED_ALIKE[name]}: " + "; ".join(
                f"{value} ({len(runs)} runs, e.g. {runs[0]})" for value, runs in groups.items()))
    if problems and not args.allow_mixed:
        raise ValueError("refusing to pair these runs (--allow-mixed pairs them anyway and says so):\n  "
                         + "\n  ".join(problems))
    return [f"{code}: {len(runs)} runs" for code, runs in by_code.items()] + (
        [f"**mixed** (--allow-mixed): {p}" for p in problems] if problems else [])


def runs_machines(args: argparse.Namespace, arms: Sequence[Arm]) -> list[dict]:
    """Where the runs under ``--out`` ran, by their stamps: one entry per CPU model, ATen capability and torch version,
    with its seeds (what a report drawn elsewhere, or from an archive gathered on several machines, says it measured;
    runs stamped before stamps named the CPU model say so)."""
    seeds: dict[tuple[str, str, str], list[int]] = {}
    for seed in args.seeds:
        for arm in arms:
            stamp = read_stamp(args.out / f"seed-{seed}" / arm.folder) or {}
            key = (stamp.get("cpu", "a CPU whose model the runs did not stamp"),
                   stamp.get("cpu_capability", "not stamped"), stamp.get("torch", "not stamped"))  # fmt: skip
            if seed not in seeds.setdefault(key, []):
                seeds[key].append(seed)
    return [{"cpu": cpu, "aten_capability": capability, "torch": torch, "seeds": group}
            for (cpu, capability, torch), group in seeds.items()]


ARMS_HEADER = ("arm", "start %", "final %", "area under curve %", "final − GRPO (points)", "area − GRPO (points)",
               "steps to GRPO's final ÷ steps", "collapses", "s / step")
TEST_HEADER = ("arm", "test final %", "test − GRPO (points)", "SD of the paired differences (points)",
               "power at +3 points")


def missing_runs(args: argparse.Namespace, arms: Sequence[Arm]) -> list[str]:
    """What a report of ``arms`` over ``--seeds`` would read and is not under ``--out``: the folder itself, a seed
    that was never prepared, a run that never started (one line each)."""
    if not args.out.is_dir():
        return [f"--out {args.out}: no such folder (nothing has run there)"]
    missing = []
    for seed in args.seeds:
        folder = args.out / f"seed-{seed}"
        if not (folder / SETTINGS_FILE).is_file():
            missing.append(f"{folder}: seed {seed} never ran here (no {SETTINGS_FILE})")
            continue
        missing += [f"{folder / arm.folder}: arm {arm.name} never ran for seed {seed}" for arm in arms
                    if not (folder / arm.folder / "metrics.jsonl").is_file()]  # fmt: skip
    return missing


def report(args: argparse.Namespace, arms: Sequence[Arm], command: str) -> tuple[str, dict]:
    missing = missing_runs(args, arms)
    if missing:
        raise ValueError("nothing to report from these runs, some are missing (run without --report-only to make "
                         "them):\n  " + "\n  ".join(missing))
    revisions = check_stamps(args, arms)
    steps, curves, records = load_curves(args, arms)
    grpo = curves.get("grpo")
    if grpo is None:
        raise ValueError("the comparison needs a grpo arm")
    tests = test_finals(records)
    summaries = [summarize(name, c, grpo, steps, tests.get(name), tests.get("grpo")) for name, c in curves.items()]
    target = grpo[:, -1].mean()
    seed_rows = []
    for name, c in curves.items():
        for k, seed in enumerate(args.seeds):
            reached = first_step_reaching(steps, c[k].tolist(), target)
            seed_rows.append([name, str(seed), f"{100 * c[k, 0]:.1f}", f"{100 * c[k, -1]:.1f}",
                              f"{100 * area_under_curve(steps, c[k].tolist()):.1f}", "-" if reached is None else str(reached)])  # fmt: skip
    times = {name: median_step_time(runs) for name, runs in records.items()}
    machines = runs_machines(args, arms)

    def difference(e: Estimate) -> str:
        return f"{e.text(100, signed=True)} p={e.p:.3f}" if e.p is not None else e.text(100, signed=True)

    rows = [[s.arm, s.start.text(100), s.final.text(100), s.auc.text(100),
             "-" if s.arm == "grpo" else difference(s.final_minus_grpo),
             "-" if s.arm == "grpo" else difference(s.auc_minus_grpo), s.reach.text(1, 2),
             f"{s.collapses} / {s.seeds}", f"{times[s.arm]:.2f}"] for s in summaries]  # fmt: skip
    tasks = settings_of_runs(args, "eval", "num_tasks")
    test_rows = [[s.arm, s.test.text(100), "-" if s.arm == "grpo" else difference(s.test_minus_grpo),
                  "-" if s.arm == "grpo" else spread(s.test_sd, s.seeds, f"{100 * s.test_sd:.1f}"),
                  "-" if s.arm == "grpo" else spread(s.test_power, s.seeds, f"{s.test_power:.2f}")]
                 for s in summaries if s.test is not None]  # fmt: skip
    test_split, test_tasks = settings_of_runs(args, "eval", "test_split"), settings_of_runs(args, "eval", "test_tasks")
    test_section = [
        f"## Final success on the test split ({test_split}, {test_tasks} tasks)",
        "Greedy success after the last step on tasks of a split no setting was chosen on (deduplicated against the "
        "training and validation tasks); the paired differences' standard deviation, and the power a two-sided "
        f"paired t test over {len(args.seeds)} seeds has to find a true +3-point difference at that spread.",
        markdown_table(TEST_HEADER, test_rows),
    ] if test_rows else []  # fmt: skip
    training_header = ("arm", *(name for name, _, _, _ in TRAINING_READINGS))
    accounting = accounting_rows(args, arms, records)
    training_rows = [[name, *training_readings(runs)] for name, runs in records.items()]
    seed_header = ("arm", "seed", "start %", "final %", "area %", f"first step ≥ {100 * target:.1f} %")
    text = "\n\n".join([
        "# bench_train: credit methods on the household environment over paired seeds",
        f"`{command}` — seeds {list(args.seeds)}, {steps[-1]} steps per run, greedy evaluation on {tasks} held-out "
        f"tasks every {steps[1] - steps[0] if len(steps) > 1 else 0} steps; the demo's settings otherwise (each seed "
        "folder's `train.yaml`). Means and paired differences: 95 % Student t intervals over seeds; p: exact paired "
        "permutation test (all sign flips) of the difference; steps ratio: 95 % paired percentile bootstrap. A "
        "difference whose interval includes 0 is no difference. Collapses: seeds whose held-out success fell to "
        f"≤ {100 * COLLAPSE_AT:.0f} % at an evaluation after the start.",
        "Code revisions: " + "; ".join(revisions) + ".",
        f"Machines: {machine_text({'runs': machines})}.",
        markdown_table(ARMS_HEADER, rows),
        f"GRPO's final mean success (the target): {100 * target:.1f} %. A steps ratio is ∞ where the arm's seed-mean "
        "curve never reaches it (in the point estimate or a resample).",
        "![success curves](bench_train.png)",
        *test_section,
        "## What the credit did in training",
        "Per arm, the mean over seeds of each run's mean: the actor's entropy and the trajectories with A = 0 per step "
        "(64 rollouts) over the last 10 steps; over every step, the largest step's share of a trajectory's credit, "
        "how much of its credit moved from GRPO's token shares (0 for GRPO) and the trust τ of deltattg_robust.",
        markdown_table(training_header, training_rows),
        "## What each arm consumed",
        "Per arm, the mean over seeds: the environment episodes and completer tokens its meter cost before RL (the "
        "pool every learned meter reads, and its labels' completions; the base actor's demonstrations are shared by "
        "every arm and not counted), the rollout episodes and actor response tokens of RL itself (with the completions "
        "of a meter refreshed from the current actor's), and how many of these arms read one seed's meter.",
        markdown_table(ACCOUNTING_HEADER, accounting),
        "## Per seed",
        markdown_table(seed_header, seed_rows),
    ])  # fmt: skip
    figures = {"seeds": list(args.seeds), "steps": steps, "target": target, "revisions": revisions,
               "arms": {s.arm: dataclasses.asdict(s) for s in summaries}, "step_time": times, "machines": machines,
               "curves": {name: c.tolist() for name, c in curves.items()},
               "test": {name: values.tolist() for name, values in tests.items()},
               "tables": {"arms": (ARMS_HEADER, rows), "test": (TEST_HEADER, test_rows),
                          "training": (training_header, training_rows), "accounting": (ACCOUNTING_HEADER, accounting),
                          "seeds": (seed_header, seed_rows)}}  # fmt: skip
    return text + "\n", figures


# ---- archive -------------------------------------------------------------------------------------------------------
UPDATE_READINGS = ("approx_kl", "grad_norm", "clipfrac", "stopped_early", "rollout/success")  # a collapse's readings
ACCOUNTED = ("rollout/trajectories", "cumulative_response_tokens", REFRESH_EPISODES, REFRESH_TOKENS)  # during RL


def archived_metrics() -> tuple[str, ...]:
    """The metrics the report reads of a run — its steps, evaluations, test split, step times and training readings —
    and the update readings a collapse is diagnosed from (how far each update moved the policy, the gradient's norm
    before clipping, whether the target-KL guard ended it early, the rollouts' success)."""
    return ("step", CURVE_METRIC, TEST_METRIC, "time/step", *(metric for _, metric, _, _ in TRAINING_READINGS),
            *UPDATE_READINGS, *ACCOUNTED)  # fmt: skip


def named_here(path: Path) -> str:
    """``path`` relative to the working directory where it lies under it (what a committed archive should say: no
    machine's folders), else absolute."""
    here, there = Path.cwd().resolve(), path.resolve()
    return str(there.relative_to(here)) if there.is_relative_to(here) else str(there)


def archive_runs(args: argparse.Namespace, arms: Sequence[Arm]) -> list[Path]:
    """Copy what the report reads of each (seed, arm) run under ``--out`` to ``--archive``: the seed's ``train.yaml``
    (the seed folder's path in it written as the archived folder's, so its settings hash as the runs' stamps say),
    each arm's stamp and its metrics reduced to :func:`archived_metrics` (no actors, pools or checkpoints: a few KB
    per run, small enough to commit beside the summary). ``--report-only --out ARCHIVE`` redraws the same tables, and
    seeds run under different ``--out`` folders (other days, other machines of the same kind) gather in one archive,
    where the report pairs them only if their stamps agree. A run already archived from another run (its stamp
    differs) is refused, naming both files; an unfinished run is refused before anything is written."""
    config_steps = {seed: seed_config(args, seed).steps for seed in args.seeds}
    units = [(seed, arm) for seed in args.seeds for arm in arms]
    for seed, arm in units:
        run = args.out / f"seed-{seed}" / arm.folder
        if not finished(run, config_steps[seed]) or read_stamp(run) is None:
            raise ValueError(f"{run}: not a finished, stamped run: nothing archived")
        kept = args.archive / f"seed-{seed}" / arm.folder / STAMP
        if kept.exists() and read_stamp(kept.parent) != read_stamp(run):
            raise ValueError(f"{kept}: archived from another run than {run / STAMP}: nothing archived")
    written, keys = [], archived_metrics()
    for seed in args.seeds:
        source, target = args.out / f"seed-{seed}", args.archive / f"seed-{seed}"
        files = {target / "train.yaml": settings_moved((source / "train.yaml").read_text(), source, named_here(target))}
        if (source / COSTS_FILE).is_file():
            files[target / COSTS_FILE] = (source / COSTS_FILE).read_text()
        for arm in arms:
            records = [{k: r[k] for k in keys if k in r} for r in read_metrics(source / arm.folder)]
            files[target / arm.folder / "metrics.jsonl"] = "".join(json.dumps(r) + "\n" for r in records)
            files[target / arm.folder / STAMP] = (source / arm.folder / STAMP).read_text()
        for path, text in files.items():
            with atomic_output(path) as handle:
                handle.write(text)
            written.append(path)
    return written


# ---- old vs new step time ------------------------------------------------------------------------------------------
OLD_STEP = ("optim.recompute_old_logprobs=true", "run.share_prompts=false")
NEW_STEP = ("optim.recompute_old_logprobs=false", "run.share_prompts=true")


def interleaved_step_times(args: argparse.Namespace, variants: dict[str, Sequence[str]], steps: int,
                           meters: Meters) -> dict:
    """Median training-step time per training row of each variant (trainer overrides), N steps each from one seed's
    actor, run in rounds that alternate the order (a b c, c b a) in one process, so load drifts hit all alike."""
    seed = args.seeds[0]
    config = seed_config(args, seed)
    folder = args.out / f"seed-{seed}"
    times: dict[str, list[float]] = {name: [] for name in variants}
    with process_settings(1):
        prepare_seed(config, folder, meters, allow_mixed=args.allow_mixed)
        for k, name in enumerate([*variants, *reversed(variants)]):
            overrides = [f"run.out={args.out / 'speed' / f'{name}-{k}'}", "run.progress=false", f"run.steps={steps}",
                         "run.save_every=0", "eval.every=0", *variants[name]]  # fmt: skip
            records = train(resolve(None, folder / "train.yaml", overrides), overwrite=True)
            times[name] += [r["time/step"] / r["train/rows"] for r in records if r.get("step", 0) > 0]
    return {name: statistics.median(values) for name, values in times.items()}


SPEED_COLUMNS = ("step", "median ms per training row", "÷ old")


def speed(args: argparse.Namespace) -> tuple[str, dict]:
    """Median training-step time of the old and the new step, interleaved old-new-new-old (module doc)."""
    grpo = ("algo.method=grpo",)
    variants = {"old": (*grpo, *OLD_STEP), "new": (*grpo, *NEW_STEP)}
    times = interleaved_step_times(args, variants, args.speed, meters=Meters())
    old, new = times["old"], times["new"]
    text = (f"median step time per training row over {2 * args.speed} steps each (seed {args.seeds[0]}, one thread): "
            f"old {1000 * old:.2f} ms, new {1000 * new:.2f} ms; new ÷ old = {new / old:.3f} ({old / new:.2f}x faster)")
    rows = [[name, f"{1000 * value:.2f}", f"{value / old:.3f}"] for name, value in times.items()]
    return text, {"speed": (SPEED_COLUMNS, rows)}


OVERHEAD_COLUMNS = ("arm", "median ms per training row", "÷ first arm's")


def overhead(args: argparse.Namespace, arms: Sequence[Arm]) -> tuple[str, dict]:
    """Each arm's step time ÷ GRPO's, N steps each, interleaved (``--overhead N``)."""
    folder = args.out / f"seed-{args.seeds[0]}"
    variants = {arm.name: tuple(arm.overrides(folder / "meter")) for arm in arms}
    times = interleaved_step_times(args, variants, args.overhead, meters=meters_read(arms))
    base = times[arms[0].name]
    lines = [f"median step time per training row over {2 * args.overhead} steps each (seed {args.seeds[0]}, one "
             f"thread), ÷ {arms[0].name}'s:"]
    lines += [f"  {name:28s} {1000 * value:7.2f} ms  {value / base:.2f}x" for name, value in times.items()]
    rows = [[name, f"{1000 * value:.2f}", f"{value / base:.2f}"] for name, value in times.items()]
    return "\n".join(lines), {"overhead": (OVERHEAD_COLUMNS, rows)}


# ---- the meters against the planner -------------------------------------------------------------------------------
@dataclass(frozen=True)
class FitRow:
    """A row of ``--meter-fit``: what reads the states (``kind``: a learned meter's folder under the seed, ``labels``
    for a label file read as a meter, ``oracle`` or ``belief``), its label source, and whether the recommended arm
    reads it."""

    name: str
    kind: str
    label_source: str | None = None
    recommended: bool = False


def fit_rows(arms: Sequence[Arm]) -> list[FitRow]:
    """The meters the arms read (the outcome meter always, beside one trained without the turns left), the labels
    they learn from, and the planner and the belief reference (the ceiling of a history reader)."""
    needed = meters_read(arms)
    recommended = meters_read([Arm.parse(RECOMMENDED_ARM)])
    rows = [FitRow("outcome, without turns left", "meter-no-turns", "outcome"),
            FitRow("outcome", meter_folder(0), "outcome", recommended.learned > 0 and not recommended.sources)]
    rows += [FitRow(source, labelled_meter(source), source, source in recommended.sources) for source in needed.sources]
    rows += [FitRow(f"labels: {source}", "labels", source) for source in needed.sources]
    rows += [FitRow("generative", GENERATIVE_METER, "outcome")] if needed.generative else []
    return rows + [FitRow("belief", "belief"), FitRow("oracle", "oracle")]


def common_states(rows: Sequence[Sequence[Sequence[object]]]) -> list[list[list[object]]]:
    """Every reader's ``read_states`` rows with a state kept only where every reader read it validly (None
    elsewhere): the rows of a table compare on one set of states."""
    keep = [[all(reader[i][t] is not None for reader in rows) for t in range(len(rows[0][i]))]
            for i in range(len(rows[0]))]  # fmt: skip
    return [[[r if keep[i][t] else None for t, r in enumerate(row)] for i, row in enumerate(reader)]
            for reader in rows]  # fmt: skip


STATE_SETS = {"held-out": "the held-out pool tasks' states", "training": "the meters' own training states",
              "current policy": "the states an RL-trained actor visits (its latest checkpoint, evaluation tasks)"}
POLICY_TASKS = 64  # evaluation tasks the current policy plays, 4 episodes each (a group shares its first state)


def current_policy(folder: Path, arms: Sequence[Arm]) -> Path | None:
    """The actor of the latest checkpoint of an arm that has run under the seed's ``folder``: the recommended arm's,
    else the first of ``arms`` that reads a meter, else the first that has run (GRPO, which ``--meter-fit`` adds
    first, is read last)."""
    from deltattg.train.checkpoint import ACTOR, latest_checkpoint

    recommended = Arm.parse(RECOMMENDED_ARM).name
    for arm in sorted(arms, key=lambda arm: (arm.name != recommended, arm.meter is None)):
        found = latest_checkpoint(folder / arm.folder)
        if found is not None:
            return found / ACTOR
    return None


FIT_KEYS = ("states", "steps", "b_balanced_accuracy", "ttg_spearman", "delta_spearman", "delta_sign_agreement",
            "sibling_pairs", "sibling_ranking", "completion_accuracy", "calibration_error")  # fmt: skip


def meter_fit_report(args: argparse.Namespace, arms: Sequence[Arm]) -> tuple[str, dict, list[dict]]:
    """Per seed, on the held-out pool tasks' states and on the meters' training states: every meter the arms read,
    the labels they learn from, the belief reference and the planner — against the trajectory's outcome and against
    the planner, Δ (what credit reads) included, each table on the states every row reads (``--meter-fit``).
    Returns the text, its tables and one record per (state set, row) with the numbers averaged over seeds."""
    from deltattg.data.trajectory import MeterOutput
    from deltattg.meter.fit import agreement_of, fit_of
    from deltattg.meter.loading import load_meter, planner_meter, read_states

    needed, rows = meters_read(arms), fit_rows(arms)
    numbers: dict[tuple[str, str], list[dict]] = {}
    with process_settings(1):
        for seed in args.seeds:
            config, folder = seed_config(args, seed), args.out / f"seed-{seed}"
            seed_folder = prepare_seed(config, folder, Meters(max(needed.learned, 1), needed.generative, needed.sources),
                                       allow_mixed=args.allow_mixed, need_pool=True)  # fmt: skip
            actor = seed_folder.actor
            if not (folder / "meter-no-turns" / "meter_config.json").is_file():
                train_meter(config, seed_folder.train_pool, actor, folder / "meter-no-turns",
                            seed_folder.heldout_pool, turns_left=False)  # fmt: skip
            labels = {source: pool_labels(config, seed_folder.world, actor, seed_folder.pool,
                                          label_settings(config, source, folder / meter_folder(0)),
                                          folder / f"labels-{source}.jsonl", folder / meter_folder(0))[0]
                      for source in needed.sources}  # fmt: skip
            state_sets = {"held-out": seed_folder.heldout_pool, "training": seed_folder.train_pool}
            policy = current_policy(folder, arms)
            if policy is not None:
                state_sets["current policy"] = policy_states(config, seed_folder.world, policy, actor.tokenizer,
                                                             POLICY_TASKS)  # fmt: skip
                print(f"[bench] seed {seed}: current-policy states from {policy}", file=sys.stderr, flush=True)
            for state_set, trajectories in state_sets.items():
                readings, here = [], [row for row in rows if row.kind != "labels" or state_set != "current policy"]
                for row in here:  # (the current policy's states have no labels)
                    if row.kind == "labels":  # the labels themselves (checked against the pool), read as a meter
                        readings.append([[MeterOutput(label.can_complete, label.tokens_to_go)
                                          for label in labels[row.label_source][t.id][:-1]] for t in trajectories])
                    elif row.kind in ("oracle", "belief"):
                        readings.append(read_states(planner_meter(row.kind, actor.tokenizer), trajectories)[0])
                    else:
                        readings.append(read_states(load_meter(folder / row.kind), trajectories)[0])
                readings = common_states(readings)
                planner = readings[-1]
                for row, read in zip(here, readings):
                    fit = fit_of(trajectories, read)
                    agree = agreement_of(trajectories, read, planner, config.credit.failure_cost)
                    numbers.setdefault((state_set, row.name), []).append(
                        agree.as_dict() | {"completion_accuracy": fit.completion_accuracy,
                                           "calibration_error": fit.calibration_error})  # fmt: skip
            print(f"[bench] seed {seed}: meters read", file=sys.stderr, flush=True)
    records = [{"meter": row.name, "label_source": row.label_source, "recommended": row.recommended,
                "state_set": state_set, "seeds": list(args.seeds),
                **{key: mean_of([n[key] for n in numbers[state_set, row.name]]) for key in FIT_KEYS}}
               for state_set in STATE_SETS for row in rows if (state_set, row.name) in numbers]  # fmt: skip
    header = ("meter (label source)", "states", "steps", "b balanced acc. vs planner", "Spearman v̂ vs planner's v",
              "Δ Spearman vs planner's", "Δ sign agreement", "sibling ranking (pairs)", "completion acc. %",
              "ECE of p̃")  # fmt: skip
    tables, parts = {}, []
    for state_set, what in STATE_SETS.items():
        if not any(r["state_set"] == state_set for r in records):
            continue
        table = [[r["meter"] + (" ★" if r["recommended"] else ""), f"{r['states']:.0f}",
                  f"{r['steps']:.0f}", three_decimals(r["b_balanced_accuracy"]), three_decimals(r["ttg_spearman"]),
                  three_decimals(r["delta_spearman"]), three_decimals(r["delta_sign_agreement"]),
                  f"{three_decimals(r['sibling_ranking'])} ({r['sibling_pairs']:.0f})",
                  percent(r["completion_accuracy"]), three_decimals(r["calibration_error"])]
                 for r in records if r["state_set"] == state_set]  # fmt: skip
        tables[f"meters_{state_set.replace(' ', '-')}"] = (header, table)
        parts += [f"### On {what}", markdown_table(header, table)]
    first = seed_config(args, args.seeds[0])
    text = "\n\n".join([
        f"Mean over seeds {list(args.seeds)} (each seed: its own actor, pool and meters), every row on the same states "
        "(those every row reads; counts per seed). Against the planner (the oracle meter: the optimal plan fits in "
        "the turns left; the expert's remaining tokens): balanced accuracy of b̂ over its completable and hopeless "
        "states; Spearman of v̂ on every state, hopeless ones with the v̂ each reads there; Δ_t = c_t − c_{t+1} "
        f"(Eq. 7–8, C = {first.credit.failure_cost:g}, the terminal state anchored at 0 or C): its Spearman and sign "
        "(progress / none / regress) against the planner's, and the share of sibling pairs (trajectories that share "
        "a state and act differently from it) both order alike. Completion accuracy: b̂ against the trajectory's "
        f"outcome. Label sources complete with {first.label_completer!r} (K = {first.label_completions}); 'labels: X' "
        "rows read the labels themselves; belief: the planner over the worlds the history allows (the ceiling of "
        f"a history reader); ★: the meter {RECOMMENDED_ARM} reads (recommended over deltattg with a learned "
        "meter).", *parts])  # fmt: skip
    return text, tables, records


def mean_of(values: Sequence[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan


def demo_setting(text: str) -> tuple[str, object]:
    """``FIELD=VALUE`` or ``SECTION.FIELD=VALUE`` → (the key, the value typed as the field is: YAML text for a
    mapping or list); a :class:`RegimeConfig` field or a field of one of its sections (``optim.lr``)."""
    from deltattg.regime.config import setting_type
    from deltattg.train.config import coerce

    name, sep, value = text.partition("=")
    try:
        kind = setting_type(name) if sep else None
        if kind is None:
            raise ValueError(f"{name!r} is no RegimeConfig field (FIELD or SECTION.FIELD, e.g. steps or optim.lr)")
        return name, coerce(value, kind, name)
    except (ValueError, TypeError) as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def count(low: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+",
                        help="arm specs (module doc); grpo, the reference, is added when missing (default: "
                        f"{' '.join(DEFAULT_ARMS)}; with --meter-fit: {RECOMMENDED_ARM}, the recommended "
                        "planner-free arm)")
    parser.add_argument("--seeds", type=count(0), nargs="+", default=[0, 1, 2, 3, 4])
    for name in RUN_LENGTH:  # flags of RegimeConfig's fields, their help and default from the field
        parser.add_argument(f"--{name.replace('_', '-')}", type=count(1), help=f"{setting_help(RegimeConfig, name)} "
                            f"(default: the regime's, {setting_default(RegimeConfig, name)})")
    parser.add_argument("--jobs", type=count(1), default=1, help="processes at once: each prepares a seed or runs one "
                        "of a prepared seed's arms, a prepared seed's runs first (default 1)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_train"))
    parser.add_argument("--set", type=demo_setting, action="append", default=[], metavar="FIELD=VALUE",
                        help="change one RegimeConfig setting: FIELD=VALUE or SECTION.FIELD=VALUE (typed as the "
                        "field; YAML for lists and mappings), e.g. --set optim.lr=1e-4; repeatable")
    parser.add_argument("--report-only", action="store_true", help="only redraw from the runs under --out")
    parser.add_argument("--archive", type=Path, metavar="DIR",
                        help="also copy what the report reads of each finished run (seed settings, stamps, metrics; "
                        "no checkpoints) to DIR/seed-N, where seeds from several --out folders gather; "
                        "--report-only --out DIR redraws the tables from it")
    parser.add_argument("--allow-mixed", action="store_true",
                        help="reuse finished runs and actors made otherwise, and pair runs of different revisions, "
                        "settings, torch versions or CPU capabilities (the table says so); default: refuse")
    parser.add_argument("--speed", type=count(1), metavar="N", help="time N steps of the old and the new step instead")
    parser.add_argument("--overhead", type=count(1), metavar="N",
                        help="time 2N steps of every arm, interleaved, and print each ÷ the first arm's instead")
    parser.add_argument("--meter-fit", action="store_true",
                        help="instead: each seed's learned meters (the outcome labels with and without the turns "
                        "left, each label source an arm reads, the generative meter when an arm reads it), the "
                        "labels themselves and the belief reference against the outcome and the planner — b, v, "
                        "the step change Δ credit reads and sibling ranking — on the held-out pool states and on "
                        "the meters' training states (--summary: a list 'meters' of records)")
    parser.add_argument("--quick", action="store_true", help="the demo's --quick settings (a smoke test)")
    parser.add_argument("--summary", type=Path, help="also write the tables as a summary (bench/summary.py; what the "
                        "docs' results tables are generated from): arms, test, training and seeds of a comparison; "
                        "speed, overhead or meters with --speed, --overhead or --meter-fit")
    args = parser.parse_args(argv)
    if args.arms is None:
        args.arms = [RECOMMENDED_ARM] if args.meter_fit else list(DEFAULT_ARMS)
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds {' '.join(map(str, args.seeds))}: name each seed once")
    try:
        arms = [Arm.parse(spec) for spec in args.arms]
        seed_config(args, args.seeds[0])  # the --set values make a regime
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    if "grpo" in args.arms:  # the reference every comparison and ratio is taken against: first
        arms.sort(key=lambda arm: arm.name != "grpo")
    else:
        print("[bench] adding the grpo arm: every comparison is against it", file=sys.stderr)
        arms.insert(0, Arm.parse("grpo"))
    from deltattg.errors import InputError
    from deltattg.rollout.output import held_folder

    if args.report_only and not args.out.is_dir():  # nothing to hold, nothing to read
        print(f"bench_train.py: error: {missing_runs(args, arms)[0]}", file=sys.stderr)
        raise SystemExit(2)
    try:
        with held_folder(args.out):  # one benchmark at a time per --out, taken before anything is written
            command = "bench/bench_train.py " + " ".join(argv if argv is not None else sys.argv[1:])
            print(work(args, arms, command.strip()))
    except (ValueError, InputError) as exc:  # a refusal (mixed runs, a held folder), not a crash
        print(f"bench_train.py: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def work(args: argparse.Namespace, arms: Sequence[Arm], command: str) -> str:
    """What the command line asks for; returns what to print (and writes ``--summary``)."""
    summary_figures, measured_on, records = {}, None, {}
    if args.speed:
        text, tables = speed(args)
    elif args.overhead:
        text, tables = overhead(args, arms)
    elif args.meter_fit:
        text, tables, records = meter_fit_report(args, arms)
    else:
        if not args.report_only:
            run_all(args, arms)
        text, figures = report(args, arms, command)
        if args.archive:
            print(f"[bench] archived {len(archive_runs(args, arms))} files to {args.archive}", file=sys.stderr)
        (args.out / "bench_train.png").write_bytes(seed_curves_png(figures["steps"], figures["curves"]))
        (args.out / "bench_train.md").write_text(text)
        tables = figures.pop("tables")
        summary_figures = {"curves": {"kind": "seed_curves", "steps": figures["steps"], "curves": figures["curves"]}}
        measured_on = {"runs": figures["machines"]}  # the runs' machines, wherever this report is drawn
        (args.out / "bench_train.json").write_text(json.dumps(finite(figures), indent=2, allow_nan=False) + "\n")
    if args.summary:
        from deltattg.summaries import write_summary

        write_summary(args.summary, "bench_train", shlex.split(command), tables, figures=summary_figures,
                      measured_on=measured_on, records={"meters": records} if args.meter_fit else None)
    return text


if __name__ == "__main__":
    main()
