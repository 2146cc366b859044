"""The household regime's stages, each a function over plain data; :mod:`deltattg.regime.seeds` chains them into one
seed's preparation and runs, for ``deltattg demo`` and ``bench/bench_train.py`` alike.

    base actor (tiny: behaviour-cloned on noisy-expert episodes)   ->  SEED/actor
    trajectory pool (noisy experts, random, the base actor)         ->  SEED/pool.jsonl
    labels of the pool from a source (arms ``@best-of-k``, ...)    ->  SEED/labels-SOURCE.jsonl
    regression meters on the pool's training tasks                 ->  SEED/meter, SEED/meter-SOURCE
    generative meter on a sample of them (arms ``@generative``)     ->  SEED/meter-generative
    the trainer settings every RL arm (``Arm`` specs) shares        ->  SEED/train.yaml
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from deltattg.data.tokens import count_step_tokens
from deltattg.data.trajectory import Trajectory
from deltattg.envs.base import Environment, Task
from deltattg.hf import save_model
from deltattg.data.labels import LABEL_SOURCES, REPLAYED_SOURCES, LabelSettings, StateLabel
from deltattg.meter.commands import calibrate_meter, completion_targets
from deltattg.meter.loading import PLANNER_METERS
from deltattg.meter.regression import RegressionConfig, RegressionMeter
from deltattg.meter.train_regression import RegressionTrainConfig, records_examples, train_regression_meter
from deltattg.regime.config import ACTOR_IN_POOL, RegimeConfig
from deltattg.rollout.collect import PolicySpec, build_policy, collect, parse_policy
from deltattg.rollout.policies import LMPolicy, SamplingConfig
from deltattg.rollout.prompts import PromptConfig
from deltattg.tiny import tiny_llama
from deltattg.train import behaviour_clone, demonstrations, env_factory, load_actor
from deltattg.train.actor import torch_device
from deltattg.train.config import ActorConfig, EnvConfig
from deltattg.train.trainer import mean

GENERATIVE_METER = "meter-generative"  # a seed's generative meter, beside its regression meter ``meter``


# ---- the machine and the world ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def process_settings(threads: int) -> Iterator[None]:
    """For the demo's duration: ``threads`` torch intra-op threads (set explicitly: OpenMP oversubscription on a busy
    2-core box costs up to 30x); denormals flushed to zero (a tiny model's weights and gradients drift into denormal
    values, which CPUs compute slowly: behaviour-cloning epochs grew from ~11 s to ~26 s without it on this machine);
    no transformers progress bars (the demo prints its own stages). All three are undone on exit: flushing
    denormals is process-wide and would break callers that need IEEE subnormals (hypothesis refuses to run)."""
    from transformers.utils import logging as hf_logging

    threads_before, bars_before = torch.get_num_threads(), hf_logging.is_progress_bar_enabled()
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads_before)
        if bars_before:
            hf_logging.enable_progress_bar()


def env_config(config: RegimeConfig) -> EnvConfig:
    return EnvConfig(name=config.env, size="short", options=dict(config.env_options), data_dir=config.data_dir,
                     train_split=config.train_split, eval_split=config.eval_split)  # fmt: skip


def prompt_config(config: RegimeConfig, env: Environment) -> PromptConfig:
    return PromptConfig(layout=getattr(env, "prompt_layout", "window"), history_window=config.history_window)


def sampling(config: RegimeConfig) -> SamplingConfig:
    return SamplingConfig(
        temperature=1.0, max_new_tokens=config.max_new_tokens, max_prompt_tokens=config.max_prompt_tokens
    )


@dataclass
class World:
    """The environment constructor, one instance to read tasks from, and the actor's prompt layout."""

    make_env: Callable[[], Environment]
    env: Environment
    prompt: PromptConfig

    def tasks(self, split: str, count: int) -> list[Task]:
        return list(self.env.tasks(split))[:count]


def build_world(config: RegimeConfig) -> World:
    make_env = env_factory(env_config(config), config.max_turns)
    env = make_env()
    return World(make_env, env, prompt_config(config, env))


# ---- stage 1: the base actor -----------------------------------------------------------------------------------------
@dataclass
class BaseActor:
    """The actor every later stage starts from: ``spec`` is what the trainer loads (a folder or an HF spec)."""

    spec: str
    model: Any
    tokenizer: Any
    clone_losses: list[float] = field(default_factory=list)
    demonstrations: int = 0

    def policy(self, config: RegimeConfig, world: World, name: str = "actor") -> LMPolicy:
        """The actor sampling at temperature 1 (Table 4) with the demo's prompt."""
        return LMPolicy(self.model, self.tokenizer, sampling(config), world.prompt, name=name)


def base_actor(config: RegimeConfig, world: World, folder: Path) -> BaseActor:
    """The tiny actor behaviour-cloned on the successful ε-noisy expert episodes of ``clone_tasks`` training tasks
    (saved to ``folder``), or a pretrained ``config.model`` as it is."""
    actor_config = ActorConfig(model=config.model, tiny_hidden=config.tiny_hidden, tiny_layers=config.tiny_layers,
                               tiny_heads=config.tiny_heads)  # fmt: skip
    model, tokenizer = load_actor(actor_config, world.env, world.prompt, config.max_turns, config.seed)
    if not config.is_tiny:
        return BaseActor(config.model, model.eval(), tokenizer)
    actor = BaseActor(str(folder), model, tokenizer)
    tasks = world.tasks(config.train_split, config.clone_tasks)
    episodes = demonstrations(actor.policy(config, world), world.make_env, tasks, config.max_turns,
                              epsilon=config.clone_epsilon, seed=config.seed)  # fmt: skip
    successful = [t for t in episodes if t.success]
    actor.clone_losses = behaviour_clone(model, tokenizer, successful, lr=config.clone_lr, epochs=config.clone_epochs,
                                         batch_size=config.clone_batch_size, seed=config.seed)  # fmt: skip
    actor.demonstrations = len(successful)
    save_model(model.eval(), tokenizer, folder)
    return actor


# ---- stage 2: the trajectory pool ------------------------------------------------------------------------------------
def pool_specs(config: RegimeConfig, actor: BaseActor) -> list[PolicySpec]:
    """The pool's policies; the base actor's trajectories are named ``actor``, not after its folder, so that a run
    folder read from elsewhere (moved, linked) finds its labels by the same trajectory ids."""
    return [replace(parse_policy(f"lm:{actor.spec}"), alias=ACTOR_IN_POOL) if spec == ACTOR_IN_POOL
            else parse_policy(spec) for spec in config.pool]  # fmt: skip


def collect_pool(config: RegimeConfig, world: World, actor: BaseActor) -> list[Trajectory]:
    """``pool_episodes`` episodes of every pool policy on the same training tasks, each step's token count (the
    Token-to-Go unit) in the actor's tokenizer: generated ids for the LM, the rendered action for the others."""
    specs = pool_specs(config, actor)
    pool = collect(world.make_env, config.train_split, specs, episodes=config.pool_episodes,
                   group_size=config.pool_group_size, seed=config.seed, sampling=sampling(config),
                   max_turns=config.max_turns, prompt=world.prompt, progress=False)  # fmt: skip
    for trajectory in pool:
        if trajectory.step_tokens is None:
            trajectory.step_tokens = count_step_tokens(trajectory.messages or [], actor.tokenizer)
    return pool


def policy_states(config: RegimeConfig, world: World, actor_folder: Path, tokenizer: Any, tasks: int,
                  group_size: int = 4) -> list[Trajectory]:
    """Rollouts of the actor saved in ``actor_folder`` (an RL checkpoint's) on ``tasks`` tasks of the evaluation split
    (all of them where it has fewer), ``group_size`` each as GRPO samples them (so each group shares its first
    state): the states the current policy visits, which the pool never held."""
    spec = replace(parse_policy(f"lm:{actor_folder}"), alias="policy")
    episodes = group_size * min(tasks, len(world.make_env().tasks(config.eval_split)))
    rollouts = collect(world.make_env, config.eval_split, [spec], episodes=episodes, group_size=group_size,
                       seed=config.seed, sampling=sampling(config), max_turns=config.max_turns, prompt=world.prompt,
                       progress=False)  # fmt: skip
    for trajectory in rollouts:
        if trajectory.step_tokens is None:
            trajectory.step_tokens = count_step_tokens(trajectory.messages or [], tokenizer)
    return rollouts


def policy_success(trajectories: Sequence[Trajectory]) -> dict[str, tuple[int, float, float]]:
    """Per policy: (episodes, success rate, mean steps)."""
    out = {}
    for name in dict.fromkeys(t.policy or "?" for t in trajectories):
        mine = [t for t in trajectories if (t.policy or "?") == name]
        out[name] = (len(mine), mean([t.success for t in mine]), mean([t.num_steps for t in mine]))
    return out


# ---- stage 3: the progress meter -------------------------------------------------------------------------------------
def meter_backbone(config: RegimeConfig, actor: BaseActor) -> Any:
    """The meter's backbone before training: a tiny Llama from scratch over the actor's tokenizer
    (``meter_init="scratch"``), or a copy of the actor's own decoder (``"actor"``: the behaviour-cloned policy's
    weights, as SPA-RL and PRIME start their estimators from the policy)."""
    if config.meter_init == "actor":
        return copy.deepcopy(getattr(actor.model, "model", actor.model)).float()
    return tiny_llama(actor.tokenizer, hidden=config.meter_hidden, layers=config.meter_layers,
                      heads=config.meter_heads, max_positions=config.meter_max_length, seed=config.seed).model


def train_meter(config: RegimeConfig, trajectories: Sequence[Trajectory], actor: BaseActor, folder: Path,
                heldout: Sequence[Trajectory] = (), *, turns_left: bool = True,
                labels: dict[str, list[StateLabel]] | None = None, labelling: LabelSettings = LabelSettings()) -> dict:
    """A regression meter (:func:`meter_backbone` over the actor's tokenizer + head) trained end to end on every
    decision state of ``trajectories`` (Eq. 1–2 labels, or ``labels`` by trajectory id from the source
    ``labelling``; each state marked with the turns left unless ``turns_left`` is off), its completion temperature
    fitted on the ``heldout`` trajectories' states against the same labels, saved to ``folder``; returns the training
    report (with ``calibration``)."""
    tokenizer = actor.tokenizer
    backbone = meter_backbone(config, actor)
    meter = RegressionMeter(backbone, tokenizer, RegressionConfig(backbone="tiny", max_length=config.meter_max_length,
                                                                  head_hidden=4 * backbone.config.hidden_size,
                                                                  pooling=config.meter_pooling,
                                                                  turn_limit=config.max_turns if turns_left else None,
                                                                  labels=labelling.to_json()))  # fmt: skip
    windows, examples = records_examples(meter, trajectories, labels)  # the meter's target is TTG: the reward is not read
    settings = RegressionTrainConfig(output_dir=str(folder), freeze_backbone=False, epochs=config.meter_epochs,
                                     batch_size=config.meter_batch_size, lr_backbone=config.meter_lr,
                                     lr_head=config.meter_lr, delta_weight=config.meter_delta_weight,
                                     save_every=10**9,  # no checkpoints: nothing to resume
                                     seed=config.seed, progress=False)  # fmt: skip
    report = train_regression_meter(meter.to(torch_device("auto")), windows, examples, settings)
    if heldout:
        report["calibration"] = calibrate_meter(meter.eval(), meter, heldout, folder, completion_targets(labels))
        meter.save_pretrained(folder)
        (folder / "train_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


BOOTSTRAP_METER = "meter"  # td's bootstrap meter: the seed's outcome meter, named as the labels record it


def label_settings(config: RegimeConfig, source: str, bootstrap_meter: Path | None = None) -> LabelSettings:
    """The regime's label source ``source``: completions by ``config.label_completer`` (``actor``, the run's base
    actor, by default) in the regime's environment, with its sampling, ``config.label_completions`` per state;
    ``td`` bootstrapped from ``bootstrap_meter`` (recorded by name and content digest, so a seed folder read from
    elsewhere finds its labels, and a retrained meter does not)."""
    from deltattg.meter.loading import meter_digest

    replayed = source in REPLAYED_SOURCES
    completer = config.label_completer if replayed else None
    lm = replayed and (completer == ACTOR_IN_POOL or parse_policy(str(completer)).is_model)
    return LabelSettings(
        source, completer=completer, completions=config.label_completions, seed=config.seed,
        bootstrap_meter=BOOTSTRAP_METER if source == "td" else None,
        bootstrap_meter_sha256=meter_digest(bootstrap_meter) if source == "td" and bootstrap_meter else None,
        td_lambda=config.td_lambda, until_success=config.label_until_success and source == "best-of-k",
        environment={"env": config.env, "size": "short", "options": config.env_options, "data": config.data_dir}
        if replayed else None,
        max_turns=config.max_turns if replayed else None, tokenizer=ACTOR_IN_POOL if replayed else None,
        completer_temperature=sampling(config).temperature if lm else None,
        completer_max_new_tokens=config.max_new_tokens if lm else None)


def pool_labels(config: RegimeConfig, world: World, actor: BaseActor, pool: Sequence[Trajectory],
                settings: LabelSettings, path: Path, bootstrap_meter: Path | None = None
                ) -> tuple[dict[str, list[StateLabel]], Any]:
    """The labels of every pool trajectory from ``settings``' source, kept in ``path`` (resumed if a run was
    killed): completions by the completer with the regime's prompt and sampling; ``td`` reads ``bootstrap_meter``."""
    from deltattg.data.sources import Located
    from deltattg.data.tokens import ActionTokens
    from deltattg.rollout.label_sources import make_labels

    def completer():
        if settings.completer == ACTOR_IN_POOL:
            from deltattg.hf import load_causal_lm

            model = actor.model if actor.model is not None else load_causal_lm(actor.spec).eval()
            return LMPolicy(model, actor.tokenizer, sampling(config), world.prompt, name="completer")
        return build_policy(parse_policy(str(settings.completer)), config.seed, sampling(config), world.prompt)

    bootstrap = None
    if settings.source == "td":
        from deltattg.meter.loading import load_meter, meter_bootstrap

        bootstrap = meter_bootstrap(load_meter(bootstrap_meter))
    items = [Located("the regime's pool", k + 1, trajectory, {}) for k, trajectory in enumerate(pool)]
    return make_labels(items, [t.step_tokens or [] for t in pool], settings, path, completer=completer,
                       count_action=ActionTokens(actor.tokenizer), bootstrap=bootstrap, progress=False)


def train_generative_meter(config: RegimeConfig, trajectories: Sequence[Trajectory], folder: Path,
                           heldout: Sequence[Trajectory] = ()) -> dict:
    """The paper's generative meter: ``config.generative_model`` fine-tuned by SFT (Eq. 3, D.2) on every decision
    state of ``config.generative_trajectories`` trajectories drawn from ``trajectories`` (each prompt marked with the
    turns left), the temperature of its p̃ fitted on the states of ``config.generative_heldout`` drawn from
    ``heldout``, saved to ``folder``; returns the training report. A sample, not the pool: SFT of a 135M model on
    all ~7,000 training states takes hours on a CPU."""
    from deltattg.data.sources import Located
    from deltattg.meter.commands import train_generative

    def sample(items: Sequence[Trajectory], count: int, source: str) -> list[Located]:
        chosen = random.Random(config.seed).sample(list(items), min(count, len(items)))
        return [Located(source, k + 1, trajectory, {}) for k, trajectory in enumerate(chosen)]

    settings = {"num_train_epochs": config.generative_epochs, "per_device_train_batch_size": config.generative_batch_size,
                "learning_rate": config.generative_lr, "seed": config.seed, "disable_tqdm": True}  # fmt: skip
    return train_generative(sample(trajectories, config.generative_trajectories, "the regime's pool"),
                            config.generative_model, str(folder), stage="sft", max_prompt_tokens=None, lora=False,
                            train_settings=settings, turn_limit=config.max_turns,
                            calibration=sample(heldout, config.generative_heldout, "the regime's held-out pool"))


# ---- stage 4: RL with GRPO and DeltaTTG ------------------------------------------------------------------------------
def trainer_settings(config: RegimeConfig, actor_spec: str, layout: str) -> dict:
    """The trainer's settings every arm shares (written to ``train.yaml``; ``deltattg train --config`` reads it):
    same actor, seed, tasks, budget, evaluation, credit, loss and optimiser — every setting the runs read comes from
    ``config`` (or the trainer's dataclass defaults), none from a preset."""
    return {
        "actor": {"model": actor_spec},
        "env": dataclasses.asdict(env_config(config)),
        "rollout": {"batch_size": config.batch_size, "group_size": config.group_size, "max_turns": config.max_turns,
                    "max_new_tokens": config.max_new_tokens, "temperature": 1.0, "top_p": 1.0,
                    "max_prompt_tokens": config.max_prompt_tokens, "prompt_layout": layout,
                    "history_window": config.history_window},
        "credit": dataclasses.asdict(config.credit),
        "loss": dataclasses.asdict(config.loss),
        "optim": dataclasses.asdict(config.optim),
        "eval": {"every": config.eval_every, "num_tasks": config.eval_tasks, "greedy": True, "sampled": config.eval_sampled,
                 "at_start": True, "test_split": config.test_split, "test_tasks": config.test_tasks},
        "run": {"steps": config.steps, "seed": config.seed, "save_every": config.steps, "keep_checkpoints": 1,
                "threads": config.threads, "progress": True},
    }  # fmt: skip


@dataclass(frozen=True)
class Arm:
    """One RL run of a comparison: an estimator, its credit settings and the meter it reads. Spec
    ``METHOD[KEY=VALUE,...][@METER]``: ``grpo``, ``deltattg`` (the learned meter), ``deltattg@generative`` (the
    paper's generative meter, ``train_generative_meter``), ``deltattg@best-of-k`` (a learned meter on the labels of a
    source of ``rollout.label_sources``: rollout, best-of-k, td), ``deltattg@oracle`` (the household
    planner), ``deltattg@belief`` (the planner over the worlds the history allows: what a history reader could
    reach), ``deltattg@oracle:SIGMA:P`` (the oracle with log-normal noise σ on v̂ and b̂ flipped with probability
    p), ``deltattg@oracle:SIGMA:P:FN:MF`` (and b̂ = 0 on successes' states with probability FN, b̂ = 1 on failures'
    uncompletable states with probability MF: ``meter.oracle``), ``pos@oracle``,
    ``deltattg_robust[smooth=1,trust=none]`` (credit settings, ``CreditConfig`` fields),
    ``deltattg_robust[meter.refresh_every=5]`` (any other trainer setting), ..."""

    method: str
    meter: str | None = None  # None (the method reads none), "learned", "generative", "oracle" or "belief"
    noise: float = 0.0
    flip: float = 0.0
    options: tuple[tuple[str, str], ...] = ()  # settings (a CreditConfig field or SECTION.KEY, value as written)
    false_negative: float = 0.0
    missed_failure: float = 0.0
    members: int = 1  # learned meters read together (``ensemble:N``: a pessimistic ensemble of N)
    labels: str = "outcome"  # the learned meter's label source (``METHOD@best-of-k``: ``meter-best-of-k``)

    @classmethod
    def parse(cls, spec: str) -> Arm:
        from deltattg.credit import available_estimators
        from deltattg.credit.records import needs_meter

        head, _, meter = spec.partition("@")
        method, bracket, rest = head.partition("[")
        options = parse_credit_options(spec, rest) if bracket else ()
        if not needs_meter(method):
            if meter or method not in (*available_estimators(), "dapo"):
                raise ValueError(f"arm {spec!r}: {method} is not a method (or reads no meter)")
            return cls(method, options=options)
        kind, *dials = meter.split(":") if meter else ["learned"]
        if kind == "ensemble" and len(dials) == 1 and dials[0].isdigit() and int(dials[0]) >= 2:
            return cls(method, "learned", options=options, members=int(dials[0]))
        if kind in LABEL_SOURCES and not dials:
            return cls(method, "learned", options=options, labels=kind)
        if kind not in ("learned", "generative", *PLANNER_METERS) or (
                dials and (kind != "oracle" or len(dials) not in (2, 4))):
            raise ValueError(f"arm {spec!r}: the meter is learned, {', '.join(LABEL_SOURCES[1:])} (learned from "
                             "those labels), generative, ensemble:N (N >= 2), oracle, oracle:SIGMA:P, "
                             "oracle:SIGMA:P:FN:MF or belief")
        noise, flip, false_negative, missed_failure = (*(float(d) for d in dials), 0.0, 0.0, 0.0, 0.0)[:4]
        return cls(method, kind, noise, flip, options, false_negative, missed_failure)

    @property
    def name(self) -> str:
        settings = f"[{','.join(f'{k}={v}' for k, v in self.options)}]" if self.options else ""
        if self.meter == "learned" and self.members > 1:
            return f"{self.method}{settings}@ensemble:{self.members}"
        if self.meter == "learned" and self.labels != "outcome":
            return f"{self.method}{settings}@{self.labels}"
        if self.meter is None or (self.meter == "learned"):
            return self.method + settings
        errors = f":{self.false_negative:g}:{self.missed_failure:g}" if self.false_negative or self.missed_failure else ""
        dials = f":{self.noise:g}:{self.flip:g}{errors}" if self.noise or self.flip or errors else ""
        return f"{self.method}{settings}@{self.meter}{dials}"

    @property
    def meter_folder(self) -> str | None:
        """The seed's folder of the learned meter this arm reads (an ensemble's first member): ``meter``,
        ``meter-best-of-k``, ..., ``meter-generative``; None where it reads none or a planner."""
        if self.meter == "generative":
            return GENERATIVE_METER
        return labelled_meter(self.labels) if self.meter == "learned" else None

    @property
    def folder(self) -> str:
        name = self.name.replace("@", "-").replace(":", "-").replace("[", "-").replace(",", "-")
        return name.replace("]", "").replace("=", "")

    def overrides(self, meter_dir: Path) -> list[str]:
        """The trainer settings that make this arm (on top of the shared ``train.yaml``)."""
        out = [f"algo.method={self.method}", *(f"{setting_path(k)}={v}" for k, v in self.options)]
        if self.meter == "learned" and self.labels != "outcome":  # beside the seed's meter: meter-best-of-k, ...
            out.append(f"meter.path={meter_dir.parent / labelled_meter(self.labels)}")
        elif self.meter == "learned":  # an ensemble's members sit beside the seed's meter: meter-1, meter-2, ...
            out.append("meter.path=" + ",".join([str(meter_dir), *(f"{meter_dir}-{k}" for k in range(1, self.members))]))
        elif self.meter == "generative":  # the seed's generative meter sits beside its regression meter
            out.append(f"meter.path={meter_dir.parent / GENERATIVE_METER}")
        elif self.meter == "belief":
            out.append("meter.path=belief")
        elif self.meter == "oracle":
            out += ["meter.path=oracle", f"meter.oracle_noise={self.noise}", f"meter.oracle_flip={self.flip}"]
            if self.false_negative or self.missed_failure:
                out += [f"meter.oracle_false_negative={self.false_negative}",
                        f"meter.oracle_missed_failure={self.missed_failure}"]
        return out


def labelled_meter(source: str) -> str:
    """The folder of a seed's meter learned from ``source``'s labels: ``meter`` (outcome), ``meter-best-of-k``, ..."""
    return "meter" if source == "outcome" else f"meter-{source}"


def parse_credit_options(spec: str, text: str) -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE,...]`` of an arm spec: ``CreditConfig`` fields, or trainer settings ``SECTION.KEY`` (e.g.
    ``meter.refresh_every``), each checked by building the config."""
    from deltattg.train.config import TrainConfig, from_dict, merge, parse_assignment

    if not text.endswith("]"):
        raise ValueError(f"arm {spec!r}: settings are [KEY=VALUE,...]")
    pairs = [item.partition("=") for item in text[:-1].split(",") if item]
    if not pairs or any(not sep or not key for key, sep, _ in pairs):
        raise ValueError(f"arm {spec!r}: settings are [KEY=VALUE,...]")
    nested: dict = {}
    for key, _, value in pairs:
        nested = merge(nested, parse_assignment(f"{setting_path(key)}={value}"))
    try:
        from_dict(TrainConfig, nested)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"arm {spec!r}: {exc}") from None
    return tuple((key, value) for key, _, value in pairs)


def setting_path(key: str) -> str:
    """An arm setting's trainer path: ``KEY`` is a credit setting, ``SECTION.KEY`` any other."""
    return key if "." in key else f"credit.{key}"
