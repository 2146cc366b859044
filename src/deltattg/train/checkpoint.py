"""Runs you can resume exactly: checkpoints (actor via ``save_pretrained``, optimizer, RNG states, task-sampler position,
counters, metrics so far), written atomically; and the metrics log (``metrics.jsonl``, optional TensorBoard)."""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHECKPOINTS = "checkpoints"
ACTOR = "actor"
OPTIMIZER = "optimizer.pt"
STATE = "trainer_state.pt"
METRICS = "metrics.jsonl"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_dir(out: Path, step: int) -> Path:
    return out / CHECKPOINTS / f"step-{step}"


def save_checkpoint(
    out: Path, step: int, model: Any, tokenizer: Any, optimizer: torch.optim.Optimizer, state: dict
) -> Path:
    """Write ``out/checkpoints/step-N`` atomically (a folder renamed into place), so a killed run leaves either the
    complete checkpoint or none. ``state`` is the trainer's (step, sampler, counters, metrics); RNG states are added."""
    final = checkpoint_dir(out, step)
    partial = final.with_name(f".{final.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    model.save_pretrained(partial / ACTOR)
    tokenizer.save_pretrained(partial / ACTOR)
    torch.save(optimizer.state_dict(), partial / OPTIMIZER)
    torch.save({**state, "rng": rng_state()}, partial / STATE)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(partial, final)
    return final


def checkpoints(out: Path) -> list[Path]:
    """The run's complete checkpoints, oldest first."""
    return sorted((out / CHECKPOINTS).glob("step-*"), key=lambda p: int(p.name.split("-")[1]))


def latest_checkpoint(out: Path) -> Path | None:
    found = checkpoints(out)
    return found[-1] if found else None


def discard_checkpoints_after(out: Path, step: int) -> None:
    """On a resume from step N, the checkpoints after N belong to the abandoned continuation (like its metrics)."""
    for later in checkpoints(out):
        if int(later.name.split("-")[1]) > step:
            shutil.rmtree(later)


def prune_checkpoints(out: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest checkpoints (``keep`` = 0: delete none)."""
    for old in checkpoints(out)[:-keep] if keep else []:
        shutil.rmtree(old)


def load_state(checkpoint: Path) -> dict:
    """The trainer state of a checkpoint (our own file: RNG states hold numpy objects, hence ``weights_only=False``)."""
    return torch.load(checkpoint / STATE, map_location="cpu", weights_only=False)


def load_optimizer(checkpoint: Path, optimizer: torch.optim.Optimizer) -> None:
    optimizer.load_state_dict(torch.load(checkpoint / OPTIMIZER, map_location="cpu", weights_only=False))


class MetricsLog:
    """One JSON line per record in ``out/metrics.jsonl`` (rewritten from ``records`` on a resume, so steps after the
    checkpoint that a killed run had logged disappear), mirrored to TensorBoard under ``out/tb`` when asked."""

    def __init__(self, out: Path, records: list[dict], tensorboard: bool):
        self.records = list(records)
        self.path = out / METRICS
        with self.path.open("w") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in self.records)
        self.writer = _tensorboard_writer(out / "tb") if tensorboard else None

    def write(self, record: dict) -> None:
        self.records.append(record)
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.writer.add_scalar(key, value, record["step"])
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _tensorboard_writer(directory: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print("deltattg train: run.tensorboard is on but the tensorboard package is missing; logging to JSONL only",
              file=sys.stderr)  # fmt: skip
        return None
    return SummaryWriter(str(directory))


def read_metrics(out: str | Path) -> list[dict]:
    path = Path(out) / METRICS
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
