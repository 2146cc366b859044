"""``run_demo``: one seed of the household regime, prepared and run by :mod:`deltattg.regime.seeds` (the benchmark's
own seed orchestrator) and timed, then the demo's own stages:

    base actor (tiny: behaviour-cloned on noisy-expert episodes)    ->  out/actor
    trajectory pool (noisy experts, random, the base actor)          ->  out/pool.jsonl
    labels and the regression meter of the recommended arm           ->  out/labels-best-of-k.jsonl, out/meter-best-of-k
    GRPO, the recommended learned arm and the oracle arm, one seed   ->  out/grpo, ... (metrics.jsonl, ...)
    the meter read against the planner (b̂, v̂ and the step change Δ credit reads), test-time guidance of the base
    actor (E.5, Table 9 layout) and one group's credit under each estimator  ->  what ``report`` draws and tabulates
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from deltattg.credit.deltattg import RECOMMENDED
from deltattg.data.sources import Located
from deltattg.data.trajectory import MeterOutput, Trajectory
from deltattg.guidance import GuidanceRow, compare_guidance
from deltattg.inspection import CreditArm, Inspection, inspect_credit
from deltattg.meter.fit import Agreement, MeterFit, agreement_of, fit_of
from deltattg.meter.loading import load_meter, read_states
from deltattg.meter.oracle import OracleMeter
from deltattg.regime.config import RegimeConfig
from deltattg.regime.seeds import meter_folder, meters_read, prepare_seed, run_arms
from deltattg.regime.stages import Arm, BaseActor, World, policy_success, process_settings
from deltattg.rollout.engine import run_episodes
from deltattg.train.actor import torch_device


# ---- stage 5: test-time guidance and a credit example ----------------------------------------------------------------
def guidance_rows(config: RegimeConfig, world: World, actor: BaseActor, meter: Any) -> list[GuidanceRow]:
    """The base actor on held-out tasks: natural rollout (1 candidate), random-of-K and meter-guided-of-K (E.5)."""
    natural = actor.policy(config, world, name="natural")
    return compare_guidance(world.make_env, world.tasks(config.eval_split, config.guidance_tasks), lambda: natural,
                            meter, candidates=config.candidates, seed=config.seed, max_turns=config.max_turns).rows


def with_readings(trajectory: Trajectory, readings: list[MeterOutput | None]) -> Located:
    """The trajectory with its meter readings, as ``assign_credit`` reads it."""
    scored = replace(trajectory, meter=readings)
    return Located("demo", 0, scored, scored.to_json())


def credit_inspection(config: RegimeConfig, world: World, actor: BaseActor, meter: Any) -> tuple[Inspection, list[Located]]:
    """G sampled base-actor rollouts of ``credit_tasks`` training tasks, credited by GRPO and by DeltaTTG reading the
    learned meter and (household) the oracle: ``deltattg inspect``'s per-step credit and precision table, and the
    rollouts."""
    torch.manual_seed(config.seed)
    tasks = world.tasks(config.train_split, config.credit_tasks)
    rollouts = run_episodes(world.make_env, tasks, actor.policy(config, world), group_size=config.group_size,
                            max_turns=config.max_turns)  # fmt: skip
    learned = [with_readings(t, r) for t, r in zip(rollouts, read_states(meter, rollouts)[0])]
    arms = [CreditArm("GRPO", "grpo", learned), CreditArm("DeltaTTG (learned meter)", "deltattg", learned),
            CreditArm("robust DeltaTTG (learned meter)", RECOMMENDED, learned)]
    household = config.env == "household"
    if household:
        exact = read_states(OracleMeter(actor.tokenizer), rollouts)[0]
        arms.append(CreditArm("DeltaTTG (oracle meter)", "deltattg", [with_readings(t, r) for t, r in zip(rollouts, exact)]))
    return inspect_credit(arms, config.credit, env="household" if household else None), learned


# ---- the whole demo --------------------------------------------------------------------------------------------------
def shown_meter(arms: list[Arm]) -> str:
    """The folder of the learned meter the demo shows and guides with: the first learned arm's (the recommended arm's
    by default: ``meter-best-of-k``), else the seed's meter on the outcome labels."""
    return next((arm.meter_folder for arm in arms if arm.meter == "learned"), meter_folder(0))


@dataclass
class DemoResult:
    config: RegimeConfig
    out: Path
    timings: dict[str, float] = field(default_factory=dict)
    actor: BaseActor | None = None
    pool: dict[str, tuple[int, float, float]] = field(default_factory=dict)
    meter_name: str = ""  # the shown meter's folder under out (``shown_meter``)
    meter_report: dict = field(default_factory=dict)
    fit: MeterFit | None = None
    oracle_agreement: Agreement | None = None  # the meter against the planner on the same states (household)
    runs: dict[str, list[dict]] = field(default_factory=dict)
    guidance: list[GuidanceRow] = field(default_factory=list)
    credit: Inspection | None = None
    credit_items: list[Located] = field(default_factory=list)


@contextlib.contextmanager
def stage(name: str, timings: dict[str, float]) -> Iterator[None]:
    """Print the stage's start and its wall time; record the time under ``name``."""
    print(f"[demo] {name} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    yield
    timings[name] = time.perf_counter() - start
    print(f"[demo] {name}: {timings[name]:.1f} s", file=sys.stderr, flush=True)


def run_demo(config: RegimeConfig, out: str | Path, *, guidance: bool = True) -> DemoResult:
    """Every stage (without stage 5 unless ``guidance``); outputs under ``out``, prepared and run as one seed of the
    regime (:mod:`deltattg.regime.seeds`: what is there and made as it would be made now is reused, what was made
    otherwise is replaced — the folder is the demo's own output); the report is written by
    :func:`deltattg.demo.report.write_report`."""
    with process_settings(config.threads):
        out = Path(out)
        result = DemoResult(config, out)
        timings = result.timings
        arms = [Arm.parse(spec) for spec in config.arms]
        read, result.meter_name = meters_read(arms), shown_meter(arms)
        if result.meter_name == meter_folder(0):
            read = replace(read, learned=max(read.learned, 1))
        prepared = prepare_seed(config, out, read, replace=True, need_pool=True,
                                stage=lambda name: stage(name, timings))  # fmt: skip
        actor, world, heldout_pool = prepared.actor, prepared.world, prepared.heldout_pool
        result.actor = actor
        result.pool = policy_success(prepared.pool)
        result.meter_report = json.loads((out / result.meter_name / "train_report.json").read_text())
        meter = load_meter(out / result.meter_name, device=torch_device("auto"))
        readings = read_states(meter, heldout_pool)[0]
        result.fit = fit_of(heldout_pool, readings)
        if config.env == "household":  # the planner reads the same states: does the meter read progress?
            planner = read_states(OracleMeter(actor.tokenizer), heldout_pool)[0]
            result.oracle_agreement = agreement_of(heldout_pool, readings, planner, config.credit.failure_cost)
        with stage("4 RL: " + ", ".join(config.arms), timings):
            result.runs = run_arms(config, out, replace=True)
        if guidance:
            with stage("5 guidance and credit example", timings):
                result.guidance = guidance_rows(config, world, actor, meter)
                result.credit, result.credit_items = credit_inspection(config, world, actor, meter)
    return result
