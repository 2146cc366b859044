"""``run_demo``: the household regime's stages (:mod:`deltattg.regime.stages`) chained and timed, then the demo's own:

    base actor (tiny: behaviour-cloned on noisy-expert episodes)   ->  out/actor
    trajectory pool (noisy experts, random, the base actor)         ->  out/pool.jsonl
    regression meter on the pool's training tasks                  ->  out/meter
    GRPO and DeltaTTG from the same actor and seed                  ->  out/grpo, out/deltattg (metrics.jsonl, ...)
    test-time guidance of the base actor (E.5, Table 9 layout), one group's credit under both estimators, and the
    meter's predicted vs true Token-to-Go on held-out pool tasks    ->  what ``report`` draws and tabulates
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import yaml

from deltattg.credit import CreditConfig
from deltattg.credit.deltattg import RECOMMENDED
from deltattg.data.jsonl import write_jsonl
from deltattg.data.sources import Located, split_by_task
from deltattg.data.trajectory import MeterOutput, Trajectory
from deltattg.guidance import GuidanceRow, compare_guidance
from deltattg.inspection import CreditArm, Inspection, inspect_credit
from deltattg.meter.fit import Agreement, MeterFit, agreement_of, fit_of
from deltattg.meter.loading import load_meter, read_states
from deltattg.meter.oracle import OracleMeter
from deltattg.regime.config import RegimeConfig
from deltattg.regime.stages import (
    BaseActor,
    World,
    base_actor,
    build_world,
    collect_pool,
    policy_success,
    process_settings,
    train_arms,
    train_meter,
    trainer_settings,
)
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
    credit = CreditConfig(rho=config.rho, cap=config.cap, failure_cost=config.failure_cost)
    return inspect_credit(arms, credit, env="household" if household else None), learned


# ---- the whole demo --------------------------------------------------------------------------------------------------
@dataclass
class DemoResult:
    config: RegimeConfig
    out: Path
    timings: dict[str, float] = field(default_factory=dict)
    actor: BaseActor | None = None
    pool: dict[str, tuple[int, float, float]] = field(default_factory=dict)
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
    """Every stage (without stage 5 unless ``guidance``); outputs under ``out`` (the report is written by
    :func:`deltattg.demo.report.write_report`)."""
    with process_settings(config.threads):
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        result = DemoResult(config, out)
        timings = result.timings
        world = build_world(config)

        with stage("1 base actor (behaviour cloning)" if config.is_tiny else "1 base actor", timings):
            actor = result.actor = base_actor(config, world, out / "actor")
        with stage("2 trajectory pool", timings):
            pool = collect_pool(config, world, actor)
            write_jsonl(out / "pool.jsonl", (without_rollout_detail(t).to_json() for t in pool))
            result.pool = policy_success(pool)
            train_pool, heldout_pool = split_by_task(pool, config.heldout_fraction, config.seed)
        with stage("3 progress meter", timings):
            result.meter_report = train_meter(config, train_pool, actor.tokenizer, out / "meter", heldout_pool)
            meter = load_meter(out / "meter", device=torch_device("auto"))
            readings = read_states(meter, heldout_pool)[0]
            result.fit = fit_of(heldout_pool, readings)
            if config.env == "household":  # the planner reads the same states: does the meter read progress?
                planner = read_states(OracleMeter(actor.tokenizer), heldout_pool)[0]
                result.oracle_agreement = agreement_of(readings, planner)
        with stage("4 RL: " + ", ".join(config.arms), timings):
            settings_file = out / "train.yaml"
            settings_file.write_text(yaml.safe_dump(trainer_settings(config, actor.spec, world.prompt.layout),
                                                    sort_keys=False))  # fmt: skip
            result.runs = train_arms(config, settings_file, out / "meter", out)
        if guidance:
            with stage("5 guidance and credit example", timings):
                result.guidance = guidance_rows(config, world, actor, meter)
                result.credit, result.credit_items = credit_inspection(config, world, actor, meter)
    return result


def without_rollout_detail(trajectory: Trajectory) -> Trajectory:
    """The trajectory without per-step prompt ids (rebuilt from the messages when needed; keeps the pool file small)."""
    steps = [replace(step, prompt_ids=None) for step in trajectory.steps or []]
    return replace(trajectory, steps=steps or None)
