"""The regression progress meter (E.6 style): any HF causal-LM backbone plus a small head that predicts, at every
decision boundary, the completion logit and log1p(Token-to-Go).

Speed lever: a trajectory is serialized as blocks — block 0 is the task (every message before the first action),
block t ≥ 1 is action t−1 with the observations after it — each ending with the fixed marker :data:`BOUNDARY` and
tokenized separately, so the tokens of decision prefix h_t are exactly the first t+1 blocks. Under causal attention
the hidden state at the last token of block t depends on h_t only, so ONE forward pass over the trajectory reads all
T+1 decision states (the terminal one included), and equals scoring each prefix on its own.

Trajectories longer than ``max_length`` tokens are windowed: prefix t keeps the task block and the most recent blocks
that fit (oldest turns dropped first); consecutive prefixes that keep the same oldest block share one pass. A block
that alone cannot fit is clipped in its middle as a last resort. Each message is first capped at
``max_message_chars`` characters (middle elided), as the generative meter's prompt does.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from deltattg.data.trajectory import (
    MAX_MAGNITUDE,
    MAX_TOKENS_TO_GO,
    MeterOutput,
    assistant_indices,
    calibrated_probability,
)
from deltattg.hf import save_model
from deltattg.meter.features import cached_features
from deltattg.meter.prompt import serialize_message, shorten, turns_left_note
from deltattg.settings import setting

HEADER = (
    "Interaction history of an AI agent working on a task. At each '### next action' the progress meter estimates "
    "whether the agent will complete the task and how many more tokens it will generate.\n\n"
)
BOUNDARY = "\n### next action"
REGRESSION_FORMAT_VERSION = 1
CONFIG_NAME = "meter_config.json"
POOLINGS = ("last", "last+mean")
TARGETS = ("ttg", "score")
HEAD_NAME = "head.pt"
BACKBONE_DIR = "backbone"  # the folder of a meter saved with its backbone (meter_config.json: "backbone": "backbone")


@dataclass(frozen=True)
class RegressionConfig:
    backbone: str  # HF id/path or model spec of the backbone (see deltattg.hf)
    max_length: int = setting(2048, "token budget of one meter input (regression window / generative prompt)")
    max_message_chars: int = setting(2000, "regression: cap each message at this many characters (middle elided)")
    head_hidden: int = 256
    max_batch_tokens: int = 8192
    pooling: str = setting("last", "regression: features of a decision state: the boundary token's hidden state "
                           "(last), or also the mean over its last block (last+mean)")
    target: str = setting("ttg", "regression: what the value head predicts: ttg = log1p(Token-to-Go) of completable "
                          "states (the DeltaTTG meter), score = the trajectory's final reward at every state (an "
                          "outcome-score meter, read by --method value, E.4)")
    ensemble: int = setting(1, "regression: train N heads (seeds --seed .. --seed+N-1) on the same features; a "
                            "reading averages their completion probabilities and Token-to-Go")
    layer: int | None = setting(None, "regression: read the output of this decoder layer of the backbone (1..its "
                                "layer count) instead of its final state")
    temperature: float = 1.0  # p̃ = σ(logit / temperature), fitted on held-out states (deltattg.meter.fit)
    turn_limit: int | None = None  # the episodes' turn limit: each decision state is marked with the turns left
    labels: dict | None = None  # the label source it was trained on (``rollout.label_sources.LabelSettings``)
    kind: str = "regression"
    format_version: int = REGRESSION_FORMAT_VERSION


def decision_blocks(messages: Sequence[dict], max_message_chars: int, turn_limit: int | None = None) -> list[str]:
    """T+1 text blocks; the first t+1 of them serialize decision prefix h_t (t = 0..T, T = terminal). With a
    ``turn_limit``, block t's boundary marker states the turns left at h_t (:func:`turns_left_note`)."""
    cuts = [0, *assistant_indices(list(messages)), len(messages)]
    blocks = []
    for k in range(len(cuts) - 1):
        text = "\n\n".join(shorten(serialize_message(m), max_message_chars) for m in messages[cuts[k] : cuts[k + 1]])
        note = "" if turn_limit is None else f" ({turns_left_note(turn_limit - k)})"
        blocks.append((HEADER if k == 0 else "\n\n") + text + BOUNDARY + note)
    return blocks


def encode_blocks(blocks: Sequence[str], tokenizer: Any) -> list[list[int]]:
    """Token ids of each block, tokenized separately (so block boundaries never merge); BOS before block 0."""
    encoded = tokenizer(list(blocks), add_special_tokens=False)["input_ids"]
    if tokenizer.bos_token_id is not None:
        encoded[0] = [tokenizer.bos_token_id, *encoded[0]]
    return [list(ids) for ids in encoded]


def clip_middle(ids: list[int], budget: int, keep_tail: int = 16) -> list[int]:
    """``ids`` cut to ``budget`` tokens by removing the middle; the tail (with the boundary marker) is kept."""
    if len(ids) <= budget:
        return ids
    tail = min(keep_tail, budget // 2)
    return ids[: budget - tail] + ids[len(ids) - tail :]


@dataclass
class Window:
    """One forward pass: token ids and, for each decision state read in it, its position, its step t and where its
    last block starts (the block of the latest action and observations, or the task block for t = 0)."""

    ids: list[int]
    positions: list[int]
    steps: list[int]
    starts: list[int]


def oldest_kept_block(lengths: Sequence[int], t: int, max_length: int) -> int:
    """s(t): the smallest s ≥ 1 such that block 0 plus blocks s..t fit in ``max_length`` (t+1 when none does)."""
    total = lengths[0] + sum(lengths[1 : t + 1])
    s = 1
    while s <= t and total > max_length:
        total -= lengths[s]
        s += 1
    return s


def plan_windows(block_ids: Sequence[list[int]], max_length: int, steps: Sequence[int] | None = None) -> list[Window]:
    """The forward passes that read decision states ``steps`` (default: all t = 0..T) of one serialized trajectory.

    Prefix t is read on block 0 + blocks s(t)..t; consecutive prefixes with the same s(t) share a window.
    """
    lengths = [len(b) for b in block_ids]
    windows: list[Window] = []
    window: Window | None = None
    window_start = 0
    for t in sorted(set(range(len(block_ids)) if steps is None else steps)):
        start = min(oldest_kept_block(lengths, t, max_length), max(t, 1))  # block t itself is always kept
        if lengths[0] + sum(lengths[start : t + 1]) > max_length:  # block 0 (+ block t) alone overflow: clip
            head = clip_middle(block_ids[0], max_length if t == 0 else max_length // 2)
            ids = head if t == 0 else head + clip_middle(block_ids[t], max_length - len(head))
            windows.append(Window(ids, [len(ids) - 1], [t], [0 if t == 0 else len(head)]))
            window = None
            continue
        if window is None or start != window_start:
            window, window_start = Window(list(block_ids[0]), [], [], []), start
            windows.append(window)
            first_new = start
        else:
            first_new = window.steps[-1] + 1
        window.ids += [i for block in block_ids[max(first_new, 1) : t + 1] for i in block]
        window.positions.append(len(window.ids) - 1)
        window.steps.append(t)
        window.starts.append(0 if t == 0 else len(window.ids) - lengths[t])
    return windows


class ProgressHead(nn.Module):
    """Hidden state -> (completion logit, value): log1p Token-to-Go, or the final score for a ``score`` meter."""

    def __init__(self, hidden: int, width: int):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, width), nn.GELU(), nn.Linear(width, 2))

    def forward(self, features: Tensor) -> Tensor:
        return self.net(features)

    def reset(self, seed: int) -> None:
        """Re-initialise every parameter from ``seed`` (what ``--seed`` means for a head)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for module in self.net:
                if hasattr(module, "reset_parameters"):
                    module.reset_parameters()


class HeadEnsemble(nn.Module):
    """N :class:`ProgressHead` reading the same features; the output averages their readings and has a single head's
    format: completion logit = logit of the mean probability σ(logit_k), value = log1p of the mean Token-to-Go
    max(expm1(ŷ_k), 0) for a ``ttg`` meter, the mean predicted score for a ``score`` meter."""

    def __init__(self, heads: Sequence[ProgressHead], target: str = "ttg"):
        super().__init__()
        if not heads:
            raise ValueError("an ensemble needs at least one head")
        self.heads = nn.ModuleList(heads)
        self.target = target

    def forward(self, features: Tensor) -> Tensor:
        return average_readings(torch.stack([head(features) for head in self.heads]), self.target)


def average_readings(outputs: Tensor, target: str = "ttg") -> Tensor:
    """``[N, B, 2]`` head outputs -> ``[B, 2]``: the logit of the mean completion probability (computed in log space,
    exact for saturated heads) and the mean value (Token-to-Go averaged in tokens, clamped at 0 as a reading is)."""
    n = math.log(outputs.shape[0])
    logit = (torch.logsumexp(nn.functional.logsigmoid(outputs[..., 0]), 0) - n) - (
        torch.logsumexp(nn.functional.logsigmoid(-outputs[..., 0]), 0) - n)
    if target == "score":
        value = outputs[..., 1].mean(0)
    else:
        value = torch.log1p(torch.expm1(outputs[..., 1].clamp(max=40.0)).clamp(min=0.0).mean(0))
    return torch.stack([logit, value], dim=-1)


def head_members(head: nn.Module) -> list[ProgressHead]:
    """The heads that train: an ensemble's members, or the head itself."""
    return list(head.heads) if isinstance(head, HeadEnsemble) else [head]


def make_head(width: int, config: RegressionConfig) -> nn.Module:
    """A :class:`ProgressHead`, or a :class:`HeadEnsemble` of ``config.ensemble`` of them."""
    if config.ensemble == 1:
        return ProgressHead(width, config.head_hidden)
    return HeadEnsemble([ProgressHead(width, config.head_hidden) for _ in range(config.ensemble)], config.target)


def readings_from_head(outputs: Tensor, target: str = "ttg", temperature: float = 1.0) -> list[MeterOutput | None]:
    """``ttg``: b̂ = [logit > 0], v̂ = round(expm1(ŷ)) ≥ 0, the logit itself (E.4 +logit) and the calibrated
    probability p̃ = σ(logit / temperature); v̂ is kept where b̂ = 0 too (the head predicts the remaining work *if* the
    task completes). ``score``: the logit and the predicted final score S(h) (E.4 +value), no (b̂, v̂). A row with a
    NaN is an invalid reading (``None``, as an unparseable answer is); the others are clamped to what a record may
    hold (|logit|, |score| ≤ 10⁹, v̂ ≤ 10¹²), so every reading written can be read back."""
    out: list[MeterOutput | None] = []
    for logit, value in outputs.detach().float().cpu().tolist():
        if math.isnan(logit) or math.isnan(value):
            out.append(None)
            continue
        logit = min(max(logit, -MAX_MAGNITUDE), MAX_MAGNITUDE)
        if target == "score":
            out.append(MeterOutput(logit=logit, score=min(max(value, -MAX_MAGNITUDE), MAX_MAGNITUDE)))
            continue
        ttg = float(min(max(round(math.expm1(min(value, 40.0))), 0), MAX_TOKENS_TO_GO))
        out.append(MeterOutput(can_complete=logit > 0, tokens_to_go=ttg, logit=logit,
                               probability=calibrated_probability(logit, temperature)))  # fmt: skip
    return out



def progress_loss(outputs: Tensor, can_complete: Tensor, tokens_to_go: Tensor, regression_weight: float = 1.0,
                  known: Tensor | None = None) -> Tensor:
    """BCE of the completion logit against the completion target (1/0, or a soft rate) + smooth-L1 on log1p(TTG) over
    the states whose Token-to-Go is ``known`` (default: the completable ones) (E.6 style)."""
    bce = nn.functional.binary_cross_entropy_with_logits(outputs[:, 0], can_complete.float())
    known = can_complete.float() >= 0.5 if known is None else known
    if not known.any():
        return bce
    target = torch.log1p(tokens_to_go[known].float())
    return bce + regression_weight * nn.functional.smooth_l1_loss(outputs[known, 1], target)


def score_loss(outputs: Tensor, can_complete: Tensor, score: Tensor, regression_weight: float = 1.0) -> Tensor:
    """BCE on the completion logit + smooth-L1 on the final score at every state (E.6's Future-Score meter)."""
    bce = nn.functional.binary_cross_entropy_with_logits(outputs[:, 0], can_complete.float())
    return bce + regression_weight * nn.functional.smooth_l1_loss(outputs[:, 1], score.float())


def meter_loss(target: str, outputs: Tensor, can_complete: Tensor, value: Tensor, regression_weight: float,
               known: Tensor | None = None) -> Tensor:
    """The training loss of a ``target`` meter (``progress_loss``, the Token-to-Go ``known`` where given, or
    ``score_loss``)."""
    if target == "score":
        return score_loss(outputs, can_complete, value, regression_weight)
    return progress_loss(outputs, can_complete, value, regression_weight, known)


class RegressionMeter(nn.Module):
    """Backbone (HF ``AutoModel``) + :class:`ProgressHead`; implements the ``Meter`` protocol."""

    def __init__(self, backbone: nn.Module, tokenizer: Any, config: RegressionConfig, head: ProgressHead | None = None):
        super().__init__()
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.config = config
        if config.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {config.pooling!r}")
        if config.target not in TARGETS:
            raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {config.target!r}")
        if config.ensemble < 1:
            raise ValueError(f"ensemble must be at least 1, got {config.ensemble}")
        layers = backbone.config.num_hidden_layers
        if config.layer is not None and not 1 <= config.layer <= layers:
            raise ValueError(f"layer must be in 1..{layers} (the backbone's decoder layers), got {config.layer}")
        width = backbone.config.hidden_size * (2 if config.pooling == "last+mean" else 1)
        self.head = head or make_head(width, config)
        self._id: str | None = None
        # A file of the frozen backbone's window features (train-meter's ``features.pt`` format): when set, the
        # states read by ``score_trajectories`` take their features from it, computed and added there the first
        # time, so meters that differ only in their heads read a pool at the cost of their heads. Only for a
        # backbone that does not change (the cache is keyed by tokens, backbone spec, pooling and layer).
        self.feature_cache: Path | None = None

    # ---- loading and saving ------------------------------------------------------------------------------------
    @classmethod
    def from_backbone(cls, spec: str, **config: Any) -> "RegressionMeter":
        from deltattg.hf import load_backbone, load_tokenizer

        return cls(load_backbone(spec), load_tokenizer(spec), RegressionConfig(backbone=spec, **config))

    def save_pretrained(self, directory: str | Path, *, include_backbone: bool = True) -> None:
        """HF-style folder: ``meter_config.json``, ``head.pt`` and (unless the backbone was frozen and is loadable
        from its spec) the backbone and tokenizer via ``save_pretrained``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = asdict(self.config)
        if include_backbone:
            save_model(self.backbone, self.tokenizer, directory / BACKBONE_DIR)
            config["backbone"] = BACKBONE_DIR
        torch.save(self.head.state_dict(), directory / HEAD_NAME)
        (directory / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> "RegressionMeter":
        directory = Path(directory)
        config = RegressionConfig(**json.loads((directory / CONFIG_NAME).read_text()))
        spec = str(directory / config.backbone) if (directory / config.backbone).is_dir() else config.backbone
        meter = cls.from_backbone(spec, **{k: v for k, v in asdict(config).items() if k not in ("backbone",)})
        meter.config = config
        from deltattg.data.pt_files import safe_load  # weights-only: loading a meter never runs code

        meter.head.load_state_dict(safe_load(directory / HEAD_NAME))
        meter._id = f"regression-{_digest(directory)}"
        return meter.eval()

    @property
    def meter_id(self) -> str:
        if self._id is None:
            self._id = f"regression-{_digest_weights(self)}"
        return self._id

    # ---- reading decision states -------------------------------------------------------------------------------
    def windows(self, messages: Sequence[dict], steps: Sequence[int] | None = None) -> list[Window]:
        blocks = encode_blocks(decision_blocks(messages, self.config.max_message_chars, self.config.turn_limit),
                               self.tokenizer)  # fmt: skip
        return plan_windows(blocks, self.config.max_length, steps)

    def boundary_features(self, windows: Sequence[Window], prefix: tuple[int, Any] | None = None) -> Tensor:
        """Backbone hidden states at every read position of ``windows`` (in order), batched by token budget.
        ``prefix``: ``(length, key/value cache)`` of tokens that every window continues (their ids come after it)."""
        device = next(self.backbone.parameters()).device
        before = prefix[0] if prefix else 0
        order = sorted(range(len(windows)), key=lambda k: len(windows[k].ids))
        pieces: dict[int, Tensor] = {}
        for batch in _token_batches(order, windows, self.config.max_batch_tokens):
            width = max(len(windows[k].ids) for k in batch)
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            ids = torch.tensor([windows[k].ids + [pad] * (width - len(windows[k].ids)) for k in batch], device=device)
            mask = torch.tensor([[1] * (before + len(windows[k].ids)) + [0] * (width - len(windows[k].ids))
                                 for k in batch], device=device)  # fmt: skip
            cache = None
            if prefix:
                cache = copy.deepcopy(prefix[1])
                cache.batch_repeat_interleave(len(batch))
            hidden = self.hidden_states(ids, mask, cache)
            for row, k in enumerate(batch):
                pieces[k] = read_features(hidden[row], windows[k], self.config.pooling)
        return torch.cat([pieces[k] for k in range(len(windows))]) if windows else torch.empty(0)

    def last_block_features(self, windows: Sequence[Window]) -> Tensor:
        """:meth:`boundary_features` of windows that read one state each and share every token before that state's
        last block (the K candidate branches of one guided step, E.5): the shared prefix runs once, then only the
        last blocks run, batched, on copies of its key/value cache. Equal to reading each window on its own up to
        float rounding: under causal attention the last block's states depend on the prefix only through its cache."""
        from deltattg.hf import cache_argument

        device = next(self.backbone.parameters()).device
        cut = windows[0].starts[0]
        ids = torch.tensor([windows[0].ids[:cut]], device=device)
        cache = self.backbone(input_ids=ids, use_cache=True)[cache_argument(self.backbone)]
        blocks = [Window(w.ids[cut:], [w.positions[0] - cut], w.steps, [0]) for w in windows]
        return self.boundary_features(blocks, prefix=(cut, cache))

    def hidden_states(self, ids: Tensor, mask: Tensor, cache: Any = None) -> Tensor:
        """``[B, L, H]`` states the head reads: the backbone's final (normalised) state, or the output of decoder
        layer ``config.layer`` (``layer = num_hidden_layers`` is the final state); ``cache``: a key/value cache of
        tokens before ``ids`` (``mask`` then covers them too)."""
        from deltattg.hf import cache_argument

        kwargs = {cache_argument(self.backbone): cache, "use_cache": True} if cache is not None else {}
        if self.config.layer is None:
            return self.backbone(input_ids=ids, attention_mask=mask, **kwargs).last_hidden_state
        return self.backbone(input_ids=ids, attention_mask=mask, output_hidden_states=True, **kwargs).hidden_states[self.config.layer]

    @torch.no_grad()
    def score_trajectories(self, trajectories: Sequence[Sequence[dict]]) -> list[list[MeterOutput | None]]:
        """Readings of every decision state t = 0..T of each trajectory (T+1 each), one pass per trajectory window
        (or its features from :attr:`feature_cache`)."""
        plans = [self.windows(messages) for messages in trajectories]
        flat = [w for plan in plans for w in plan]
        if not flat:
            features = None
        elif self.feature_cache is None:
            features = self.boundary_features(flat)
        else:
            features = cached_features(self, flat, self.feature_cache, progress=False)
        readings = self.readings(self.head(features)) if flat else []
        out, k = [], 0
        for plan in plans:
            n = sum(len(w.steps) for w in plan)
            out.append(readings[k : k + n])
            k += n
        return out

    @torch.no_grad()
    def score(self, histories: Sequence[list[dict]]) -> list[MeterOutput | None]:
        """The ``Meter`` protocol: the reading of each history's own (last) decision state. Histories that differ
        only in their last action and observations (guidance's candidates) share one pass over what they share."""
        windows = [self.windows(h, steps=[len(assistant_indices(h))])[0] for h in histories]
        if not windows:
            return []
        rows: list[Tensor | None] = [None] * len(windows)
        groups = shared_prefix_groups(windows)
        alone = [g[0] for g in groups if len(g) == 1]
        for k, row in zip(alone, self.boundary_features([windows[k] for k in alone]) if alone else []):
            rows[k] = row
        for group in (g for g in groups if len(g) > 1):
            for k, row in zip(group, self.last_block_features([windows[k] for k in group])):
                rows[k] = row
        return self.readings(self.head(torch.stack(rows)))  # type: ignore[arg-type]

    def readings(self, outputs: Tensor) -> list[MeterOutput | None]:
        """The head's ``[B, 2]`` outputs as readings, with this meter's target and fitted temperature."""
        return readings_from_head(outputs, self.config.target, self.config.temperature)

    def weights_changed(self) -> None:
        """Forget the cached meter id after the weights were trained in place (an on-policy refresh)."""
        self._id = None

    def set_temperature(self, temperature: float) -> None:
        """Use p̃ = σ(logit / temperature) from now on (saved with the meter; its id changes with it)."""
        if not 0 < temperature < math.inf:
            raise ValueError(f"the temperature must be a positive number, got {temperature!r}")
        self.config = replace(self.config, temperature=float(temperature))
        self._id = None

    @property
    def turn_limit(self) -> int | None:
        """The turn limit the meter was trained under (its input states the turns left), or ``None``."""
        return self.config.turn_limit


def shared_prefix_groups(windows: Sequence[Window]) -> list[list[int]]:
    """Indices of single-read windows grouped by identical tokens before their read block (in order of first
    appearance); a window whose read block starts at token 0 is a group of its own."""
    groups: dict[Any, list[int]] = {}
    for k, w in enumerate(windows):
        key = tuple(w.ids[: w.starts[0]]) if len(w.steps) == 1 and w.starts[0] > 0 else ("alone", k)
        groups.setdefault(key, []).append(k)
    return list(groups.values())


def read_features(hidden: Tensor, window: Window, pooling: str) -> Tensor:
    """The features of each decision state read in ``window`` from its hidden states ``[L, H]``: the boundary token's
    state, and with ``last+mean`` also the mean over the state's last block (both depend on the prefix only)."""
    last = hidden[window.positions]
    if pooling == "last":
        return last
    cumulative = torch.cat([torch.zeros_like(hidden[:1]), hidden.cumsum(0)])
    ends = torch.tensor(window.positions, device=hidden.device) + 1
    starts = torch.tensor(window.starts, device=hidden.device)
    means = (cumulative[ends] - cumulative[starts]) / (ends - starts)[:, None].to(hidden.dtype)
    return torch.cat([last, means], dim=1)


def _token_batches(order: Sequence[int], windows: Sequence[Window], budget: int) -> Iterator[list[int]]:
    """Consecutive runs of ``order`` whose padded size (rows × longest) stays within ``budget`` tokens."""
    batch: list[int] = []
    for k in order:
        longest = max([len(windows[j].ids) for j in batch] + [len(windows[k].ids)])
        if batch and longest * (len(batch) + 1) > budget:
            yield batch
            batch = []
        batch.append(k)
    if batch:
        yield batch


def _digest(directory: Path) -> str:
    h = hashlib.sha256()
    for name in (CONFIG_NAME, HEAD_NAME):
        h.update((directory / name).read_bytes())
    h.update(str(directory.resolve()).encode())
    return h.hexdigest()[:16]


def _digest_weights(meter: RegressionMeter) -> str:
    h = hashlib.sha256(json.dumps(asdict(meter.config), sort_keys=True).encode())
    for tensor in meter.head.state_dict().values():
        h.update(tensor.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]
