"""Training the regression meter on recorded trajectories (labels of Eq. 1–2 at every decision boundary).

Two regimes:
  * ``freeze_backbone=True`` (the CPU default): the backbone reads every training trajectory ONCE (one pass per
    window, all boundaries at once), the features are cached in ``output_dir/features.pt``, and only the head is
    trained, for many epochs, in seconds;
  * ``freeze_backbone=False``: backbone and head train together (E.6: lr 1e-5 backbone / 1e-4 head, cosine schedule,
    5% warm-up, effective batch 32), resumable from ``output_dir/checkpoint-N``.
Loss: BCE on the completion logit + smooth-L1 on log1p(TTG) over completable states (:func:`progress_loss`), or on
the final score at every state for a ``target="score"`` meter (:func:`score_loss`).
"""

from __future__ import annotations

import json
import math
import random
import re
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
import torch
from tqdm import tqdm

from deltattg.data.labels import StateLabel, outcome_label, remaining_sums
from deltattg.data.trajectory import Trajectory
from deltattg.meter.features import FEATURES_NAME, cached_features
from deltattg.meter.regression import RegressionMeter, Window, head_members, meter_loss
from deltattg.settings import setting


@dataclass(frozen=True)
class Example:
    """A decision-state reading to learn: its window, the index of the read within it, and the labels (Eq. 2, or a
    ``--labels`` source's): the completion target (1/0, or a soft rate in [0, 1]), the Token-to-Go where one is
    known (``has_ttg``), and the final score for a score meter."""

    window: int
    read: int
    can_complete: float
    tokens_to_go: float
    score: float = 0.0
    has_ttg: bool | None = None  # None: where the state is completable (can_complete ≥ 0.5)

    @property
    def ttg_known(self) -> bool:
        return self.can_complete >= 0.5 if self.has_ttg is None else self.has_ttg


@dataclass(frozen=True)
class RegressionTrainConfig:
    output_dir: str
    freeze_backbone: bool = True
    epochs: int = setting(1, "epochs over the data when the backbone trains")
    head_epochs: int = setting(40, "regression, frozen backbone: head epochs")
    batch_size: int = setting(32, "examples per optimizer step")
    lr_backbone: float = 1e-5
    lr_head: float = 1e-4
    lr_head_frozen: float = 1e-3
    warmup_ratio: float = 0.05
    weight_decay: float = 0.01
    regression_weight: float = 1.0
    delta_weight: float = setting(0.0, "regression, backbone trained: weight of the step-change loss — smooth-L1 "
                                  "between the predicted and the target change of Token-to-Go from each decision "
                                  "state to the next (the Δ DeltaTTG's credit reads, Eq. 8), in units of the batch's "
                                  "mean absolute change; 0 = off")
    save_every: int = 200
    seed: int = setting(0, "seed of the head's initialisation and the example order")
    progress: bool = True


def trajectory_examples(
    meter: RegressionMeter,
    messages: Sequence[dict],
    success: bool,
    step_tokens: Sequence[int],
    first_window: int,
    reward: float | None = None,
    labels: Sequence[StateLabel] | None = None,
) -> tuple[list[Window], list[Example]]:
    """Windows of one trajectory and an example per decision state t = 0..T: b = success, v = TTG_t (0 at T), score =
    ``reward`` (default: 1 on success, else 0) — or, with ``labels`` (one per state s_0..s_T, from
    ``rollout.label_sources``), each state's own completion target and Token-to-Go."""
    windows = meter.windows(messages)
    if labels is None:
        labels = [outcome_label(success, ttg) for ttg in remaining_sums(step_tokens)]
    score = float(success) if reward is None else float(reward)
    examples = [
        Example(first_window + w, r, labels[t].target, labels[t].tokens_to_go or 0.0, score,
                labels[t].tokens_to_go is not None)
        for w, window in enumerate(windows)
        for r, t in enumerate(window.steps)
    ]
    return windows, examples


def records_examples(meter: RegressionMeter, trajectories: Sequence[Trajectory],
                     labels: dict[str, Sequence[StateLabel]] | None = None) -> tuple[list[Window], list[Example]]:
    """``trajectory_examples`` over trajectory records, their windows numbered in order (``labels`` by trajectory id
    where a label source made them)."""
    windows: list[Window] = []
    examples: list[Example] = []
    for t in trajectories:
        w, e = trajectory_examples(meter, t.messages or [], t.success, t.step_tokens or [], len(windows), t.reward,
                                   None if labels is None else labels[t.id])  # fmt: skip
        windows += w
        examples += e
    return windows, examples


def _targets(examples: Sequence[Example], target: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(completion target, value, where the value is known) of each example: value = TTG, or the final score for a
    score meter."""
    return (
        torch.tensor([float(e.can_complete) for e in examples]),
        torch.tensor([e.score if target == "score" else e.tokens_to_go for e in examples]),
        torch.tensor([e.ttg_known for e in examples], dtype=torch.bool),
    )


def _cosine_warmup(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / max(warmup, 1)
    progress = (step - warmup) / max(total - warmup, 1)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def _row_of(windows: Sequence[Window], examples: Sequence[Example]) -> list[int]:
    """Index of each example's read position in the flattened feature matrix."""
    offsets = [0]
    for window in windows:
        offsets.append(offsets[-1] + len(window.positions))
    return [offsets[e.window] + e.read for e in examples]


def consecutive_pairs(windows: Sequence[Window], examples: Sequence[Example]) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (first, second) into ``examples`` of every two consecutive decision states t and t+1 read in the same
    window (:func:`step_pairs`' pairs, by example)."""
    at = {(e.window, e.read): k for k, e in enumerate(examples)}
    first, second = [], []
    for (w, r), k in at.items():
        following = at.get((w, r + 1))
        if following is not None and windows[w].steps[r + 1] == windows[w].steps[r] + 1:
            first.append(k)
            second.append(following)
    return torch.tensor(first, dtype=torch.long), torch.tensor(second, dtype=torch.long)


def train_head_on_features(meter: RegressionMeter, features: torch.Tensor, examples: Sequence[Example], rows: Sequence[int],
                           config: RegressionTrainConfig, head: torch.nn.Module | None = None,
                           pairs: tuple[torch.Tensor, torch.Tensor] | None = None) -> list[float]:
    """Train only ``head`` (default: the meter's head) on cached features, batches shuffled by ``config.seed``;
    returns the loss of each epoch. With ``config.delta_weight`` and consecutive ``pairs`` of examples
    (:func:`consecutive_pairs`), each batch adds the step-change loss over as many pairs drawn at random."""
    head = meter.head if head is None else head
    target = meter.config.target
    can, value, known = _targets(examples, target)
    x = features[list(rows)]
    generator = torch.Generator().manual_seed(config.seed)
    if not config.delta_weight or (pairs is not None and len(pairs[0]) == 0):
        pairs = None
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.lr_head_frozen, weight_decay=config.weight_decay)
    total = config.head_epochs * math.ceil(len(examples) / config.batch_size)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _cosine_warmup(s, total, int(config.warmup_ratio * total)))
    head.train()
    losses = []
    for _ in tqdm(range(config.head_epochs), desc="head epochs", disable=not config.progress):
        order = torch.randperm(len(examples), generator=generator)
        epoch_loss = 0.0
        for start in range(0, len(order), config.batch_size):
            batch = order[start : start + config.batch_size]
            loss = meter_loss(target, head(x[batch]), can[batch], value[batch], config.regression_weight, known[batch])
            if pairs is not None:
                drawn = torch.randint(len(pairs[0]), (len(batch),), generator=generator)
                both = torch.cat([pairs[0][drawn], pairs[1][drawn]])
                ends = torch.arange(len(batch))
                steps = step_change_loss(head(x[both])[:, 1], value[both], known[both], ends, ends + len(batch))
                loss = loss + config.delta_weight * steps
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            epoch_loss += loss.item() * len(batch)
        losses.append(epoch_loss / max(len(examples), 1))
    head.eval()
    return losses


def step_pairs(windows: Sequence[Window]) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (first, second) into the reads of ``windows`` taken in order (as ``boundary_features`` returns them)
    of every two consecutive decision states t and t+1 read in the same window."""
    first, offset = [], 0
    for window in windows:
        first += [offset + r for r in range(len(window.steps) - 1) if window.steps[r + 1] == window.steps[r] + 1]
        offset += len(window.steps)
    index = torch.tensor(first, dtype=torch.long)
    return index, index + 1


def step_change_loss(values: torch.Tensor, tokens_to_go: torch.Tensor, known: torch.Tensor, first: torch.Tensor,
                     second: torch.Tensor) -> torch.Tensor:
    """Smooth-L1 between the predicted and the target change of Token-to-Go, v_t − v_{t+1}, over the consecutive
    pairs (``first``, ``second``) whose Token-to-Go is ``known`` at both ends; ``values`` are the head's log1p
    readings. Both changes are divided by the pairs' mean absolute target change, so the loss reads in units of a
    typical step whatever the tokenizer (0 where no pair is known)."""
    both = known[first] & known[second]
    if not both.any():
        return values.sum() * 0.0
    a, b = first[both], second[both]
    predicted = torch.expm1(values[a].clamp(max=20.0)) - torch.expm1(values[b].clamp(max=20.0))
    target = (tokens_to_go[a] - tokens_to_go[b]).float()
    unit = target.abs().mean().clamp(min=1.0)
    return torch.nn.functional.smooth_l1_loss(predicted / unit, target / unit)


def train_end_to_end(meter: RegressionMeter, windows: Sequence[Window], examples: Sequence[Example], config: RegressionTrainConfig) -> list[float]:
    """Backbone + head together, windows in mini-batches; checkpoints every ``save_every`` steps and resumes."""
    output = Path(config.output_dir)
    example_at = {(e.window, e.read): e for e in examples}
    window_ids = sorted({e.window for e in examples})
    steps_per_epoch = math.ceil(len(window_ids) / config.batch_size)
    total = config.epochs * steps_per_epoch
    optimizer = torch.optim.AdamW(
        [
            {"params": meter.backbone.parameters(), "lr": config.lr_backbone},
            {"params": meter.head.parameters(), "lr": config.lr_head},
        ],
        weight_decay=config.weight_decay,
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _cosine_warmup(s, total, int(config.warmup_ratio * total)))
    step = _resume(meter, optimizer, schedule, output)
    rng = random.Random(config.seed)
    losses = []
    meter.train()
    bar = tqdm(total=total, initial=step, desc="meter training", disable=not config.progress)
    for epoch in range(config.epochs):
        order = window_ids[:]
        rng.shuffle(order)
        for k in range(steps_per_epoch):
            global_step = epoch * steps_per_epoch + k
            if global_step < step:
                continue
            batch = [windows[w] for w in order[k * config.batch_size : (k + 1) * config.batch_size]]
            ids = order[k * config.batch_size : (k + 1) * config.batch_size]
            # boundary_features returns the reads window by window, in order: the targets follow the same order.
            targets = [example_at[(w, r)] for w, window in zip(ids, batch) for r in range(len(window.positions))]
            can, value, known = _targets(targets, meter.config.target)
            features = meter.boundary_features(batch)
            members = head_members(meter.head)  # an ensemble: each head learns the targets, the mean loss steps
            outputs = [head(features) for head in members]
            loss = sum(meter_loss(meter.config.target, out, can, value, config.regression_weight, known)
                       for out in outputs) / len(members)  # fmt: skip
            if config.delta_weight:
                first, second = step_pairs(batch)
                loss = loss + config.delta_weight * sum(step_change_loss(out[:, 1], value, known, first, second)
                                                        for out in outputs) / len(members)  # fmt: skip
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(meter.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.4f}")
            if (global_step + 1) % config.save_every == 0:
                _checkpoint(meter, optimizer, schedule, output, global_step + 1)
    bar.close()
    meter.eval()
    return losses


def _checkpoint(meter, optimizer, schedule, output: Path, step: int) -> None:
    """``checkpoint-N``: the meter (``save_pretrained``) and the trainer state, written to a temporary folder and
    renamed into place, so a run killed mid-write never leaves a checkpoint that looks complete."""
    folder = output / f"checkpoint-{step}"
    partial = output / f".checkpoint-{step}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    meter.save_pretrained(partial)
    torch.save({"step": step, "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
                "rng": torch.get_rng_state()}, partial / "trainer_state.pt")
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)


CHECKPOINT_FOLDER = re.compile(r"checkpoint-(\d+)")


def checkpoint_folders(output: Path) -> list[Path]:
    """The ``checkpoint-N`` folders of ``output``, oldest first (other names, e.g. ``checkpoint-notes``, ignored)."""
    found = [(int(m.group(1)), p) for p in output.glob("checkpoint-*")
             if p.is_dir() and (m := CHECKPOINT_FOLDER.fullmatch(p.name))]  # fmt: skip
    return [p for _, p in sorted(found)]


def _resume(meter, optimizer, schedule, output: Path) -> int:
    """Load the latest ``checkpoint-N`` of ``output`` if any; return the step to continue from. The trainer state is
    loaded weights-only (it never runs code); a corrupt or foreign one raises ``CheckpointError`` naming the file."""
    from deltattg.data.pt_files import CheckpointError, first_sentence, safe_load

    checkpoints = checkpoint_folders(output)
    if not checkpoints:
        return 0
    latest = checkpoints[-1]
    state = safe_load(latest / "trainer_state.pt")
    if not isinstance(state, dict) or not {"step", "optimizer", "schedule", "rng"} <= set(state):
        raise CheckpointError("not a meter trainer state (needs step, optimizer, schedule, rng)",
                              path=str(latest / "trainer_state.pt"))  # fmt: skip
    try:
        loaded = RegressionMeter.from_pretrained(latest)
        meter.backbone.load_state_dict(loaded.backbone.state_dict())
        meter.head.load_state_dict(loaded.head.state_dict())
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        torch.set_rng_state(state["rng"])
    except CheckpointError:
        raise
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"cannot resume from this checkpoint ({first_sentence(exc)}); delete it to resume from "
                              "an earlier one", path=str(latest)) from None  # fmt: skip
    return int(state["step"])


def portable_spec(spec: str, folder: Path) -> str:
    """The backbone spec to store in ``folder``'s ``meter_config.json`` so the meter loads from any working directory:
    a local path becomes relative to the meter folder when it lies inside it, else absolute; an HF id or a named spec
    (``smollm2``) is kept as it is."""
    from deltattg.hf import SMOLLM2

    if spec == SMOLLM2:
        return spec
    local, sep, gguf = spec.partition("::")
    if not local or not Path(local).expanduser().exists():
        return spec
    resolved = Path(local).expanduser().resolve()
    if not sep:  # from_pretrained reads a plain path relative to the meter folder first
        try:
            return resolved.relative_to(folder.resolve()).as_posix()
        except ValueError:
            pass
    return f"{resolved}{sep}{gguf}"


def train_regression_meter(
    meter: RegressionMeter, windows: Sequence[Window], examples: Sequence[Example], config: RegressionTrainConfig
) -> dict:
    """Train ``meter`` in place and save it to ``config.output_dir``; returns a small training report.

    Head k of the meter (k = 0 for a single head, 0..N−1 for an ensemble) is initialised and, on frozen features,
    shuffled from seed ``config.seed + k``: an ensemble's heads are the single heads of seeds seed..seed+N−1. The
    report's ``losses`` are the first head's (``head_losses`` has every head's)."""
    if config.delta_weight and (config.freeze_backbone or meter.config.target != "ttg"):
        raise ValueError("delta_weight trains the step change of Token-to-Go with the backbone: it needs "
                         "freeze_backbone off and the ttg target")
    torch.manual_seed(config.seed)
    output = Path(config.output_dir)
    members = head_members(meter.head)
    for k, head in enumerate(members):
        head.reset(config.seed + k)
    head_losses: list[list[float]] = []
    if config.freeze_backbone:
        for p in meter.backbone.parameters():
            p.requires_grad_(False)
        features = cached_features(meter, windows, output / FEATURES_NAME, config.progress)
        rows = _row_of(windows, examples)
        head_losses = [train_head_on_features(meter, features, examples, rows, replace(config, seed=config.seed + k), head)
                       for k, head in enumerate(members)]  # fmt: skip
        losses = head_losses[0]
    else:
        losses = train_end_to_end(meter, windows, examples, config)
    if config.freeze_backbone:  # the backbone is stored by its spec: make a local path work from anywhere
        meter.config = replace(meter.config, backbone=portable_spec(meter.config.backbone, output))
    meter.save_pretrained(output, include_backbone=not config.freeze_backbone)
    report = {"examples": len(examples), "windows": len(windows), "final_loss": losses[-1] if losses else None,
              "losses": losses, "config": asdict(config)}
    if len(head_losses) > 1:
        report["head_losses"] = head_losses
    (output / "train_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


class OnPolicyRefresh:
    """On-policy refresh of a regression meter (ours, beyond the paper, which freezes the meter): every call trains
    the meter's head for ``epochs`` on the decision states of the actor's own latest rollouts, labelled by their
    outcomes and token counts (Eq. 1–2: the labels are free) or by labels given (the current actor's best-of-k
    completions: AgentPRM's loop), so that the meter follows the states the policy now visits. The backbone stays as
    it is (its features are read without gradients); each refresh is a short fine-tune of its own
    (``train_head_on_features``: AdamW at ``lr``, batches shuffled from ``seed``, the step-change loss at
    ``delta_weight``)."""

    def __init__(self, meter: RegressionMeter, *, lr: float = 1e-4, epochs: int = 1, batch_size: int = 32,
                 delta_weight: float = 0.0):
        self.meter = meter
        self.lr = lr
        self.epochs = epochs
        self.batch_size = batch_size
        self.delta_weight = delta_weight  # the step-change loss's weight, as the meter's own training has it
        if delta_weight and meter.config.target != "ttg":
            raise ValueError(f"the step-change loss trains Token-to-Go; this meter predicts {meter.config.target!r}")

    def update(self, trajectories: Sequence[Trajectory], seed: int,
               labels: dict[str, Sequence[StateLabel]] | None = None) -> dict[str, float]:
        """One refresh on ``trajectories`` (records with messages, success and step_tokens), labelled by ``labels``
        (by trajectory id) where given, else by their outcomes; returns the last epoch's loss as
        ``meter/refresh_loss`` and the states it read as ``meter/refresh_states``."""
        windows, examples = records_examples(self.meter, trajectories, labels)
        if not examples:
            return {}
        with torch.no_grad():
            features = self.meter.boundary_features(windows)
        config = RegressionTrainConfig(output_dir="", head_epochs=self.epochs, batch_size=self.batch_size,
                                       lr_head_frozen=self.lr, seed=seed, progress=False,
                                       delta_weight=self.delta_weight)  # fmt: skip
        losses = train_head_on_features(self.meter, features, examples, _row_of(windows, examples), config,
                                        pairs=consecutive_pairs(windows, examples))  # fmt: skip
        self.meter.weights_changed()
        return {"meter/refresh_loss": losses[-1], "meter/refresh_states": float(len(examples))}
