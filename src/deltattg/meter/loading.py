"""One home for getting a meter and for reading the decision states of whole trajectories with it.

``load_meter`` accepts a saved folder (its ``meter_config.json`` says which kind), a bare HF model id/path/spec (an
untrained generative meter: E.4's "− meter training" row) or an OpenAI-compatible endpoint URL. Meters that read
prefix by prefix come wrapped in a deduplicating, failure-containing ``CachedMeter`` (optionally with a persistent
SQLite cache); the in-process generative meter reads all states of a trajectory on one shared key/value cache (its
wrapper caches them trajectory by trajectory); the regression meter reads every state of a trajectory in one pass and
needs neither.

``read_states`` is Algorithm 1's lines 9–10: the decision states of the queried trajectories, in one batched call.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deltattg.data.trajectory import MeterOutput, Trajectory, state_prefixes
from deltattg.meter.base import CachedMeter, CachedTrajectoryMeter, Meter
from deltattg.meter.prompt import prefix_hash

CONFIG_NAME = "meter_config.json"


METER_KINDS = ("regression", "generative")


def read_meter_config(path: str | Path) -> dict | None:
    """The validated ``meter_config.json`` of a saved meter folder (``None`` when there is none): a JSON object with a
    known ``kind`` and, for a regression meter, settings of the right types. Anything else raises ``InputError``
    naming the file."""
    from deltattg.data.jsonl import parse_line
    from deltattg.errors import InputError

    file = Path(path) / CONFIG_NAME
    if not file.is_file():
        return None
    try:
        config = parse_line(file.read_bytes())
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path=str(file)) from None
    except InputError as exc:
        raise exc.located(path=str(file)) from None
    kind = config.get("kind")
    if kind not in METER_KINDS:
        raise InputError(f"unknown meter kind {kind!r} (expected {' or '.join(METER_KINDS)})", path=str(file),
                         field="kind")
    if kind == "regression":
        _check_regression_config(config, str(file))
    else:
        check_turn_limit(config, str(file))
        check_temperature(config, str(file))
        check_label_source(config, str(file))
        if config.get("readout", "answer") not in ("answer", "logit", "both"):
            raise InputError(f"must be answer, logit or both, got {config['readout']!r}", path=str(file),
                             field="readout")
    for name in ("max_prompt_tokens", "max_new_tokens"):  # the generative meter's budgets
        value = config.get(name)
        if kind == "generative" and value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                                           or value < 1):
            raise InputError(f"must be a positive integer, got {value!r}", path=str(file), field=name)
    return config


def _check_regression_config(config: dict, file: str) -> None:
    import dataclasses

    from deltattg.errors import InputError
    from deltattg.meter.regression import RegressionConfig

    known = {f.name: f for f in dataclasses.fields(RegressionConfig)}
    unknown = sorted(set(config) - set(known))
    if unknown:
        raise InputError(f"unknown settings {unknown}", path=file, field=unknown[0])
    if not isinstance(config.get("backbone"), str) or not config["backbone"]:
        raise InputError("must name the backbone (an HF id, a path or a model spec)", path=file, field="backbone")
    for name, f in known.items():
        value = config.get(name)
        if name in config and name != "backbone":
            kind = type(f.default)
            if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise InputError(f"must be a positive integer, got {value!r}", path=file, field=name)
            if kind is str and not isinstance(value, str):
                raise InputError(f"must be a string, got {value!r}", path=file, field=name)
    layer = config.get("layer")
    if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int) or layer < 1):
        raise InputError(f"must be null or a decoder layer (1, 2, ...), got {layer!r}", path=file, field="layer")
    check_temperature(config, file)
    check_turn_limit(config, file)
    check_label_source(config, file)


def check_label_source(config: dict, file: str) -> None:
    """A meter config's ``labels`` (the label source it was trained on) is null (absent) or an object naming its
    ``source``."""
    from deltattg.errors import InputError

    labels = config.get("labels")
    if labels is not None and not (isinstance(labels, dict) and isinstance(labels.get("source"), str)):
        raise InputError(f'must be null or {{"source": ..., ...}}, got {labels!r}', path=file, field="labels")


def check_temperature(config: dict, file: str) -> None:
    """A meter config's completion ``temperature`` (absent: 1) is a positive finite number."""
    from deltattg.errors import InputError

    temperature = config.get("temperature", 1.0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature < math.inf:
        raise InputError(f"must be a positive number, got {temperature!r}", path=file, field="temperature")


def check_turn_limit(config: dict, file: str) -> None:
    """A meter config's ``turn_limit`` is null (absent) or a positive integer."""
    from deltattg.errors import InputError

    limit = config.get("turn_limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InputError(f"must be null or a positive number of turns, got {limit!r}", path=file, field="turn_limit")


def check_meter_turn_limit(meter: Any, max_turns: int, meter_name: str, limit_name: str) -> None:
    """A meter trained with the turns left in its input reads episodes of the same turn limit: otherwise every
    reading would state the wrong turns left (``ValueError`` naming both settings)."""
    limit = getattr(meter, "turn_limit", None)
    if limit is not None and limit != max_turns:
        raise ValueError(f"{meter_name} was trained on episodes of {limit} turns (its input states the turns left), "
                         f"but {limit_name} is {max_turns}: train a meter for {max_turns} turns, or run {limit}")


def meter_kind(path: str | Path) -> str | None:
    """``regression`` or ``generative`` for a saved meter folder, ``None`` for anything else; a malformed
    ``meter_config.json`` raises ``InputError`` naming it."""
    config = read_meter_config(path)
    return None if config is None else config["kind"]


NOT_THE_METER = ("features.pt", "train_report.json", "labels_report.json", "reliability.png", "sft", "checkpoint-*")
"""What a meter folder may hold beside the meter itself: caches, reports and training checkpoints."""


def meter_digest(spec: str | os.PathLike) -> str | None:
    """SHA-256 over the files of a meter folder that make the meter (its config, head, backbone, model; not
    :data:`NOT_THE_METER` nor hidden files), by relative path and content: a meter retrained in place has another
    digest. ``None`` for a spec that is no local folder (an endpoint URL, a Hub id, ``oracle``)."""
    import fnmatch
    import hashlib

    folder = Path(spec).expanduser()
    if not folder.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        parts = path.relative_to(folder).parts
        if any(part.startswith(".") or any(fnmatch.fnmatch(part, pattern) for pattern in NOT_THE_METER)
               for part in parts):
            continue
        digest.update(f"{'/'.join(parts)}\0{path.stat().st_size}\0".encode())
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


TRAINING_TRACES = ("features.pt", "train_report.json", "head.pt", "sft", "checkpoint-*")  # train-meter's first files


def check_meter_folder(folder: Path, kind: str | None) -> None:
    """A folder given as a meter holds a whole one, else ``InputError`` naming what is missing: a regression meter its
    ``head.pt`` (and ``backbone/`` when saved with it), a generative meter or a bare HF model its ``config.json``. A
    folder with neither ``meter_config.json`` nor ``config.json`` is no meter; ``train-meter``'s files in it are named
    as those of a run that did not finish."""
    from deltattg.errors import InputError
    from deltattg.meter.regression import BACKBONE_DIR, HEAD_NAME

    if kind == "regression":
        config = read_meter_config(folder) or {}
        missing = [] if (folder / HEAD_NAME).is_file() else [HEAD_NAME]
        if config.get("backbone") == BACKBONE_DIR and not (folder / BACKBONE_DIR).is_dir():
            missing.append(f"{BACKBONE_DIR}/")
    elif (folder / "config.json").is_file():
        return
    else:
        missing = ["config.json (the model)" if kind == "generative"
                   else f"{CONFIG_NAME} (nor an HF model's config.json)"]  # fmt: skip
    if not missing:
        return
    traces = sorted({p.name for pattern in TRAINING_TRACES for p in folder.glob(pattern)})
    hint = f"; it holds {', '.join(traces)}: a train-meter run that did not finish? train it again" if traces else ""
    what = "not a meter" if kind is None else "not a complete meter"
    raise InputError(f"{what}: no {' and no '.join(missing)}{hint}", path=str(folder))


PLANNER_METERS = ("oracle", "belief")
"""Built-in meters that replay the household planner: the true world (``meter.oracle``) and the worlds the history
allows (``meter.belief``)."""


def planner_meter(spec: str, tokenizer: Any, oracle: Any = None) -> Meter:
    """The oracle or the belief reference (``PLANNER_METERS``); ``tokenizer`` (an object or spec) counts their tokens,
    ``oracle`` is the oracle's ``OracleConfig``."""
    from deltattg.meter.belief import BeliefMeter
    from deltattg.meter.oracle import OracleConfig, OracleMeter

    if tokenizer is None:
        raise ValueError(f"the {spec} meter counts Token-to-Go with a tokenizer: pass --tokenizer")
    if isinstance(tokenizer, str):
        from deltattg.hf import load_tokenizer

        tokenizer = load_tokenizer(tokenizer)
    return OracleMeter(tokenizer, oracle or OracleConfig()) if spec == "oracle" else BeliefMeter(tokenizer)


def load_meter(
    spec: str | Path,
    *,
    endpoint_model: str | None = None,
    endpoint_timeout_s: float = 60.0,
    device: Any = "cpu",
    readout: str | None = None,
    cache: str | Path | None = None,
    tokenizer: Any = None,
    oracle: Any = None,
    turn_limit: int | None = None,
    per_prefix: bool = False,
) -> Meter:
    """A ready-to-read meter from a folder, a model spec, an ``http(s)://`` endpoint (``endpoint_model`` names
    the served model, ``endpoint_timeout_s`` the deadline of one reading, retries included) ``oracle`` (the
    household planner) or ``belief`` (the planner over the worlds the history allows; ``tokenizer``, an object or spec, counts its tokens; ``oracle`` is its ``OracleConfig``);
    ``readout`` is the generative meter's (answer / logit / both; default: the one saved with it, else answer);
    ``cache`` a SQLite file; ``turn_limit`` the turn
    limit an endpoint's meter was trained under (a saved meter keeps its own); ``per_prefix`` makes an in-process
    generative meter read each decision prefix as its own prompt instead of a trajectory's states on one shared
    key/value cache (the same greedy answers, T prefills instead of one). Several specs joined by commas
    (``a,b,c``) make a pessimistic ensemble of those meters (:class:`~deltattg.meter.ensemble.MeterEnsemble`)."""
    from deltattg.meter.cache import ScoreCache

    spec = str(spec)
    if "," in spec and not spec.startswith(("http://", "https://")):  # several meters: a pessimistic ensemble
        from deltattg.meter.ensemble import MeterEnsemble

        members = [load_meter(part, endpoint_model=endpoint_model, endpoint_timeout_s=endpoint_timeout_s,
                              device=device, readout=readout, tokenizer=tokenizer, oracle=oracle, turn_limit=turn_limit,
                              per_prefix=per_prefix)
                   for part in spec.split(",") if part]  # fmt: skip
        return MeterEnsemble(members)
    if spec in PLANNER_METERS:
        return planner_meter(spec, tokenizer, oracle)
    if spec.startswith(("http://", "https://")):
        from deltattg.meter.endpoint import EndpointMeter

        if not endpoint_model:
            raise ValueError("an endpoint meter needs the served model's name (--meter-model)")
        # An endpoint's invalid reading may be a timeout: never cache it.
        endpoint = EndpointMeter(spec, endpoint_model, timeout_s=endpoint_timeout_s, turn_limit=turn_limit)
        return CachedMeter(endpoint, ScoreCache(cache) if cache else None, cache_invalid=False)
    kind = meter_kind(spec)
    if Path(spec).expanduser().is_dir():
        check_meter_folder(Path(spec).expanduser(), kind)
    if kind == "regression":
        from deltattg.meter.regression import RegressionMeter

        return RegressionMeter.from_pretrained(spec).to(device).eval()
    if kind not in ("generative", None):
        raise ValueError(f"{spec}: unknown meter kind {kind!r} in {CONFIG_NAME} (expected regression or generative)")
    from deltattg.meter.generative import GenerativeMeter

    # Greedy in-process answers repeat, invalid ones included: cache them too. The cache file is created only once
    # the meter loaded, so a mistyped spec leaves nothing behind.
    meter = GenerativeMeter.from_pretrained(spec, device=device, **({"readout": readout} if readout else {}))
    wrapper = CachedMeter if per_prefix else CachedTrajectoryMeter
    return wrapper(meter, ScoreCache(cache) if cache else None, cache_invalid=True)


@dataclass
class ReadStats:
    trajectories: int = 0  # trajectories queried
    states: int = 0  # their decision states
    sent: int = 0  # distinct items sent to the meter: trajectories (one-pass meters) or prefixes
    invalid: int = 0  # invalid readings among the queried states


def read_states(
    meter: Meter,
    trajectories: Sequence[Trajectory],
    queried: Sequence[bool] | None = None,
    *,
    terminal: bool = False,
) -> tuple[list[list[MeterOutput | None]], ReadStats]:
    """Readings of the decision states of every queried trajectory (all ``None`` for the others), in ONE meter call.

    A meter with ``score_records`` (the oracle) reads the trajectory records themselves; one with
    ``score_trajectories`` reads all states of a trajectory's messages in one pass (identical trajectories sent once);
    any other ``Meter`` gets the distinct decision prefixes.
    """
    queried = [True] * len(trajectories) if queried is None else list(queried)
    messages = [list(t.messages or []) for t in trajectories]
    prefixes = [state_prefixes(m, terminal) for m in messages]
    chosen = [i for i, ask in enumerate(queried) if ask]
    stats = ReadStats(trajectories=len(chosen), states=sum(len(prefixes[i]) for i in chosen))
    readings: dict[int, list[MeterOutput | None]] = {}
    if chosen and hasattr(meter, "score_records"):
        stats.sent = len(chosen)
        readings = dict(zip(chosen, meter.score_records([trajectories[i] for i in chosen], terminal=terminal)))
    elif chosen and hasattr(meter, "score_trajectories"):
        distinct = {prefix_hash(messages[i]): messages[i] for i in chosen}
        stats.sent = len(distinct)
        scored = dict(zip(distinct, meter.score_trajectories(list(distinct.values()))))
        for i in chosen:
            readings[i] = list(scored[prefix_hash(messages[i])][: len(prefixes[i])])
    elif chosen:
        distinct = {prefix_hash(h): h for i in chosen for h in prefixes[i]}
        stats.sent = len(distinct)
        scored = dict(zip(distinct, meter.score(list(distinct.values()))))
        for i in chosen:
            readings[i] = [scored[prefix_hash(h)] for h in prefixes[i]]
    stats.invalid = sum(r is None for row in readings.values() for r in row)
    return [readings.get(i, [None] * len(p)) for i, p in enumerate(prefixes)], stats


def meter_bootstrap(meter: Any) -> Callable[[Sequence[Trajectory]], list[list[tuple[float, float | None] | None]]]:
    """``td``'s reader: ``meter``'s (p̂, v̂) of every state s_0..s_T of trajectories (p̂: its calibrated probability
    where it gives one, else its b̂), None for an invalid reading."""
    def read(trajectories: Sequence[Trajectory]) -> list[list[tuple[float, float | None] | None]]:
        rows, _ = read_states(meter, list(trajectories), terminal=True)
        return [[None if r is None or r.can_complete is None else
                 (r.probability if r.probability is not None else float(r.can_complete), r.tokens_to_go)
                 for r in row] for row in rows]  # fmt: skip

    return read
