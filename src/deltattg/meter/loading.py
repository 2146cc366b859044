"""One factory for every kind of meter a user can point at: a saved folder (its ``meter_config.json`` says which
kind), a bare HF model id/path/spec (an untrained generative meter: E.4's "− meter training" row), or an
OpenAI-compatible endpoint URL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from deltattg.meter.base import Meter

CONFIG_NAME = "meter_config.json"


def meter_kind(path: str | Path) -> str | None:
    """``regression`` or ``generative`` for a saved meter folder, ``None`` for anything else."""
    config = Path(path) / CONFIG_NAME
    if not config.is_file():
        return None
    return json.loads(config.read_text()).get("kind")


def load_meter(spec: str, *, endpoint_model: str | None = None, **settings: Any) -> Meter:
    """A meter from a folder, a model spec or ``http(s)://`` endpoint (then ``endpoint_model`` names the served model)."""
    if spec.startswith(("http://", "https://")):
        from deltattg.meter.endpoint import EndpointMeter

        if not endpoint_model:
            raise ValueError("an endpoint meter needs the served model's name (--meter-model)")
        return EndpointMeter(spec, endpoint_model, **settings)
    kind = meter_kind(spec)
    if kind == "regression":
        from deltattg.meter.regression import RegressionMeter

        return RegressionMeter.from_pretrained(spec)
    if kind in ("generative", None):
        from deltattg.meter.generative import GenerativeMeter

        return GenerativeMeter.from_pretrained(spec, **settings)
    raise ValueError(f"{spec}: unknown meter kind {kind!r} in {CONFIG_NAME}")


def read_trajectory_states(meter: Meter, trajectories: list[list[dict]], *, terminal: bool = True) -> list[list[Any]]:
    """Readings of every decision state of each trajectory (t = 0..T−1, plus t = T when ``terminal``).

    Meters that read a whole trajectory in one pass (``score_trajectories``) do so; others get the prefixes,
    deduplicated, in one batched ``score`` call.
    """
    from deltattg.data.trajectory import assistant_indices

    if hasattr(meter, "score_trajectories"):
        readings = meter.score_trajectories(trajectories)
        return [r if terminal else r[:-1] for r in readings]
    prefixes = []
    for messages in trajectories:
        cuts = assistant_indices(messages) + ([len(messages)] if terminal else [])
        prefixes.append([messages[:k] for k in cuts])
    flat = meter.score([p for ps in prefixes for p in ps])
    out, k = [], 0
    for ps in prefixes:
        out.append(flat[k : k + len(ps)])
        k += len(ps)
    return out
