"""What ``deltattg train-meter``, ``score`` and ``eval-steps`` do, as library functions over validated records."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deltattg.data.sources import Located
from deltattg.data.tokens import resolve_step_tokens
from deltattg.data.trajectory import Trajectory
from deltattg.errors import InputError
from deltattg.meter.base import Meter
from deltattg.meter.loading import read_states
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


def _located_tokens(item: Located, tokenizer: Any) -> list[int]:
    try:
        return resolve_step_tokens(item.trajectory, tokenizer)
    except InputError as exc:
        raise exc.located(path=item.path, line=item.line) from None


# ---- train-meter --------------------------------------------------------------------------------------------------


def train_regression(items: Sequence[Located], model: str, output_dir: str, *, count_tokenizer: Any = None,
                     meter_settings: dict[str, Any], train_settings: dict[str, Any],
                     calibration: Sequence[Located] = ()) -> dict:
    """A regression meter on ``model``'s backbone, trained on every decision state of ``items`` (outcomes only);
    with ``calibration`` trajectories, its completion temperature fitted on their states (report: ``calibration``)."""
    from deltattg.meter.regression import RegressionMeter
    from deltattg.meter.train_regression import RegressionTrainConfig, train_regression_meter, trajectory_examples

    try:
        meter = RegressionMeter.from_backbone(model, **meter_settings)
    except InputError:
        raise
    except ValueError as exc:  # a setting the backbone cannot honour (--layer beyond its depth)
        raise InputError(str(exc)) from None
    tokenizer = count_tokenizer or meter.tokenizer
    windows, examples = [], []
    for item in items:
        w, e = trajectory_examples(meter, _messages(item), item.trajectory.success, _located_tokens(item, tokenizer),
                                   len(windows), item.trajectory.reward)
        windows += w
        examples += e
    settings = RegressionTrainConfig(output_dir=output_dir, **train_settings)
    report = train_regression_meter(meter, windows, examples, settings)
    if calibration:
        from deltattg.meter.fit import calibrate

        report["calibration"] = calibrate(meter.eval(), [_trajectory(item) for item in calibration]).as_dict()
        meter.save_pretrained(output_dir, include_backbone=not settings.freeze_backbone)
        (Path(output_dir) / "train_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def train_generative(items: Sequence[Located], model: str, output_dir: str, *, stage: str, count_tokenizer: Any = None,
                     max_prompt_tokens: int | None, lora: bool, train_settings: dict[str, Any],
                     turn_limit: int | None = None) -> None:
    """The paper's generative meter: SFT (Eq. 3), then optionally GRPO refinement (D.2, our reconstructed reward);
    with ``turn_limit``, every prompt states the turns left (and the meter keeps the limit)."""
    from deltattg.meter.generative import GenerativeMeter
    from deltattg.meter.train_generative import (
        grpo_config,
        meter_dataset,
        sft_config,
        train_grpo,
        train_sft,
        trajectory_records,
    )

    meter = GenerativeMeter.from_pretrained(model, turn_limit=turn_limit,
                                            **({"max_prompt_tokens": max_prompt_tokens} if max_prompt_tokens else {}))
    tokenizer = count_tokenizer or meter.tokenizer
    for item in items:
        _located_tokens(item, tokenizer)  # locate bad records before any training starts
    records = list(trajectory_records([item.trajectory for item in items], tokenizer))
    dataset = meter_dataset(records, meter.tokenizer, meter.max_prompt_tokens, meter.turn_limit)
    peft = None
    if lora:
        from peft import LoraConfig

        peft = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    out = Path(output_dir)
    if stage in ("sft", "sft+grpo"):
        target = out / "sft" if stage == "sft+grpo" else out
        meter = train_sft(meter, dataset, target, args=sft_config(target, **train_settings), peft_config=peft,
                          resume_from_checkpoint=_latest_checkpoint(target))
    if stage in ("grpo", "sft+grpo"):
        grpo = grpo_config(out, max_completion_length=meter.max_new_tokens, **train_settings)
        train_grpo(meter, dataset, out, args=grpo, peft_config=peft, resume_from_checkpoint=_latest_checkpoint(out))


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
