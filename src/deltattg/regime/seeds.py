"""One seed of the household regime, prepared once and then run arm by arm: what ``deltattg demo`` and
``bench/bench_train.py`` both call (the stages themselves are :mod:`deltattg.regime.stages`).

    SEED/bench.json             what prepared the seed: the code revision and the hash of the preparation settings
    SEED/actor/                 the base actor
    SEED/pool.jsonl             the trajectory pool (collected once, read back by every later stage and report)
    SEED/labels-SOURCE.jsonl    the pool's labels of each source an arm reads (``rollout.label_sources``)
    SEED/meter, meter-K, meter-SOURCE, meter-generative    the learned meters the arms read
    SEED/costs.json             what the preparation consumed before RL: the pool's episodes, each label source's
                                completions (episodes, environment steps, completer tokens)
    SEED/train.yaml             the trainer settings every arm shares
    SEED/ARM/                   one run per arm (metrics.jsonl, checkpoints; bench.json: what it ran, written last)

What is there and was made as it would be made now is reused; what is missing is made. What was made otherwise —
another code revision or preparation setting, or a finished run of other settings — is never removed silently:
:func:`stale_work` names it, and the caller refuses (the benchmark: ``--allow-mixed`` reuses it as it is), reuses it
(``allow_mixed``) or replaces it (``replace``: the demo, whose folder is its own output).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ContextManager

import yaml

from deltattg.data.jsonl import atomic_output, write_jsonl
from deltattg.data.labels import LABEL_SOURCES
from deltattg.data.sources import split_by_task
from deltattg.data.trajectory import Trajectory
from deltattg.regime.config import RegimeConfig
from deltattg.regime.stages import (
    GENERATIVE_METER,
    Arm,
    BaseActor,
    World,
    base_actor,
    build_world,
    collect_pool,
    label_settings,
    labelled_meter,
    pool_labels,
    process_settings,
    train_generative_meter,
    train_meter,
    trainer_settings,
)

STAMP = "bench.json"  # a seed's preparation stamp, and each finished run's
POOL_FILE = "pool.jsonl"
SETTINGS_FILE = "train.yaml"
METER_CONFIG = "meter_config.json"
COSTS_FILE = "costs.json"


# ---- which meters the arms read ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Meters:
    """The learned meters a seed needs: how many regression meters on the outcome labels (an ensemble reads several),
    whether the generative one, and the other label sources whose meters are read (``meter-best-of-k``, ...)."""

    learned: int = 0
    generative: bool = False
    sources: tuple[str, ...] = ()


def meters_read(arms: Sequence[Arm]) -> Meters:
    """The learned meters ``arms`` read (``td`` bootstraps from the outcome meter, so it needs that one too)."""
    sources = tuple(sorted({arm.labels for arm in arms if arm.meter == "learned" and arm.labels != "outcome"}))
    learned = max([arm.members for arm in arms if arm.meter == "learned" and arm.labels == "outcome"], default=0)
    return Meters(max(learned, 1 if "td" in sources else 0), any(arm.meter == "generative" for arm in arms), sources)


def meter_folder(k: int) -> str:
    """The folder of a seed's k-th learned meter on the outcome labels: ``meter``, ``meter-1``, ..."""
    return "meter" if k == 0 else f"meter-{k}"


def prepared_entries() -> tuple[str, ...]:
    """Every file and folder a seed's preparation makes (what :func:`prepare_seed` replaces when asked to)."""
    return ("actor", POOL_FILE, SETTINGS_FILE, COSTS_FILE, GENERATIVE_METER, "meter-no-turns", *(meter_folder(k) for k in range(64)),
            *(labelled_meter(source) for source in LABEL_SOURCES), *(f"labels-{s}.jsonl" for s in LABEL_SOURCES),
            *(f"labels-{s}.jsonl.partial" for s in LABEL_SOURCES))  # fmt: skip


# ---- stamps: what made a seed's preparation, and each run ----------------------------------------------------------
def read_stamp(folder: Path) -> dict | None:
    try:
        return json.loads((folder / STAMP).read_text())
    except (FileNotFoundError, ValueError):
        return None


def write_stamp(folder: Path, stamp: dict) -> None:
    with atomic_output(folder / STAMP) as handle:
        handle.write(json.dumps(stamp, indent=2) + "\n")


def settings_hash(settings: dict) -> str:
    from deltattg.train.checkpoint import config_hash

    return config_hash(json.dumps(settings, sort_keys=True, default=str))


def preparation_stamp(config: RegimeConfig) -> dict:
    """What makes a seed's actor, pool, labels and meters: the code revision and the hash of the settings that shape
    them (``RegimeConfig.preparation``)."""
    from deltattg.train.checkpoint import code_revision

    return {"code": code_revision(), "preparation_sha256": settings_hash(config.preparation())}


def machine() -> dict:
    """What decides how a run's numbers round: the torch version, the ATen CPU capability its kernels use and the CPU
    model (MKL's kernels follow the CPU: an Intel CPU held to AVX2 kernels does not round as an AMD one does)."""
    import torch

    from deltattg.summaries import cpu_model

    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu": cpu_model()}


def settings_text(config: RegimeConfig, folder: Path, layout: str) -> str:
    """The ``train.yaml`` every arm of the seed in ``folder`` shares (``stages.trainer_settings``), as written."""
    return yaml.safe_dump(trainer_settings(config, str(folder / "actor"), layout), sort_keys=False)


def settings_moved(text: str, folder: Path, target: str) -> str:
    """A seed's ``train.yaml`` text with the path of its seed folder (any path whose last part is ``folder``'s name,
    as the regime writes it, absolute or relative) written as ``target``."""
    path = r"(?<![\w.-])(?:[^\s'\"]*/)?" + re.escape(folder.name) + r"(?=/)"
    return re.sub(path, lambda _: target, text)


def shared_settings_hash(folder: Path, text: str | None = None) -> str:
    """SHA-256 of the settings every arm of the seed in ``folder`` shares (its ``train.yaml``, or ``text``), the
    seed folder's path written as ``SEED``: a seed folder moved or copied elsewhere holds the same settings."""
    from deltattg.train.checkpoint import config_hash

    text = (folder / SETTINGS_FILE).read_text() if text is None else text
    return config_hash(settings_moved(text, folder, "SEED"))


def ran_shared_settings(stamp: dict, folder: Path) -> bool:
    """Whether the run stamped ``stamp`` ran the shared settings of the seed in ``folder`` (stamps of runs from before
    the seed folder's path was written as ``SEED`` hash the text as it was)."""
    from deltattg.train.checkpoint import config_hash

    as_written = config_hash((folder / SETTINGS_FILE).read_text())
    return stamp.get("shared_config_sha256") in (shared_settings_hash(folder), as_written)


def run_stamp(config: RegimeConfig, folder: Path, arm: Arm, shared_settings: str) -> dict:
    """What a run of ``arm`` in the seed ``folder`` is made of now: the code revision, what prepared the seed, the
    shared settings (``train.yaml``'s text, hashed), the whole regime configuration without its seed (the same across
    the seeds of one comparison) and the machine's numerics."""
    from deltattg.train.checkpoint import code_revision

    prepared = read_stamp(folder) or {}
    regime = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("seed", "jobs", "threads")}
    return {"code": code_revision(), "prepared_by": prepared.get("code"),
            "prepared_with": prepared.get("preparation_sha256"), "shared_config_sha256": shared_settings_hash(folder, shared_settings),
            "regime_sha256": settings_hash(regime), **machine(), "arm": arm.name}  # fmt: skip


def finished(run: Path, steps: int) -> bool:
    """Whether ``run`` holds a run that reached ``steps`` and evaluated there."""
    from deltattg.train import read_metrics

    try:
        return any(r.get("step") == steps and "eval/greedy_success" in r for r in read_metrics(run))
    except (FileNotFoundError, ValueError):
        return False


def differences(made: dict, wanted: dict) -> list[str]:
    """The keys of a stamp whose values differ from those wanted, as ``key (was → now)`` (hashes cut to 12 digits)."""
    def shown(value: object) -> str:
        text = str(value)
        return text[:12] if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else text

    return [f"{key} ({shown(made.get(key))} → {shown(wanted[key])})" for key in wanted if made.get(key) != wanted[key]]


def is_prepared(folder: Path) -> bool:
    return (folder / STAMP).is_file() and any((folder / name).exists() for name in ("actor", POOL_FILE, SETTINGS_FILE))


def stale_work(config: RegimeConfig, folder: Path, arms: Sequence[Arm] = ()) -> list[str]:
    """What in the seed ``folder`` was made otherwise than ``config`` would make it now, one line each: its
    preparation (another code revision or preparation setting), and finished runs of ``arms`` whose stamps differ from
    what a run would be made of now (another revision, regime setting, shared setting or machine). Nothing is read
    but the stamps and the runs' metrics; nothing is written."""
    problems = []
    wanted = preparation_stamp(config)
    if is_prepared(folder):
        differ = differences(read_stamp(folder) or {}, wanted)
        if differ:
            problems.append(f"{folder}: its actor, pool, labels and meters were made with another {'; '.join(differ)}")
    if problems or not arms:
        return problems
    shared = settings_text(config, folder, build_world(config).prompt.layout)
    for arm in arms:
        run = folder / arm.folder
        if finished(run, config.steps):
            differ = differences(read_stamp(run) or {}, run_stamp(config, folder, arm, shared))
            if differ:
                problems.append(f"{run}: a finished run of other settings: {'; '.join(differ)}")
    return problems


class StaleWork(ValueError):
    """Work in an output folder made otherwise than it would be made now, which the caller did not say to reuse or
    replace."""


def refuse_stale(problems: Sequence[str]) -> None:
    if problems:
        raise StaleWork("refusing to replace work made otherwise (--allow-mixed reuses it as it is; or use another "
                        "--out, or delete it yourself):\n  " + "\n  ".join(problems))


# ---- preparation -------------------------------------------------------------------------------------------------
@dataclass
class Prepared:
    """A prepared seed: its world, base actor, pool (split into the meters' training and held-out tasks; empty where
    it was not needed) and folder."""

    folder: Path
    world: World
    actor: BaseActor
    pool: list[Trajectory] = field(default_factory=list)
    train_pool: list[Trajectory] = field(default_factory=list)
    heldout_pool: list[Trajectory] = field(default_factory=list)

    @property
    def settings_file(self) -> Path:
        return self.folder / SETTINGS_FILE


def untimed(name: str) -> ContextManager[None]:
    return contextlib.nullcontext()


def prepare_seed(config: RegimeConfig, folder: Path, meters: Meters, *, allow_mixed: bool = False,
                 replace: bool = False, need_pool: bool = False,
                 stage: Callable[[str], ContextManager[None]] = untimed) -> Prepared:
    """The seed's base actor, pool (when a missing meter or ``need_pool`` needs it), labels and ``meters``, and the
    trainer settings every arm shares, in ``folder`` (the module doc's layout), each made only where missing.
    A preparation made otherwise is refused (:class:`StaleWork`, naming the difference), reused as it is with
    ``allow_mixed``, or removed and made again with ``replace``; the stamp is written before anything is made, so a
    killed preparation is completed by the next call. ``stage(name)`` wraps each stage (the demo times them)."""
    world = build_world(config)
    wanted = preparation_stamp(config)
    if is_prepared(folder) and differences(read_stamp(folder) or {}, wanted):
        if replace:
            remove_preparation(folder)
        elif not allow_mixed:
            refuse_stale(stale_work(config, folder))
    folder.mkdir(parents=True, exist_ok=True)
    if not is_prepared(folder):
        write_stamp(folder, wanted)
    with stage("1 base actor (behaviour cloning)" if config.is_tiny else "1 base actor"):
        actor = prepared_actor(config, world, folder / "actor")
    missing = [k for k in range(meters.learned) if not (folder / meter_folder(k) / METER_CONFIG).is_file()]
    generative_missing = meters.generative and not (folder / GENERATIVE_METER / METER_CONFIG).is_file()
    sources_missing = [s for s in meters.sources if not (folder / labelled_meter(s) / METER_CONFIG).is_file()]
    prepared = Prepared(folder, world, actor)
    if missing or generative_missing or sources_missing or need_pool:
        with stage("2 trajectory pool"):
            prepared.pool = seed_pool(config, world, actor, folder / POOL_FILE)
            prepared.train_pool, prepared.heldout_pool = split_by_task(prepared.pool, config.heldout_fraction,
                                                                       config.seed)  # fmt: skip
    with stage("3 progress meter"):
        train_pool, heldout = prepared.train_pool, prepared.heldout_pool
        for k in missing:  # member k's backbone and shuffles from seed + 1000·k, on the same pool
            train_meter(config.replace(seed=config.seed + 1000 * k), train_pool, actor,
                        folder / meter_folder(k), heldout)  # fmt: skip
        if generative_missing:
            train_generative_meter(config, train_pool, folder / GENERATIVE_METER, heldout)
        for source in sources_missing:  # labels of every pool state (held-out ones calibrate), then the meter
            settings = label_settings(config, source, folder / meter_folder(0))
            labels, report = pool_labels(config, world, actor, prepared.pool, settings,
                                         folder / f"labels-{source}.jsonl", folder / meter_folder(0))  # fmt: skip
            meter = folder / labelled_meter(source)
            train_meter(config, train_pool, actor, meter, heldout, labels=labels, labelling=settings)
            (meter / "labels_report.json").write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    if prepared.pool:
        with atomic_output(folder / COSTS_FILE) as handle:
            handle.write(json.dumps(preparation_costs(folder, prepared.pool), indent=2) + "\n")
    with atomic_output(prepared.settings_file) as handle:
        handle.write(settings_text(config, folder, world.prompt.layout))
    return prepared


def preparation_costs(folder: Path, pool: Sequence[Trajectory]) -> dict[str, Any]:
    """What the seed's preparation consumed before any RL, for the benchmark's accounting: the pool's episodes and
    environment steps (every learned meter reads it), and the completions of each label source made in ``folder``
    (their ``labels_report.json``: episodes, environment steps, completer tokens)."""
    labels = {}
    for source in LABEL_SOURCES:
        report = folder / labelled_meter(source) / "labels_report.json"
        if report.is_file():
            cost = json.loads(report.read_text()).get("cost") or {}
            labels[source] = {"episodes": cost.get("completion_episodes", 0), "env_steps": cost.get("env_steps", 0),
                              "completer_tokens": cost.get("completer_tokens", 0)}  # fmt: skip
    return {"pool": {"episodes": len(pool), "env_steps": sum(t.num_steps for t in pool)}, "labels": labels}


def remove_preparation(folder: Path) -> None:
    """Remove what a seed's preparation made in ``folder`` (:func:`prepared_entries`) and its stamp; runs stay."""
    print(f"[regime] {folder}: replacing a preparation made otherwise", file=sys.stderr, flush=True)
    for name in (*prepared_entries(), STAMP):
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def prepared_actor(config: RegimeConfig, world: World, folder: Path) -> BaseActor:
    """The seed's base actor: read from ``folder`` where a whole one is there, else made (behaviour cloning) in a
    work folder beside it and moved into place, so ``folder`` never holds half an actor; a pretrained
    ``config.model`` is loaded as it is."""
    from deltattg.hf import load_causal_lm, load_tokenizer

    if not config.is_tiny:
        return base_actor(config, world, folder)
    if (folder / "config.json").is_file():
        return BaseActor(str(folder), load_causal_lm(str(folder)).eval(), load_tokenizer(str(folder)))
    work = folder.with_name(f".{folder.name}.partial")
    shutil.rmtree(work, ignore_errors=True)
    actor = base_actor(config, world, work)
    work.rename(folder)
    return dataclasses.replace(actor, spec=str(folder))


def seed_pool(config: RegimeConfig, world: World, actor: BaseActor, path: Path) -> list[Trajectory]:
    """The seed's trajectory pool: read from ``path`` where it was collected before, else collected and written
    there (atomically, without the per-step prompt ids)."""
    from deltattg.data.sources import read_trajectory_file

    if path.is_file():
        return [item.trajectory for item in read_trajectory_file(str(path)).items]
    pool = collect_pool(config, world, actor)
    write_jsonl(path, (without_rollout_detail(t).to_json() for t in pool))
    return pool


def without_rollout_detail(trajectory: Trajectory) -> Trajectory:
    """The trajectory without per-step prompt ids (rebuilt from the messages when needed; keeps the pool file small)."""
    steps = [dataclasses.replace(step, prompt_ids=None) for step in trajectory.steps or []]
    return dataclasses.replace(trajectory, steps=steps or None)


# ---- the arms -------------------------------------------------------------------------------------------------------
def arm_config(folder: Path, arm: Arm, run: Path, *extra: str) -> Any:
    """The trainer configuration of ``arm``'s run at ``run``: the seed's ``train.yaml`` with the arm's settings on top
    (no preset: every setting the runs share is in the file)."""
    from deltattg.train import resolve

    return resolve(None, folder / SETTINGS_FILE, [*arm.overrides(folder / meter_folder(0)), f"run.out={run}",
                                                  "run.progress=false", *extra])


def run_arm(config: RegimeConfig, folder: Path, arm: Arm, allow_mixed: bool = False,
            replace: bool = False) -> tuple[list[dict], bool]:
    """``arm``'s run in the prepared seed ``folder`` (its records, and whether it was already there), under the
    regime's process settings (``config.threads``, restored afterwards): a finished run made as it would be made now
    is reused (any finished run with ``allow_mixed``); one of other settings is refused (:class:`StaleWork`) unless
    ``replace``; an unfinished one is started over. Its stamp is written last: a stamp means a finished run."""
    with process_settings(config.threads):
        return _run_arm(config, folder, arm, allow_mixed, replace)


def _run_arm(config: RegimeConfig, folder: Path, arm: Arm, allow_mixed: bool,
             replace: bool) -> tuple[list[dict], bool]:
    from deltattg.train import read_metrics, train

    run = folder / arm.folder
    stamp = run_stamp(config, folder, arm, (folder / SETTINGS_FILE).read_text())
    if finished(run, config.steps):
        differ = differences(read_stamp(run) or {}, stamp)
        if not differ or allow_mixed:
            return read_metrics(run), True
        if not replace:
            refuse_stale([f"{run}: a finished run of other settings: {'; '.join(differ)}"])
    (run / STAMP).unlink(missing_ok=True)
    overrides = [f"run.save_every={config.steps}", "run.keep_checkpoints=1"]
    records = train(arm_config(folder, arm, run, *overrides), overwrite=True)
    write_stamp(run, stamp)
    return records, False


def run_arms(config: RegimeConfig, folder: Path, *, allow_mixed: bool = False,
             replace: bool = False) -> dict[str, list[dict]]:
    """Every arm of ``config.arms`` in the prepared seed ``folder``, ``config.jobs`` at a time in their own processes
    (tiny models gain more from two processes than from two threads); their records by arm name."""
    arms = [Arm.parse(spec) for spec in config.arms]
    for arm in arms:
        print(f"[regime]   {arm.name} -> {folder / arm.folder}", file=sys.stderr, flush=True)
    if config.jobs <= 1:
        return {arm.name: run_arm(config, folder, arm, allow_mixed=allow_mixed, replace=replace)[0] for arm in arms}
    import concurrent.futures
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(config.jobs, mp_context=context) as pool:
        runs = pool.map(run_arm, *zip(*[(config, folder, arm, allow_mixed, replace) for arm in arms]))
        return {arm.name: records for arm, (records, _) in zip(arms, runs)}

