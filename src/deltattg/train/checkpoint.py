"""Runs you can resume exactly: checkpoints (actor via ``save_pretrained``, optimizer, RNG states, task-sampler position,
counters, metrics so far), written atomically; and the metrics log (``metrics.jsonl``, optional TensorBoard).

Safety: every ``.pt`` file is read with ``torch.load(weights_only=True)`` (:func:`deltattg.data.pt_files.safe_load`),
so a checkpoint holds tensors and plain data only and loading one never runs code; the RNG states are stored in that
form too. A run folder
belongs to one run: ``run.json`` records its identity (a random id and the hash of its starting config) and every
checkpoint carries the id, so a resume cannot splice in another run's checkpoint.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from deltattg.data.pt_files import CheckpointError, first_sentence, safe_load
from deltattg.errors import InputError
from deltattg.hf import save_model

CHECKPOINTS = "checkpoints"
ACTOR = "actor"
OPTIMIZER = "optimizer.pt"
STATE = "trainer_state.pt"
METRICS = "metrics.jsonl"
LOCK = ".lock"  # held while a process writes the run (:func:`run_lock`)
CONFIG = "config.yaml"
RUN = "run.json"
RUN_FILES = (CONFIG, RUN, METRICS, CHECKPOINTS)  # any of them: the folder holds a run
CLEARED = (*RUN_FILES, "tb")  # what --overwrite removes (other files in the folder are left alone)
STATE_FIELDS = ("step", "generated_tokens", "metrics", "sampler", "rng", "run_id")
STEP_FOLDER = re.compile(r"step-(\d+)")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """Every RNG stream as tensors, ints and lists (what ``weights_only`` loading accepts; no numpy objects)."""
    version, keys, gauss = random.getstate()
    name, np_keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    state: dict[str, Any] = {
        "python": {"version": int(version), "keys": [int(k) for k in keys], "gauss": gauss},
        "numpy": {"name": str(name), "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(cached)},  # fmt: skip
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    python, numpy = state["python"], state["numpy"]
    random.setstate((python["version"], tuple(python["keys"]), python["gauss"]))
    np.random.set_state((numpy["name"], numpy["keys"].numpy().astype(np.uint32), numpy["pos"], numpy["has_gauss"],
                         numpy["gauss"]))  # fmt: skip
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
    save_model(model, tokenizer, partial / ACTOR)
    torch.save(optimizer.state_dict(), partial / OPTIMIZER)
    plain = {**state, "metrics": json.loads(json.dumps(state["metrics"]))}  # plain floats, whatever the records held
    torch.save({**plain, "rng": rng_state()}, partial / STATE)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(partial, final)
    return final


def checkpoint_step(path: Path) -> int | None:
    """N of a ``step-N`` folder; ``None`` for anything else (notes, partial writes, stray files)."""
    match = STEP_FOLDER.fullmatch(path.name)
    return int(match.group(1)) if match and path.is_dir() else None


def checkpoints(out: Path) -> list[Path]:
    """The run's checkpoint folders (``checkpoints/step-N``), oldest first; anything else there is ignored."""
    folder = out / CHECKPOINTS
    found = [p for p in folder.iterdir() if checkpoint_step(p) is not None] if folder.is_dir() else []
    return sorted(found, key=lambda p: checkpoint_step(p))  # type: ignore[arg-type,return-value]


def latest_checkpoint(out: Path) -> Path | None:
    found = checkpoints(out)
    return found[-1] if found else None


def discard_checkpoints_after(out: Path, step: int) -> None:
    """On a resume from step N, the checkpoints after N belong to the abandoned continuation (like its metrics)."""
    for later in checkpoints(out):
        if checkpoint_step(later) > step:  # type: ignore[operator]
            shutil.rmtree(later)


def prune_checkpoints(out: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest checkpoints (``keep`` = 0: delete none)."""
    for old in checkpoints(out)[:-keep] if keep else []:
        shutil.rmtree(old)


def load_state(checkpoint: Path) -> dict:
    """The trainer state of a checkpoint, loaded weights-only and checked for the fields a resume reads."""
    state = safe_load(checkpoint / STATE)
    missing = [f for f in STATE_FIELDS if not isinstance(state, dict) or f not in state]
    if missing:
        raise CheckpointError(f"not a trainer state of this deltattg version (missing {', '.join(missing)})",
                              path=str(checkpoint / STATE))  # fmt: skip
    return state


def load_optimizer_state(checkpoint: Path) -> dict:
    state = safe_load(checkpoint / OPTIMIZER)
    if not isinstance(state, dict) or not {"state", "param_groups"} <= set(state):
        raise CheckpointError("not an optimizer state", path=str(checkpoint / OPTIMIZER))
    return state


def load_optimizer(checkpoint: Path, optimizer: torch.optim.Optimizer) -> None:
    optimizer.load_state_dict(load_optimizer_state(checkpoint))


def check_actor(checkpoint: Path) -> None:
    """The saved actor is there and its files are intact enough to load: a config (model or LoRA adapter) that parses
    and safetensors files whose headers match their sizes. Raises :class:`CheckpointError` naming the bad file."""
    folder = checkpoint / ACTOR
    if not folder.is_dir():
        raise CheckpointError(f"not a checkpoint folder (no {ACTOR}/ inside)", path=str(checkpoint))
    configs = [folder / name for name in ("config.json", "adapter_config.json") if (folder / name).is_file()]
    weights = sorted(folder.glob("*.safetensors"))
    if not configs or not weights:
        raise CheckpointError("incomplete actor (no config or no .safetensors weights)", path=str(folder))
    for path in configs:
        try:
            json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"corrupt actor config ({exc})", path=str(path)) from None
    from safetensors import safe_open

    for path in weights:
        try:
            with safe_open(str(path), framework="pt") as handle:
                handle.keys()
        except Exception as exc:  # safetensors checks the header and that the data fits the file
            raise CheckpointError(f"corrupt actor weights ({first_sentence(exc)})", path=str(path)) from None


class Checkpoint:
    """A checkpoint read for a resume: its folder, trainer state and optimizer state (all checked)."""

    def __init__(self, path: Path):
        check_actor(path)
        self.path = path
        self.state = load_state(path)
        self.optimizer = load_optimizer_state(path)


def read_checkpoint(out: Path, resume: str | Path) -> Checkpoint | None:
    """The checkpoint to resume from: ``"latest"`` (the newest; ``None`` when the run has none), ``"latest-valid"``
    (the newest that loads; corrupt newer ones are skipped with a note) or a checkpoint folder. A corrupt one is a
    :class:`CheckpointError` naming the file."""
    if str(resume) not in ("latest", "latest-valid"):
        return Checkpoint(Path(resume))
    found = checkpoints(out)
    if not found:
        return None
    if str(resume) == "latest":
        try:
            return Checkpoint(found[-1])
        except CheckpointError as exc:
            hint = " (or --resume latest-valid to continue from the newest intact checkpoint)" if len(found) > 1 else ""
            raise CheckpointError(f"{exc.message}; the latest checkpoint {found[-1]} cannot be resumed from{hint}",
                                  path=exc.path) from None  # fmt: skip
    for path in reversed(found):
        try:
            return Checkpoint(path)
        except CheckpointError as exc:
            print(f"deltattg train: skipping the corrupt checkpoint {path}: {exc}", file=sys.stderr)
    raise CheckpointError("no intact checkpoint to resume from (every one failed to load, see above)",
                          path=str(out / CHECKPOINTS))  # fmt: skip


# ---- run identity ------------------------------------------------------------------------------------------------------
def config_hash(config_text: str) -> str:
    return hashlib.sha256(config_text.encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def code_revision() -> str | None:
    """The git commit of the deltattg source this process runs, ``COMMIT+dirty.DIFF`` (DIFF: 12 hex digits of the
    SHA-256 of ``git diff HEAD`` and of the files git does not track and does not ignore, names and contents) when the
    working tree differs from it, or ``None`` when the package is not imported from a git checkout (an installed
    wheel: :data:`deltattg.__version__` names it then)."""
    root = Path(__file__).resolve().parents[3]  # <root>/src/deltattg/train/checkpoint.py

    def git(*args: str) -> bytes | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top.decode().strip()).resolve() != root:
        return None  # not this package's own checkout (an installed copy inside some other repository)
    head, diff = git("rev-parse", "HEAD"), git("diff", "HEAD", "--no-ext-diff", "--binary")
    untracked = git("ls-files", "--others", "--exclude-standard", "-z")
    if head is None or diff is None or untracked is None:
        return None
    digest = hashlib.sha256(diff)
    for name in sorted(n for n in untracked.split(b"\0") if n):
        digest.update(b"\0" + name + b"\0")
        try:
            digest.update((root / name.decode("utf-8", "surrogateescape")).read_bytes())
        except OSError:
            pass  # gone or unreadable: its name alone marks the tree as changed
    commit = head.decode().strip()
    return f"{commit}+dirty.{digest.hexdigest()[:12]}" if diff or untracked.strip(b"\0") else commit


def holds_run(out: Path) -> bool:
    return any((out / name).exists() for name in RUN_FILES)


def read_run(out: Path) -> dict | None:
    """``run.json`` of a run folder (``None`` when absent)."""
    path = out / RUN
    if not path.is_file():
        return None
    try:
        run = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"corrupt run identity file ({exc})", path=str(path)) from None
    if not isinstance(run, dict) or not isinstance(run.get("run_id"), str):
        raise CheckpointError("corrupt run identity file (no run_id)", path=str(path))
    return run


def check_fresh_folder(out: Path, overwrite: bool) -> None:
    """A fresh run goes into an empty folder, or one it may clear (``overwrite``); never on top of another run."""
    if holds_run(out) and not overwrite:
        held = ", ".join(name for name in RUN_FILES if (out / name).exists())
        raise CheckpointError(f"already holds a run ({held}); continue it with --resume, or start over with "
                              f"--overwrite (deletes that run's files)", path=str(out))  # fmt: skip


def check_belongs(checkpoint: Checkpoint, out: Path) -> None:
    """The checkpoint was written by the run whose folder is ``out`` (same run id as ``out/run.json``)."""
    run = read_run(out)
    theirs = checkpoint.state.get("run_id")
    if run is None:
        raise CheckpointError(f"has no run identity ({RUN}), so checkpoint {checkpoint.path} cannot be checked to "
                              f"belong to it; start a fresh run in another folder", path=str(out))  # fmt: skip
    if theirs != run["run_id"]:
        raise CheckpointError(f"belongs to run {theirs}, not to the run in {out} (run {run['run_id']}); a run folder "
                              f"resumes only its own checkpoints", path=str(checkpoint.path))  # fmt: skip


@contextmanager
def run_lock(out: Path) -> Iterator[None]:
    """Hold ``out/.lock`` exclusively (``flock``) while this process writes the run in ``out``. A second process
    pointed at the same folder — a second trainer, a benchmark started twice, a worker left running by a killed
    parent — stops with a :class:`CheckpointError` naming the holder before it touches a file, instead of clearing the
    first run's files or interleaving two runs' metrics. The OS drops the lock when the process ends, however it ends.
    A folder this call created and no run was written to is removed again."""
    import fcntl

    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            raise CheckpointError(f"is in use by another run (process {holder}); wait for it to end, or stop it, "
                                  "before writing to this folder", path=str(out)) from None  # fmt: skip
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            if created and not holds_run(out):
                path.unlink(missing_ok=True)
                if not any(out.iterdir()):
                    out.rmdir()


def start_run(out: Path, config_text: str, *, overwrite: bool, run: dict | None = None) -> dict:
    """Write the run's identity and ``config.yaml`` (after clearing the old run's files with ``overwrite``). ``run``:
    the identity to keep (a resume); a fresh run gets a new random id."""
    if overwrite:
        for name in CLEARED:
            path = out / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
    out.mkdir(parents=True, exist_ok=True)
    if run is None:
        run = {"run_id": uuid.uuid4().hex, "config_sha256": config_hash(config_text), "code": code_revision()}
        partial = out / f".{RUN}.partial"
        partial.write_text(json.dumps(run, indent=2) + "\n")
        os.replace(partial, out / RUN)
    (out / CONFIG).write_text(config_text)
    return run


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
    """A run's metrics records (none when it has not logged yet). A line that is not a JSON record, or a step that
    does not follow the one before it (two processes wrote the file at once: a run's steps only increase, a resume
    rewrites the file), raises :class:`~deltattg.errors.InputError` naming the file and line."""
    path = Path(out) / METRICS
    if not path.exists():
        return []
    records: list[dict] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise InputError(f"not a JSON record ({exc})", path=str(path), line=number) from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise InputError("not a metrics record (an object with an integer step)", path=str(path), line=number)
        if records and record["step"] <= records[-1]["step"]:
            raise InputError(f"step {record['step']} after step {records[-1]['step']}: a run's steps only increase, "
                             "so two processes wrote this file at once; run it again", path=str(path), line=number)
        records.append(record)
    return records
