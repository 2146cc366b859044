"""The frozen-backbone feature cache: the backbone's features of every read position of a regression meter's windows,
kept in one file window by window, so that training heads again (other seeds, epochs, ``ensemble``), scoring with a
meter's ``feature_cache`` and benchmarks read a pool through the backbone once.

Its own module, below the meter (:mod:`deltattg.meter.regression` reads the cache when scoring) and its training
(which writes it): it names neither, only what it needs of a window and of a meter (:class:`CachedWindow`,
:class:`FeatureReader`), so no import runs back.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from tqdm import tqdm

FEATURES_NAME = "features.pt"  # the frozen-backbone feature cache in the output folder


class CachedWindow(Protocol):
    """What the cache reads of a window (the meter's ``Window``): its tokens and the positions read in it."""

    ids: list[int]
    positions: list[int]
    starts: list[int]


class FeatureReader(Protocol):
    """What the cache needs of a meter (``RegressionMeter``): the settings its features depend on, and the backbone
    that computes them."""

    config: Any
    backbone: torch.nn.Module

    def boundary_features(self, windows: Sequence[Any]) -> torch.Tensor: ...


def window_key(window: CachedWindow) -> str:
    """A window's identity in the feature cache: its tokens and the positions (and last-block starts) read in it."""
    return hashlib.sha256(json.dumps([window.ids, window.positions, window.starts]).encode()).hexdigest()


def feature_settings(meter: FeatureReader) -> str:
    """What changes a window's features besides its tokens: backbone, pooling, layer (not the head's settings)."""
    return json.dumps([meter.config.backbone, meter.config.pooling, meter.config.layer])


def load_feature_cache(path: Path, settings: str) -> dict[str, torch.Tensor]:
    """The cached features by window key, or {} when ``path`` is absent, unreadable or made with other settings."""
    if not path.exists():
        return {}
    from deltattg.data.pt_files import CheckpointError, safe_load

    try:
        saved = safe_load(path)  # weights-only: a cache file never runs code
    except CheckpointError as exc:
        print(f"deltattg: recomputing the feature cache: {exc}", file=sys.stderr)
        return {}
    if not (isinstance(saved, dict) and saved.get("settings") == settings and isinstance(saved.get("windows"), dict)):
        return {}
    return {k: v for k, v in saved["windows"].items() if isinstance(v, torch.Tensor)}


def cached_features(meter: FeatureReader, windows: Sequence[CachedWindow], path: Path, progress: bool) -> torch.Tensor:
    """Frozen-backbone features of every read position of ``windows`` (in order), ``[reads, width]``. They are cached
    at ``path`` window by window, keyed by each window's content under :func:`feature_settings`: retraining heads
    in the same folder (other seeds, epochs, ``ensemble``) reads them all, and a pool that grew computes only its new
    windows. The file is replaced atomically (a crash never leaves half of it)."""
    settings = feature_settings(meter)
    known = load_feature_cache(path, settings)
    keys = [window_key(w) for w in windows]
    todo_by_key = {key: w for key, w in zip(keys, windows) if key not in known}
    if todo_by_key:
        missing, todo = list(todo_by_key), list(todo_by_key.values())
        reused = sum(key in known for key in keys)
        if reused:  # a pool that grew, or heads retrained on another pool's windows too
            print(f"deltattg: features of {reused} of {len(windows)} windows cached, computing {len(todo)}",
                  file=sys.stderr)  # fmt: skip
        step = 16
        meter.backbone.eval()
        with torch.no_grad():
            for start in tqdm(range(0, len(todo), step), desc="backbone features", unit="chunk", disable=not progress):
                chunk = todo[start : start + step]
                rows = meter.boundary_features(chunk).cpu()
                for key, part in zip(missing[start : start + step], rows.split([len(w.positions) for w in chunk])):
                    known[key] = part.clone()
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")  # as checkpoints are written
        torch.save({"settings": settings, "windows": known}, partial)
        partial.replace(path)
    return torch.cat([known[key] for key in keys]) if windows else torch.empty(0)
