"""Trainer configuration: dataclasses, named presets, YAML files and ``section.key=value`` overrides.

Resolution order (later wins): dataclass defaults -> preset -> method defaults (``dapo``) -> YAML file -> overrides.
The resolved configuration is what a run writes next to its outputs (``config.yaml``) and what a resume reads back.

The paper presets are Table 4's Qwen3-4B column (``alfworld``, ``papersearchqa``, ``awm``); the settings Table 4 does not
give (mini-batch size, gradient clipping, evaluation cadence) follow verl's defaults and are ours.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from deltattg.credit import CreditConfig, available_estimators, get_estimator
from deltattg.loss import LossConfig
from deltattg.meter.loading import PLANNER_METERS
from deltattg.settings import setting

DAPO = "dapo"
# The paper's models (§4.1): it fine-tunes Qwen3-4B (and Llama-3.1-8B-Instruct) as the actor and initialises each
# progress meter from Qwen3-4B-Instruct-2507. The GPU presets, the verl recipe, the --help texts and the docs name
# these two (tests/test_docs.py holds them to it).
PAPER_ACTOR_MODEL = "Qwen/Qwen3-4B"
PAPER_METER_MODEL = "Qwen/Qwen3-4B-Instruct-2507"
DTYPES = ("float32", "bfloat16", "float16", "float64")


@dataclass(frozen=True)
class ActorConfig:
    """The policy: ``tiny`` (a random word-level Llama over the environment's vocabulary) or any HF id, local path or
    model spec of :mod:`deltattg.hf`. ``lora_rank`` > 0 trains LoRA adapters (peft) instead of every weight."""

    model: str = "tiny"
    tiny_hidden: int = 128
    tiny_layers: int = 2
    tiny_heads: int = 4
    lora_rank: int = 0
    lora_alpha: int = 32
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj")
    dtype: str = "float32"
    device: str = "auto"


@dataclass(frozen=True)
class EnvConfig:
    """``household`` (built in; ``size`` short | full, ``options`` override ``HouseholdConfig`` knobs), ``alfworld``
    (``data_dir`` or $ALFWORLD_DATA) or ``bfcl``."""

    name: str = "household"
    size: str = "short"
    options: dict[str, Any] = field(default_factory=dict)
    data_dir: str | None = None
    train_split: str = "train"
    eval_split: str = "valid_seen"


@dataclass(frozen=True)
class RolloutConfig:
    """Table 4: training batch size (tasks per step), group size G, max turns, max tokens per turn, temperature, top-p."""

    batch_size: int = 16
    group_size: int = 8
    max_turns: int = 50
    max_new_tokens: int = 1024
    temperature: float = 1.0
    top_p: float = 1.0
    max_prompt_tokens: int | None = None
    prompt_layout: str = "window"
    history_window: int = 2
    generation_batch_size: int = 64


@dataclass(frozen=True)
class AlgoConfig:
    """``method``: a registered estimator (``grpo``, ``deltattg`` and its E.4 ablations) or ``dapo`` (Appendix B: GRPO
    advantages + dynamic sampling + clip-higher, no KL). Dynamic sampling drops groups whose reward standard deviation
    is below ``min_group_std`` and refills with up to ``max_gen_batches`` generation batches per step."""

    method: str = "deltattg"
    dynamic_sampling: bool = False
    min_group_std: float = 1e-4
    max_gen_batches: int = 10

    @property
    def estimator(self) -> str:
        return "grpo" if self.method == DAPO else self.method


@dataclass(frozen=True)
class OptimConfig:
    """AdamW, one PPO epoch per step (Table 4). Mini-batches and micro-batches count rows (one row = one step).

    ``recompute_old_logprobs``: θ_old's log-probs by a fresh forward pass over every row, as verl does (and the
    ``rollout_logprob_gap`` metric that compares them with the sampler's); false takes the log-probs the rollout
    recorded, which are θ_old's own (the actor samples with the weights the update starts from) — one forward pass
    over the batch less per step.

    ``target_kl``: end the step's epoch at the first mini-batch whose approximate KL(π_old ‖ π_θ) exceeds it, before
    its optimizer step (the early stop of Spinning Up's and Stable-Baselines3's PPO); None: every mini-batch steps."""

    lr: float = 1e-6
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    mini_batch_size: int = 256
    micro_batch_size: int = 8
    recompute_old_logprobs: bool = True
    target_kl: float | None = None


REFRESH_LABELS = ("outcome", "best-of-k")  # MeterConfig.refresh_labels


@dataclass(frozen=True)
class MeterConfig:
    """The frozen progress meter the DeltaTTG family reads: a saved folder (``meter_config.json`` names its kind), a
    model spec, an endpoint URL, or ``oracle`` (household only: the planner's exact readings, Token-to-Go counted with
    the actor's tokenizer, degraded by ``oracle_noise`` σ on v̂ and ``oracle_flip`` p on b̂; ``meter.oracle``).
    ``refresh_every`` > 0 unfreezes an in-process regression meter's head: every N steps it trains on the batch's own
    rollouts, labelled by their outcomes or by the current actor's best-of-k completions (``refresh_labels``; ours,
    beyond the paper; ``meter.train_regression.OnPolicyRefresh``)."""

    path: str | None = None
    oracle_noise: float = 0.0
    oracle_flip: float = 0.0
    oracle_seed: int = 0
    oracle_false_negative: float = 0.0  # b̂ = 0 on states of successful trajectories, with this probability
    oracle_missed_failure: float = 0.0  # b̂ = 1 on uncompletable states of failed trajectories, with this probability
    refresh_every: int = 0  # on-policy refresh (ours): train the meter's head on the batch every N steps; 0 = frozen
    refresh_epochs: int = 1  # epochs over the batch's decision states per refresh
    refresh_lr: float = 1e-4  # the head's learning rate in a refresh
    refresh_labels: str = "outcome"  # what a refresh learns: outcome (Eq. 1–2, free) or best-of-k (the current actor
    # completes each of the batch's states refresh_completions times: AgentPRM's loop; costs completions)
    refresh_completions: int = 4  # best-of-k: K
    refresh_delta_weight: float = 0.0  # the refresh's step-change loss weight (the regime's meter trains with 3)

    def oracle(self) -> Any:
        """The ``OracleConfig`` of these settings."""
        from deltattg.meter.oracle import OracleConfig

        return OracleConfig(noise=self.oracle_noise, flip=self.oracle_flip, seed=self.oracle_seed,
                            false_negative=self.oracle_false_negative, missed_failure=self.oracle_missed_failure)


@dataclass(frozen=True)
class EvalConfig:
    """Success rate on ``num_tasks`` held-out tasks (0 = the whole split) every ``every`` steps (0 = never), greedy
    and sampled, and before the first step when ``at_start``; with ``test_split``, also greedy success on
    ``test_tasks`` tasks of that split (0 = all of it) after the last step (``test/greedy_success``): the split a
    report reads, kept apart from the one settings are chosen on."""

    every: int = 10
    num_tasks: int = 50
    greedy: bool = True
    sampled: bool = True
    at_start: bool = True
    test_split: str | None = None
    test_tasks: int = 0


@dataclass(frozen=True)
class RunConfig:
    """``threads`` > 0 sets torch's CPU threads: on a shared CPU one thread per process avoids OpenMP oversubscription
    (measured 30x slower with 2 threads on 2 busy cores)."""

    out: str = "runs/train"
    steps: int = 150
    seed: int = 0
    save_every: int = 10
    keep_checkpoints: int = 0  # the newest N checkpoints are kept (0: all)
    tensorboard: bool = False
    progress: bool = True
    threads: int = setting(0, "torch CPU threads (0: torch's default); on a shared CPU 1 avoids OpenMP "
                           "oversubscription (up to 30x slower otherwise)")
    share_prompts: bool = True  # read each distinct prompt once (rollout prefill, log-prob passes); false: every row
    # reads its own (for models whose key/value cache rows cannot be copied with ``batch_select_indices``)


@dataclass(frozen=True)
class TrainConfig:
    preset: str | None = None
    actor: ActorConfig = ActorConfig()
    env: EnvConfig = EnvConfig()
    rollout: RolloutConfig = RolloutConfig()
    algo: AlgoConfig = AlgoConfig()
    credit: CreditConfig = CreditConfig()
    loss: LossConfig = LossConfig()
    optim: OptimConfig = OptimConfig()
    meter: MeterConfig = MeterConfig()
    eval: EvalConfig = EvalConfig()
    run: RunConfig = RunConfig()


def _table4(
    *, env: str, batch: int, group: int, turns: int, tokens: int, kl: float, entropy: float, cost: float,
    eval_split: str = "valid_seen",
) -> dict:
    return {
        "actor": {"model": PAPER_ACTOR_MODEL, "dtype": "float32"},  # fp32 weights: bf16 loses lr-1e-6 AdamW updates
        "env": {"name": env, "eval_split": eval_split},
        "rollout": {"batch_size": batch, "group_size": group, "max_turns": turns, "max_new_tokens": tokens,
                    "temperature": 1.0, "top_p": 1.0},
        "algo": {"method": "deltattg"},
        "credit": {"rho": 0.2, "cap": 5.0, "failure_cost": cost},
        "loss": {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0, "kl_coef": kl, "kl_estimator": "k3",
                 "entropy_coef": entropy},
        "optim": {"lr": 1e-6},
        "run": {"keep_checkpoints": 2},  # a 4B actor's checkpoint (weights + AdamW state, fp32) is ~48 GB
    }  # fmt: skip


PRESETS: dict[str, dict] = {
    # Table 4, Qwen3-4B column.
    "alfworld": _table4(env="alfworld", batch=16, group=8, turns=50, tokens=1024, kl=0.01, entropy=0.001, cost=16384),
    "papersearchqa": _table4(
        env="search", batch=512, group=5, turns=6, tokens=1024, kl=0.001, entropy=0.0, cost=6144, eval_split="test"
    ),
    "awm": _table4(env="awm", batch=16, group=16, turns=20, tokens=2048, kl=0.001, entropy=0.0, cost=16384,
                   eval_split="test"),
    # CPU: a 0.66 M-parameter word-level Llama on the short household tasks (GRPO until a meter is given); C bounds
    # every Token-to-Go (max turns x max tokens per turn = 240 < 256).
    "household-tiny": {
        "actor": {"model": "tiny", "tiny_hidden": 128, "tiny_layers": 2, "tiny_heads": 4},
        "env": {"name": "household", "size": "short"},
        "rollout": {"batch_size": 8, "group_size": 8, "max_turns": 20, "max_new_tokens": 12, "temperature": 1.0},
        "algo": {"method": "grpo"},
        "credit": {"rho": 0.2, "cap": 5.0, "failure_cost": 256.0},
        "loss": {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0, "kl_coef": 0.01, "entropy_coef": 0.001},
        "optim": {"lr": 1e-4, "mini_batch_size": 256, "micro_batch_size": 64, "recompute_old_logprobs": False},
        "eval": {"every": 5, "num_tasks": 20},
        "run": {"out": "runs/household-tiny", "steps": 30, "save_every": 5},
    },
}

METHOD_DEFAULTS: dict[str, dict] = {
    # Appendix B / Table 4: clip 0.2 / 0.28, dynamic sampling (std < 1e-4 dropped, <= 10 generation batches), no KL.
    DAPO: {"algo": {"dynamic_sampling": True, "min_group_std": 1e-4, "max_gen_batches": 10},
           "loss": {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.0}},
}  # fmt: skip


# ---- building a config from nested dicts ----------------------------------------------------------------------------
def parse_assignment(text: str) -> dict:
    """``"optim.lr=1e-5"`` -> ``{"optim": {"lr": "1e-5"}}`` (the value stays text; it is typed against the field)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"an override is section.key=value, got {text!r}")
    out: dict = {}
    node = out
    *sections, last = key.strip().split(".")
    for name in sections:
        node = node.setdefault(name, {})
    node[last] = value
    return out


def merge(base: dict, update: dict) -> dict:
    """Recursive dict merge; ``update`` wins (a copy, neither input changes)."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def coerce(value: Any, kind: Any, name: str) -> Any:
    """``value`` (YAML or override text) as field type ``kind``; raises ``ValueError`` naming the field."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(kind)
        if value is None or (isinstance(value, str) and value.lower() in ("null", "none", "~")):
            if type(None) in options:
                return None
        inner = [k for k in options if k is not type(None)]
        return coerce(value, inner[0], name)
    if origin is typing.Literal:
        return coerce(value, str, name)
    if origin is tuple:
        items = _yaml_value(value, name) if isinstance(value, str) else value
        items = [items] if isinstance(items, str) else items
        if not isinstance(items, (list, tuple)):
            raise ValueError(f"{name}: expected a list, got {value!r}")
        return tuple(coerce(v, typing.get_args(kind)[0], name) for v in items)
    if origin is dict or kind is dict:
        mapping = _yaml_value(value, name) if isinstance(value, str) else value
        if not isinstance(mapping, dict):
            raise ValueError(f"{name}: expected a mapping, got {value!r}")
        return dict(mapping)
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return value.lower() in ("true", "yes", "on", "1")
        raise ValueError(f"{name}: expected true or false, got {value!r}")
    if kind in (int, float):
        number: int | float
        try:
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise TypeError
            if kind is float:
                number = float(value)
            elif isinstance(value, float):
                if not value.is_integer():
                    raise ValueError
                number = int(value)
            else:
                number = int(value)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{name}: expected {kind.__name__}, got {value!r}") from None
        if kind is float and not math.isfinite(number):
            raise ValueError(f"{name}: must be a finite number, got {value!r}")
        return number
    if kind is str:
        if isinstance(value, (dict, list, tuple)) or value is None:
            raise ValueError(f"{name}: expected a string, got {value!r}")
        return str(value)
    raise TypeError(f"{name}: unsupported field type {kind!r}")


def _yaml_value(text: str, name: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{name}: not valid YAML: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    """A YAML error in one line: where, and what is wrong."""
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    if mark is not None and problem:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return " ".join(str(exc).split())


def from_dict(cls: type, data: dict, prefix: str = "") -> Any:
    """A dataclass instance from a nested dict, every value typed against its field; unknown keys are errors."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(
            f"unknown setting(s) {', '.join(prefix + k for k in unknown)}; known: {', '.join(sorted(known))}"
        )
    kwargs = {}
    for name, value in data.items():
        kind = hints[name]
        if is_dataclass(kind):
            if not isinstance(value, dict):
                raise ValueError(f"{prefix}{name}: expected a section (mapping), got {value!r}")
            kwargs[name] = from_dict(kind, value, f"{prefix}{name}.")
        else:
            kwargs[name] = coerce(value, kind, prefix + name)
    return cls(**kwargs)


def to_dict(config: Any) -> dict:
    """Plain nested dicts and lists (YAML-safe)."""

    def plain(value: Any) -> Any:
        if isinstance(value, (tuple, list)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return plain(asdict(config))


def resolve(preset: str | None = None, file: str | Path | None = None, overrides: Sequence[str] = (), *,
            require_meter: bool = True) -> TrainConfig:
    """The configuration of a run: defaults <- preset <- method defaults <- YAML ``file`` <- ``overrides``.

    ``preset`` defaults to the file's own ``preset`` entry; ``require_meter``: see :func:`validate`.
    """
    loaded = read_yaml(file) if file is not None else {}
    if file is not None:
        try:
            from_dict(TrainConfig, loaded)  # the file's own settings are typed and in range, or the error names it
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{file}: {exc}") from None
    preset = preset or loaded.get("preset")
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; available: {', '.join(PRESETS)}")
    base = PRESETS[preset] if preset else {}
    layers = [loaded, *(parse_assignment(text) for text in overrides)]
    method = functools.reduce(merge, layers, base).get("algo", {}).get("method", AlgoConfig.method)
    merged = functools.reduce(merge, layers, merge(base, METHOD_DEFAULTS.get(method, {})))
    config = from_dict(TrainConfig, {**merged, "preset": preset})
    validate(config, require_meter=require_meter)
    return config


def read_yaml(path: str | Path) -> dict:
    """A YAML settings file as a dict; a missing, unreadable or malformed file raises ``ValueError`` naming it."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not valid UTF-8 (byte {exc.start + 1})") from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {_one_line(exc)}") from None
    except RecursionError:
        raise ValueError(f"{path}: not valid YAML: nested too deeply") from None
    loaded = loaded or {}
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: expected a mapping of sections")
    return loaded


def validate(config: TrainConfig, *, require_meter: bool = True) -> None:
    """Settings that are valid one by one but not together (``require_meter=False``: a meter-reading method without
    ``meter.path`` passes, for ``--print-config``)."""
    method = config.algo.method
    if method != DAPO and method not in available_estimators():
        raise ValueError(f"algo.method {method!r} is unknown; choose from {DAPO}, {', '.join(available_estimators())}")
    if get_estimator(config.algo.estimator).needs_failure_cost and config.credit.failure_cost is None:
        raise ValueError(
            f"algo.method {method} needs credit.failure_cost C (Table 4: 16384 ALFWorld/AWM, 6144 PaperSearchQA)"
        )
    if require_meter and needs_meter(config) and not config.meter.path:
        raise ValueError(f"algo.method {method} needs a frozen progress meter: set meter.path")
    if config.meter.refresh_every < 0 or config.meter.refresh_epochs < 1 or not config.meter.refresh_lr > 0:
        raise ValueError("meter.refresh_every must be >= 0, meter.refresh_epochs >= 1 and meter.refresh_lr > 0")
    if not config.meter.refresh_delta_weight >= 0:
        raise ValueError(f"meter.refresh_delta_weight must be >= 0, got {config.meter.refresh_delta_weight}")
    if config.meter.refresh_labels not in REFRESH_LABELS or config.meter.refresh_completions < 1:
        raise ValueError(f"meter.refresh_labels must be one of {', '.join(REFRESH_LABELS)} (got "
                         f"{config.meter.refresh_labels!r}) and meter.refresh_completions >= 1")
    if config.meter.path in PLANNER_METERS:
        config.meter.oracle()  # its dials are in range
        if config.meter.refresh_every:
            raise ValueError(f"meter.refresh_every trains a learned meter; {config.meter.path} reads the planner")
        if config.env.name != "household":
            raise ValueError(f"meter.path={config.meter.path} replays the household planner; env.name is "
                             f"{config.env.name!r}")
    positive = {
        "rollout.batch_size": config.rollout.batch_size,
        "rollout.group_size": config.rollout.group_size,
        "rollout.max_turns": config.rollout.max_turns,
        "rollout.max_new_tokens": config.rollout.max_new_tokens,
        "optim.mini_batch_size": config.optim.mini_batch_size,
        "optim.micro_batch_size": config.optim.micro_batch_size,
        "algo.max_gen_batches": config.algo.max_gen_batches,
    }
    _require(positive, lambda v: v >= 1, "at least 1")
    if config.rollout.prompt_layout not in ("window", "chat"):
        raise ValueError(f"rollout.prompt_layout must be window or chat, got {config.rollout.prompt_layout!r}")
    if min(config.run.steps, config.run.save_every, config.run.keep_checkpoints, config.eval.every) < 0:
        raise ValueError("run.steps, run.save_every, run.keep_checkpoints and eval.every must be >= 0")
    _check_ranges(config)


def _require(settings: dict[str, float], holds: Callable[[float], bool], wanted: str) -> None:
    """Every ``section.key: value`` satisfies ``holds``; the first that does not is a ``ValueError`` naming it."""
    for name, value in settings.items():
        if not holds(value):
            raise ValueError(f"{name} must be {wanted}, got {value}")


def _check_ranges(config: TrainConfig) -> None:
    """Numbers that must be positive, non-negative or within an interval (every float is already finite)."""
    at_least_one = {
        "actor.tiny_hidden": config.actor.tiny_hidden,
        "actor.tiny_layers": config.actor.tiny_layers,
        "actor.tiny_heads": config.actor.tiny_heads,
        "rollout.generation_batch_size": config.rollout.generation_batch_size,
    }
    if config.rollout.max_prompt_tokens is not None:
        at_least_one["rollout.max_prompt_tokens"] = config.rollout.max_prompt_tokens
    _require(at_least_one, lambda v: v >= 1, "at least 1")
    non_negative = {
        "actor.lora_rank": config.actor.lora_rank,
        "rollout.temperature": config.rollout.temperature,
        "rollout.history_window": config.rollout.history_window,
        "algo.min_group_std": config.algo.min_group_std,
        "loss.kl_coef": config.loss.kl_coef,
        "loss.entropy_coef": config.loss.entropy_coef,
        "optim.weight_decay": config.optim.weight_decay,
        "eval.num_tasks": config.eval.num_tasks,
        "run.threads": config.run.threads,
    }
    _require(non_negative, lambda v: v >= 0, ">= 0")
    positive = {"optim.lr": config.optim.lr, "optim.max_grad_norm": config.optim.max_grad_norm,
                "actor.lora_alpha": config.actor.lora_alpha}
    if config.optim.target_kl is not None:
        positive["optim.target_kl"] = config.optim.target_kl
    _require(positive, lambda v: v > 0, "> 0")
    if not 0 < config.rollout.top_p <= 1:
        raise ValueError(f"rollout.top_p must be in (0, 1], got {config.rollout.top_p}")
    if config.actor.dtype not in DTYPES:
        raise ValueError(f"actor.dtype must be one of {', '.join(DTYPES)}, got {config.actor.dtype!r}")


def needs_meter(config: TrainConfig) -> bool:
    """Whether the run's estimator reads a frozen meter (its registry record says)."""
    return get_estimator(config.algo.estimator).needs_meter


def with_changes(config: TrainConfig, **sections: dict) -> TrainConfig:
    """A copy with some fields of some sections changed: ``with_changes(c, run={"steps": 4})``."""
    changed = {name: dataclasses.replace(getattr(config, name), **values) for name, values in sections.items()}
    return dataclasses.replace(config, **changed)


def _absolute(spec: str) -> str:
    """A local path spec (:func:`deltattg.hf.local_folder`; ``DIR::FILE.gguf`` by its folder) made absolute; a Hub id,
    ``smollm2``, ``tiny``, ``oracle``, ``belief`` or a URL as it is."""
    from deltattg.hf import local_folder

    folder = None if spec in ("tiny", *PLANNER_METERS) or spec.startswith(("http://", "https://")) else local_folder(spec)
    return spec if folder is None else _absolute_path(folder) + spec[len(folder):]


def _absolute_path(path: str) -> str:
    return str(Path(path).expanduser().absolute())


def with_absolute_paths(config: TrainConfig) -> TrainConfig:
    """``config`` with its local paths (``actor.model``, each part of ``meter.path``, ``env.data_dir``, the search
    environment's ``env.options.corpus``, ``run.out``) absolute, so the ``config.yaml`` a run saves resumes from any
    working folder."""
    meter = config.meter.path
    if meter is not None:
        meter = ",".join(_absolute(part) if part else part for part in meter.split(","))
    data_dir = config.env.data_dir
    options = dict(config.env.options)
    if isinstance(options.get("corpus"), str):
        options["corpus"] = _absolute_path(options["corpus"])
    return with_changes(config, actor={"model": _absolute(config.actor.model)}, meter={"path": meter},
                        env={"data_dir": data_dir and _absolute_path(data_dir), "options": options},
                        run={"out": _absolute_path(config.run.out)})


def dump(config: TrainConfig) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)


def save(config: TrainConfig, path: str | Path) -> None:
    Path(path).write_text(dump(config))


def load(path: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """A saved, resolved ``config.yaml`` (no preset or method defaults are re-applied) with optional overrides."""
    saved = read_yaml(path)
    try:
        from_dict(TrainConfig, saved)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    merged = functools.reduce(merge, (parse_assignment(text) for text in overrides), saved)
    config = from_dict(TrainConfig, merged)
    validate(config)
    return config
