"""What ``deltattg train-meter``, ``score`` and ``eval-steps`` do, as library functions over validated records."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from deltattg.command import UsageError
from deltattg.data.sources import Located
from deltattg.data.tokens import located_step_tokens
from deltattg.data.labels import StateLabel
from deltattg.data.trajectory import Trajectory, assistant_indices
from deltattg.errors import InputError
from deltattg.meter.base import Meter
from deltattg.meter.loading import CONFIG_NAME, read_states
from deltattg.meter.step_quality import (
    StepQuality,
    baseline_rows,
    check_step_labels,
    labelled_steps,
    step_judgements,
    step_quality,
)


def select_split(items: Sequence[Located], split: str | None, subset: str | None) -> list[Located]:
    """The trajectories whose ``id`` is in ``subset`` of the split file (all of them without a split)."""
    if split is None:
        return list(items)
    from deltattg.data.sources import load_split

    wanted = load_split(split, subset or "train")
    return [item for item in items if item.trajectory.id in wanted]


def _messages(item: Located) -> list[dict]:
    if item.trajectory.messages is None:
        raise InputError("the meter reads decision prefixes, so records need messages", path=item.path,
                         line=item.line, field="messages")
    return item.trajectory.messages


def _trajectory(item: Located) -> Trajectory:
    """The record's trajectory, refused (located) when it has no messages to read decision prefixes from."""
    _messages(item)
    return item.trajectory


def _read_located(meter: Meter, items: Sequence[Located], terminal: bool = False) -> list[list]:
    """``read_states`` of the items' trajectories; a record the meter refuses (the oracle cannot replay it) is found
    by reading the chunk's records one at a time, and the error names its file and line."""
    try:
        return read_states(meter, [_trajectory(item) for item in items], terminal=terminal)[0]
    except InputError as exc:
        if len(items) == 1:
            raise exc.located(path=items[0].path, line=items[0].line) from None
        return [row for item in items for row in _read_located(meter, [item], terminal)]


# ---- train-meter --------------------------------------------------------------------------------------------------


def _local_spec(spec: str | None) -> Path | None:
    """The local file or folder a model or tokenizer spec reads (:func:`deltattg.hf.local_folder`), resolved; ``None``
    for a Hub id, the named ``smollm2`` spec or no spec."""
    from deltattg.hf import local_folder

    folder = None if spec is None else local_folder(spec)
    return None if folder is None else Path(folder).expanduser().resolve()


def check_meter_output(out: str, *, model: str, tokenizer: str | None = None) -> None:
    """Refuse, before any work, an ``--out`` that would write into a model or tokenizer it reads (the same folder,
    one inside it, or one holding it; compared as resolved paths), a folder that holds files but no meter, or one
    whose work folder beside it cannot be written (a file on its way, a read-only place): ``InputError`` naming it.
    Nothing is created."""
    from deltattg.data.jsonl import check_writable

    target = Path(out).expanduser().resolve()
    for option, spec in (("--model", model), ("--tokenizer", tokenizer)):
        source = _local_spec(spec)
        if source is not None and (source == target or source in target.parents or target in source.parents):
            where = "is" if source == target else "is inside" if source in target.parents else "holds"
            raise InputError(f"--out {where} the {option} folder ({spec}): refusing to write the meter over what it "
                             "trains from; choose another --out", path=out)
    if target.is_dir() and not (target / CONFIG_NAME).is_file() and any(target.iterdir()):
        raise InputError("is a folder holding something other than a meter: the meter's files would replace and mix "
                         "with what is there; choose a new or empty --out (a meter's own folder is retrained in "
                         "place)", path=out)  # fmt: skip
    try:  # the meter is built next to --out, then moved into it (--out itself: the command's check_out)
        check_writable(partial_folder(target), folder=True)
    except InputError as exc:
        raise InputError(exc.message, path=out) from None


RELIABILITY_FIGURE = "reliability.png"


def partial_folder(out: Path) -> Path:
    """Where a meter for ``out`` is built: ``.NAME.partial`` next to it (kept by a failed or interrupted run, so the
    same command resumes from its feature cache and checkpoints)."""
    return out.with_name(f".{out.name}.partial")


@contextlib.contextmanager
def staged_meter_folder(out: str | os.PathLike) -> Iterator[Path]:
    """A work folder (:func:`partial_folder`) to build the meter for ``out`` in, published to ``out`` only when the
    block ends without an exception, so ``out`` never holds half a meter. The folder is held by this process alone
    (a second run on the same ``out`` is refused); the feature cache of a meter already at ``out`` is reused. On
    failure the work folder is removed if nothing was written in it, else kept (and said so) for the next run."""
    from deltattg.rollout.output import LOCK_FILE, held_folder

    target = Path(out).expanduser().resolve()
    work = partial_folder(target)
    with held_folder(work):
        _reuse_feature_cache(target, work)
        try:
            yield work
        except BaseException:
            if any(p.name != LOCK_FILE for p in work.iterdir()):
                print(f"deltattg: the work done so far is kept in {work}: the same command resumes from it (delete it "
                      "to start over)", file=sys.stderr)  # fmt: skip
            raise
        (work / LOCK_FILE).unlink()
        publish_meter_folder(work, target)


def _reuse_feature_cache(out: Path, work: Path) -> None:
    """Link (else copy) the feature cache of a meter already at ``out`` into ``work``: retraining heads into the same
    ``--out`` reads the features again (a cache: any failure to do so is only a recomputation)."""
    from deltattg.meter.features import FEATURES_NAME

    source, copy = out / FEATURES_NAME, work / FEATURES_NAME
    if not source.is_file() or copy.exists():
        return
    try:
        os.link(source, copy)
    except OSError:
        with contextlib.suppress(OSError):
            shutil.copy2(source, copy)


def publish_meter_folder(work: Path, out: Path) -> None:
    """Move the meter built in ``work`` to ``out``: one rename where ``out`` does not exist; into an existing ``out``
    entry by entry (other files there stay), its old ``meter_config.json`` removed first and the new one moved last,
    so ``out`` never reads as a meter mixing two runs' files. ``work`` is gone afterwards."""
    try:
        if not out.exists():
            work.rename(out)
            return
        (out / CONFIG_NAME).unlink(missing_ok=True)
        for entry in sorted(work.iterdir(), key=lambda p: p.name == CONFIG_NAME):
            _replace_entry(entry, out / entry.name)
        work.rmdir()
    except OSError as exc:
        raise InputError(f"cannot write the meter here: {exc.strerror or exc}", path=str(out)) from None


def _replace_entry(entry: Path, target: Path) -> None:
    """Move the file or folder ``entry`` to ``target``, replacing whatever is there."""
    if target.exists() and os.path.samefile(entry, target):  # a hard link of it (the reused feature cache)
        entry.unlink()  # (renaming one link of a file onto another does nothing)
        return
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif entry.is_dir() and (target.exists() or target.is_symlink()):
        target.unlink()
    os.replace(entry, target)


def announce_training(kind: str, trajectories: int, turn_limit: int | None) -> None:
    """What is about to be trained, on stderr (once every setting and record was checked)."""
    if turn_limit is not None:
        print(f"marking each decision state with the turns left of a {turn_limit}-turn limit", file=sys.stderr)
    print(f"training a {kind} meter on {trajectories} trajectories", file=sys.stderr)


def train_regression(items: Sequence[Located], model: str, output_dir: str, *, count_tokenizer: Any = None,
                     meter_settings: dict[str, Any], train_settings: dict[str, Any],
                     calibration: Sequence[Located] = (), labels: dict[str, list[StateLabel]] | None = None,
                     label_report: Any = None) -> dict:
    """A regression meter on ``model``'s backbone, trained on every decision state of ``items`` (their outcomes, or
    ``labels`` by trajectory id from a label source, ``rollout.label_sources``); with ``calibration`` trajectories,
    its completion temperature fitted on their states against the same kind of labels (report: ``calibration``;
    ``labels`` with ``label_report``'s cost). Every record is checked before training starts; the meter appears at
    ``output_dir`` whole, or not at all."""
    from deltattg.meter.regression import RegressionMeter
    from deltattg.meter.train_regression import RegressionTrainConfig, train_regression_meter, trajectory_examples

    with staged_meter_folder(output_dir) as work:
        try:
            meter = RegressionMeter.from_backbone(model, **meter_settings)
        except InputError:
            raise
        except ValueError as exc:  # a setting the backbone cannot honour (--layer beyond its depth)
            raise InputError(str(exc)) from None
        tokenizer = count_tokenizer or meter.tokenizer
        windows, examples = [], []
        for item in items:
            w, e = trajectory_examples(meter, _messages(item), item.trajectory.success,
                                       located_step_tokens(item, tokenizer), len(windows), item.trajectory.reward,
                                       None if labels is None else labels[item.trajectory.id])  # fmt: skip
            windows += w
            examples += e
        heldout = [_trajectory(item) for item in calibration]
        settings = RegressionTrainConfig(output_dir=str(work), **train_settings)
        announce_training("regression", len(items), meter_settings.get("turn_limit"))
        report = train_regression_meter(meter, windows, examples, settings)
        if heldout:
            report["calibration"] = calibrate_meter(meter.eval(), meter, heldout, work, completion_targets(labels))
            meter.save_pretrained(work, include_backbone=not settings.freeze_backbone)
        if heldout or label_report is not None:
            if label_report is not None:
                report["labels"] = label_report.as_dict()
            (work / "train_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def completion_targets(labels: dict[str, list[StateLabel]] | None) -> dict[str, list[float]] | None:
    """Each trajectory's completion target per state, from labels by trajectory id (None: the outcomes)."""
    return None if labels is None else {key: [label.target for label in states] for key, states in labels.items()}


def calibrate_meter(meter: Any, reader: Any, heldout: Sequence[Trajectory], folder: Path,
                    targets: dict[str, list[float]] | None = None) -> dict:
    """Fit ``meter``'s completion temperature on the held-out trajectories' states as ``reader`` reads them (the
    meter itself, or a generative meter's logit-only view of the same model) against their outcomes or the
    ``targets`` it learned, set it on the meter, and draw the reliability diagram to ``folder/reliability.png``;
    returns the fit (``Calibration.as_dict()``)."""
    from deltattg.meter.fit import calibrate
    from deltattg.report import save_reliability_diagram

    fit = calibrate(reader, heldout, targets).as_dict()
    meter.set_temperature(fit["temperature"])
    save_reliability_diagram(fit, folder / RELIABILITY_FIGURE)
    return fit


def train_generative(items: Sequence[Located], model: str, output_dir: str, *, stage: str, count_tokenizer: Any = None,
                     max_prompt_tokens: int | None, lora: bool, train_settings: dict[str, Any],
                     turn_limit: int | None = None, calibration: Sequence[Located] = (),
                     labels: dict[str, list[StateLabel]] | None = None, labelling: Any = None,
                     label_report: Any = None) -> dict:
    """The paper's generative meter: SFT (Eq. 3), then optionally GRPO refinement (D.2, our reconstructed reward);
    with ``turn_limit``, every prompt states the turns left (and the meter keeps the limit); with ``calibration``
    trajectories, the temperature of its p̃ = p(true) / (p(true) + p(false)) fitted on their states (report:
    ``calibration``). The meter is saved reading its answer with the logit and p̃ beside it (``readout="both"``).
    Records, the prompt budget and the trainers' settings are checked before training starts; the meter appears at
    ``output_dir`` whole, or not at all."""
    from deltattg.meter.train_generative import train_grpo, train_sft

    with staged_meter_folder(output_dir) as work:
        meter, dataset = _generative_data(items, model, count_tokenizer, max_prompt_tokens, turn_limit, labels,
                                          labelling)  # fmt: skip
        sft_target = work / "sft" if stage == "sft+grpo" else work
        sft_args, grpo_args = _generative_configs(stage, sft_target, work, meter.max_new_tokens, train_settings)
        peft = None
        if lora:
            from peft import LoraConfig

            peft = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
        announce_training("generative", len(items), turn_limit)
        if sft_args is not None:
            meter = train_sft(meter, dataset, sft_target, args=sft_args, peft_config=peft,
                              resume_from_checkpoint=_latest_checkpoint(sft_target))
        if grpo_args is not None:
            meter = train_grpo(meter, dataset, work, args=grpo_args, peft_config=peft,
                               resume_from_checkpoint=_latest_checkpoint(work))
        report: dict[str, Any] = {"examples": len(dataset), "stage": stage}
        if label_report is not None:
            report["labels"] = label_report.as_dict()
        heldout = [_trajectory(item) for item in calibration]
        if heldout:
            report["calibration"] = calibrate_meter(meter, meter.with_settings(readout="logit"), heldout, work,
                                                    completion_targets(labels))  # fmt: skip
            meter.save_config(work)
        (work / "train_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _generative_data(items: Sequence[Located], model: str, count_tokenizer: Any, max_prompt_tokens: int | None,
                     turn_limit: int | None, labels: dict[str, list[StateLabel]] | None = None,
                     labelling: Any = None) -> tuple[Any, Any]:
    """The untrained generative meter and its training dataset (the outcome labels, or ``labels`` by trajectory id
    from the label source ``labelling``); a bad record is refused with its file and line, a model or prompt budget
    the meter cannot use (``--max-length`` below its instruction) as a usage error."""
    from deltattg.meter.generative import GenerativeMeter
    from deltattg.meter.train_generative import meter_dataset, trajectory_records
    from deltattg.data.labels import LabelSettings, label_records

    try:
        labelling = labelling or LabelSettings()
        meter = GenerativeMeter.from_pretrained(model, turn_limit=turn_limit, readout="both",
                                                labels=labelling.to_json(), **(
            {"max_prompt_tokens": max_prompt_tokens} if max_prompt_tokens else {}))
        tokenizer = count_tokenizer or meter.tokenizer
        for item in items:
            located_step_tokens(item, tokenizer)  # locate bad records before any training starts
        if labels is None:
            records = list(trajectory_records([item.trajectory for item in items], tokenizer))
        else:
            records = [r for item in items for r in label_records(item.trajectory, labels[item.trajectory.id],
                                                                   labelling)]  # fmt: skip
        return meter, meter_dataset(records, meter.tokenizer, meter.max_prompt_tokens, meter.turn_limit)
    except InputError:
        raise
    except ValueError as exc:  # a prompt budget below the meter's instruction, a meter folder of another kind
        raise UsageError(f"--model {model} (--max-length {max_prompt_tokens}): {exc}") from None


def _generative_configs(stage: str, sft_target: Path, grpo_target: Path, max_new_tokens: int,
                        settings: dict[str, Any]) -> tuple[Any, Any]:
    """The SFT and GRPO trainer configs ``stage`` runs (``None`` for a stage it skips), built before any training so
    that a setting a trainer refuses (GRPO's batch not a multiple of its group) stops the run at once."""
    from deltattg.meter.train_generative import grpo_config, sft_config

    try:
        sft = sft_config(sft_target, **settings) if stage in ("sft", "sft+grpo") else None
        grpo = (grpo_config(grpo_target, max_completion_length=max_new_tokens, **settings)
                if stage in ("grpo", "sft+grpo") else None)  # fmt: skip
    except ValueError as exc:
        raise UsageError(f"--stage {stage}: the trainer refuses these settings: {exc}") from None
    return sft, grpo


def _latest_checkpoint(folder: Path) -> str | None:
    """The newest ``checkpoint-N`` in ``folder`` (HF Trainer's layout), to resume a killed run."""
    from deltattg.meter.train_regression import checkpoint_folders  # other names under checkpoint-* are ignored

    found = checkpoint_folders(folder) if folder.is_dir() else []
    return str(found[-1]) if found else None


# ---- score --------------------------------------------------------------------------------------------------------


def score_records(items: Sequence[Located], meter: Meter, *, asked: Sequence[bool] | None = None, chunk: int = 32,
                  progress: bool = True) -> list[dict]:
    """Each record with ``meter`` added: one reading per decision state before each action (null = invalid); only
    the trajectories ``asked`` names are read (the others get nulls: an estimator's query rule,
    ``credit.records.queried``), all of them by default."""
    from tqdm import tqdm

    asked = [True] * len(items) if asked is None else asked
    chosen = [k for k, ask in enumerate(asked) if ask]
    readings: dict[int, list] = {}
    with tqdm(total=len(chosen), desc="scoring", unit="traj", disable=not progress) as bar:
        for start in range(0, len(chosen), chunk):
            batch = chosen[start : start + chunk]
            states = _read_located(meter, [items[k] for k in batch])
            readings.update(zip(batch, states))
            bar.update(len(batch))
    out = []
    for k, item in enumerate(items):
        record = dict(item.record)
        steps = item.trajectory.num_steps
        record["meter"] = [None if r is None else r.to_json() for r in readings.get(k, [None] * steps)]
        out.append(record)
    return out


# ---- eval-meter ---------------------------------------------------------------------------------------------------


def evaluate_meter(items: Sequence[Located], meter: Meter, reference: Meter | None = None,
                   failure_cost: float | None = None) -> tuple[Any, Any]:
    """``(MeterFit, Agreement or None)``: ``meter`` on every nonterminal decision state of ``items`` (and its agreement
    with ``reference`` on the same states, Δ read with failure cost ``failure_cost``: ``meter.fit.agreement_of``). Records the meters cannot read are refused with their file and line; input
    without a single decision state is refused naming it (there is nothing to measure)."""
    from deltattg.meter.fit import agreement_of, fit_of

    trajectories = [_trajectory(item) for item in items]
    if not any(assistant_indices(t.messages or []) for t in trajectories):
        raise InputError("no decision state to read: no record has an action (an assistant message)",
                         path=items[0].path if items else None)  # fmt: skip
    ours = _read_located(meter, items)
    fit = fit_of(trajectories, ours)
    if reference is None:
        return fit, None
    return fit, agreement_of(trajectories, ours, _read_located(reference, items), failure_cost)


# ---- eval-steps ---------------------------------------------------------------------------------------------------


def evaluate_steps(items: Sequence[Located], meter: Meter, failure_cost: float, *,
                   readouts: Sequence[str] = ("binary",), progress: bool = True) -> dict[str, dict[str, StepQuality]]:
    """Step-quality rows per dataset and pooled for records with ``step_labels``: one row per readout
    (``meter (binary)``, ...) beside the baselines; the meter reads every state once whatever the readouts."""
    from tqdm import tqdm

    for item in items:  # every record's labels are checked (located) before the meter reads anything
        if item.trajectory.extra.get("step_labels") is not None:
            try:
                check_step_labels(item.trajectory.extra["step_labels"])
            except InputError as exc:
                raise exc.located(path=item.path, line=item.line) from None
    labelled = [item for item in items if item.trajectory.extra.get("step_labels")]
    if not labelled:
        raise InputError("no record has step_labels to evaluate against", path=items[0].path if items else None,
                         field="step_labels")
    pairs: dict[tuple[str, str], list[tuple[int, int | None]]] = defaultdict(list)  # (dataset, readout) -> pairs
    for start in tqdm(range(0, len(labelled), 16), desc="eval-steps", unit="chunk", disable=not progress):
        batch = labelled[start : start + 16]
        states = _read_located(meter, batch, terminal=True)
        for item, readings in zip(batch, states):
            labels = labelled_steps(item.trajectory.messages or [], item.trajectory.extra["step_labels"])
            dataset = str(item.trajectory.extra.get("data_source", "all"))
            for readout in readouts:
                judged = step_judgements(readings, failure_cost, readout)
                pairs[dataset, readout] += [(label, judged[t]) for t, label in sorted(labels.items())]
    datasets = sorted({dataset for dataset, _ in pairs})
    for readout in readouts:
        pairs["pooled", readout] = [p for dataset in datasets for p in pairs[dataset, readout]]
    out: dict[str, dict[str, StepQuality]] = {}
    for dataset in [*datasets, "pooled"]:
        rows = {f"meter ({readout})": step_quality(pairs[dataset, readout]) for readout in readouts}
        out[dataset] = rows | baseline_rows(pairs[dataset, readouts[0]])
    return out
