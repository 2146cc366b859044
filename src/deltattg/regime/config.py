"""Every choice ``deltattg demo`` and ``bench/bench_train.py`` make, in one dataclass: the household RL regime (the
defaults), the demo's 10-minute budget on top of it, its ``--quick`` CI variant, and the changes a pretrained
``--model`` or ``--env alfworld`` needs.

The household regime is sized for 2 CPU cores: a world small enough that a 0.55 M-parameter word-level Llama learns
its action format by behaviour cloning in a minute (few object and receptacle types, open receptacles, 1-2
distractors, plans of 3-8 steps, 12 steps allowed), yet one its cloned policy does not solve: it imitates an expert
that knows where the objects are, so it must learn to search by RL; and a short prompt (no history, the last
``max_prompt_tokens`` tokens: goal, current observation, admissible actions). GRPO from the cloned actor, 8 tasks ×
8 rollouts per step at lr 1.5e-4, is the setting in which held-out greedy success rose most among those tried (docs/benchmarks.md,
"The household RL regime", gives the settings tried and the measured rise).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from deltattg.credit import CreditConfig
from deltattg.loss import LossConfig
from deltattg.settings import setting
from deltattg.train.config import OptimConfig

TINY = "tiny"
ACTOR_IN_POOL = "actor"  # the behaviour-cloned base actor (lm:<its folder>), in the pool and as the label completer; its
# trajectories are named "actor/TASK#k" wherever the run folder lives

HOUSEHOLD_OPTIONS: dict[str, Any] = {  # HouseholdConfig knobs over HouseholdConfig.short()
    "task_types": ["pick_and_place_simple", "pick_clean_then_place_in_recep"],
    "object_types": ["apple", "mug", "book"],
    "receptacle_types": ["cabinet", "countertop", "desk", "sinkbasin", "shelf"],
    "receptacles": [3, 4],
    "targets": [1, 1],
    "distractors": [1, 2],
    "start_closed": False,
    "plan_length": [3, 8],
    "n_train": 1000,
    "n_valid_seen": 250,
    "n_valid_unseen": 50,
}


METER_INITS = ("actor", "scratch")  # RegimeConfig.meter_init: where the meter's backbone starts

RECOMMENDED_ARM = "deltattg_robust@best-of-k"
"""The recommended planner-free arm: robust DeltaTTG with a meter learned from best-of-k labels (safer than
``deltattg`` with a learned meter; at 20 seeds no different from GRPO: docs/benchmarks.md)."""


@dataclass(frozen=True)
class RegimeConfig:
    """The demo's settings. Sections: environment and prompt; the actor and its behaviour cloning; the trajectory
    pool; the regression meter; RL (the trainer's settings, the same for GRPO and DeltaTTG); evaluation and test-time
    guidance; the machine."""

    # ---- environment and prompt ----
    env: str = "household"
    env_options: dict[str, Any] = field(default_factory=lambda: dict(HOUSEHOLD_OPTIONS))
    data_dir: str | None = None  # alfworld: the json_2.1.1 folder (default $ALFWORLD_DATA)
    train_split: str = "train"
    eval_split: str = "valid_seen"
    max_turns: int = 12
    max_new_tokens: int = 10
    history_window: int = 0
    max_prompt_tokens: int | None = 100

    # ---- actor: "tiny" (word-level Llama over the environment's vocabulary, behaviour-cloned) or an HF spec ----
    model: str = TINY
    tiny_hidden: int = 128
    tiny_layers: int = 2
    tiny_heads: int = 4
    clone_tasks: int = 1000  # noisy-expert demonstrations, one per task (successful ones are cloned)
    clone_epsilon: float = 0.1
    clone_epochs: int = 1  # many tasks once: cloning few tasks for many epochs memorises them
    clone_lr: float = 2e-3  # 5e-3 and above stall at the unigram stage
    clone_batch_size: int = 32

    # ---- trajectory pool for the meter (deltattg collect's policy specs; "actor" = the base actor) ----
    pool: tuple[str, ...] = ("expert:0.1", "expert:0.3", "expert:0.6", "random", ACTOR_IN_POOL)
    pool_episodes: int = 256  # per policy, on the same tasks (one episode per task and policy)
    pool_group_size: int = 1
    heldout_fraction: float = 0.25  # of the pool's tasks, kept out of meter training for the TTG scatter

    # ---- regression meter: the behaviour-cloned actor's decoder + a head, trained end to end (issue 47: the recipe
    # that follows the planner's step change best among those measured, docs/benchmarks.md "Meter recipes") ----
    meter_init: str = "actor"  # the backbone: "actor" (a copy of the BC actor's decoder) or "scratch" (a tiny Llama
    # of meter_hidden × meter_layers over the actor's tokenizer, the recipe before issue 47)
    meter_hidden: int = 64  # scratch only
    meter_layers: int = 2  # scratch only
    meter_heads: int = 4  # scratch only
    meter_max_length: int = 1024
    meter_epochs: int = 24  # 12 underfit: Δ Spearman 0.68 → 0.71 on best-of-k labels (docs/benchmarks.md)
    meter_batch_size: int = 4
    meter_lr: float = 3e-4
    meter_delta_weight: float = 3.0  # weight of the step-change loss (RegressionTrainConfig.delta_weight)
    meter_pooling: str = "last"  # a state's features: "last" (the boundary token) or "last+mean" (RegressionConfig)

    # ---- where the learned meters' labels come from (``rollout.label_sources``; arms ``METHOD@SOURCE``) ----
    label_completer: str = ACTOR_IN_POOL  # rollout / best-of-k: the base actor (no planner); expert:EPS = a reference
    label_completions: int = 4  # K completions per decision state
    label_until_success: bool = False  # best-of-k: rounds of completions, none more once a state is proven completable
    td_lambda: float = 0.0  # td: λ of the bootstrapped target (bootstrapped from the seed's outcome meter)

    # ---- generative meter (the paper's; arms ``METHOD@generative``): an LM fine-tuned by SFT (Eq. 3, D.2) ----
    generative_model: str = "smollm2"  # HF id/path, 'smollm2' or DIR::FILE.gguf
    generative_trajectories: int = 96  # pool training trajectories it is fine-tuned on (all their states)
    generative_heldout: int = 32  # held-out pool trajectories its completion temperature is fitted on
    generative_epochs: int = 1  # D.2
    generative_batch_size: int = 8
    generative_lr: float = 1e-5  # D.2

    # ---- RL: every arm (``stages.Arm`` specs) from the same init, seed and budget; the trainer's credit, loss and
    # optimiser sections as they are (``deltattg train``'s own dataclasses: every field the runs read is here) ----
    arms: tuple[str, ...] = ("grpo", RECOMMENDED_ARM, "deltattg@oracle")  # the demo's: what works, one seed
    steps: int = setting(80, "training steps per run")
    batch_size: int = 8  # tasks per step
    group_size: int = 8  # rollouts per task (G)
    credit: CreditConfig = field(default_factory=lambda: CreditConfig(
        rho=0.2, cap=5.0,
        failure_cost=256.0))  # C > max_turns × max_new_tokens, above every Token-to-Go
    loss: LossConfig = field(default_factory=lambda: LossConfig(
        clip_low=0.2, clip_high=0.28, dual_clip=3.0,
        kl_coef=0.0,  # no π_ref pass: one forward pass less per step
        entropy_coef=0.0))  # without the KL anchor a bonus is an absorbing drift: in a batch where every group
    # fails, its gradient is all there is and Adam scales it to full-size steps (seed 222's belief arm at 0.001:
    # 70 such steps, entropy 0.5 → 4.9 nats, 0 % success; verl's and TRL's default is 0)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(
        lr=1.5e-4,  # 3e-4 collapsed to 0 % success (2 of 2 seeds); 1e-4 and 2e-4 rose by < 10 points in 60 steps
        weight_decay=0.01, max_grad_norm=1.0, mini_batch_size=64, micro_batch_size=64,
        recompute_old_logprobs=False,  # the sampler's log-probs are θ_old's own: one forward pass less per step
        target_kl=0.05))  # the collapse guard: a step's epoch ends at a mini-batch past it (seed 206 collapsed in
    # one update of approximate KL 0.18 without it; healthy steps read ≤ 0.04)

    # ---- evaluation (held-out tasks) and test-time guidance (E.5) ----
    eval_every: int = setting(10, "steps between held-out evaluations")
    eval_tasks: int = setting(200, "held-out tasks per evaluation (deduplicated against the training tasks: "
                              "binomial SE <= 3.5 points)")
    eval_sampled: bool = False  # also evaluate at temperature 1 (greedy always)
    test_split: str | None = "test"  # greedy success after the last step on a split no setting was chosen on
    test_tasks: int = 1000  # of it (the benchmark reports these; the curves stay on eval_split)
    guidance_tasks: int = 40
    candidates: int = 4
    credit_tasks: int = 16  # training tasks the base actor plays G times for the credit inspection (precision table)

    # ---- machine ----
    threads: int = 1
    jobs: int = 3  # RL arms trained at once, each in its own process (one per arm: a last arm alone would leave a core idle)
    seed: int = 0

    def __post_init__(self) -> None:
        from deltattg.meter.regression import POOLINGS

        if self.meter_init not in METER_INITS:
            raise ValueError(f"meter_init must be one of {', '.join(METER_INITS)}, got {self.meter_init!r}")
        if self.meter_pooling not in POOLINGS:
            raise ValueError(f"meter_pooling must be one of {', '.join(POOLINGS)}, got {self.meter_pooling!r}")

    @property
    def is_tiny(self) -> bool:
        return self.model == TINY

    def preparation(self) -> dict[str, Any]:
        """The settings that shape a seed's base actor, pool, labels and meters (:data:`PREPARATION_FIELDS`): what a
        benchmark must remake them for when they change."""
        return {name: getattr(self, name) for name in PREPARATION_FIELDS}

    def replace(self, **changes: Any) -> RegimeConfig:
        """A copy with ``changes``: field names, or ``SECTION.FIELD`` for a field of a nested section
        (``optim.lr``, ``loss.kl_coef``, ``credit.failure_cost``)."""
        nested: dict[str, dict[str, Any]] = {}
        flat = {}
        for key, value in changes.items():
            section, dot, name = key.partition(".")
            if dot:
                nested.setdefault(section, {})[name] = value
            else:
                flat[key] = value
        for section, values in nested.items():
            inner = flat.get(section, getattr(self, section))
            if not dataclasses.is_dataclass(inner):
                raise ValueError(f"{section}: not a section of the regime's settings")
            flat[section] = dataclasses.replace(inner, **values)
        return dataclasses.replace(self, **flat)


def setting_type(key: str) -> Any:
    """The type of the regime's setting ``key`` (``FIELD`` or ``SECTION.FIELD``), None when there is no such field."""
    import typing

    owner: Any = RegimeConfig
    *sections, name = key.split(".")
    for section in sections:
        owner = typing.get_type_hints(owner).get(section)
        if owner is None or not dataclasses.is_dataclass(owner):
            return None
    return typing.get_type_hints(owner).get(name)


PREPARATION_FIELDS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(RegimeConfig)
    if f.name in ("env", "env_options", "data_dir", "train_split", "max_turns", "max_new_tokens", "history_window",
                  "max_prompt_tokens", "model", "pool", "pool_episodes", "pool_group_size", "heldout_fraction",
                  "td_lambda", "seed")
    or f.name.startswith(("tiny_", "clone_", "label_", "meter_", "generative_"))
)  # fmt: skip

QUICK: dict[str, Any] = {  # CI: every stage runs and every plot is drawn, nothing is meant to learn
    "env_options": HOUSEHOLD_OPTIONS | {"n_train": 24, "n_valid_seen": 6, "n_valid_unseen": 6},
    "max_turns": 6,
    "clone_tasks": 12, "clone_epochs": 1,
    "pool_episodes": 8, "pool_group_size": 2, "heldout_fraction": 0.5,
    "meter_hidden": 32, "meter_layers": 1, "meter_heads": 2, "meter_epochs": 1,
    "generative_trajectories": 4, "generative_heldout": 2, "label_completions": 1,
    "steps": 2, "batch_size": 2, "group_size": 4, "eval_every": 1, "eval_tasks": 3, "eval_sampled": True,
    "guidance_tasks": 3, "credit_tasks": 2, "test_tasks": 3,
}  # fmt: skip

DEMO_BUDGET: dict[str, Any] = {  # `deltattg demo` in 10 minutes on 2 cores: fewer RL steps and a smaller pool
    "steps": 30,
    "pool_episodes": 96,
    "meter_epochs": 12,  # half the regime's: the meter's training would take 5 of the 10 minutes
    "test_split": None,
}

PRETRAINED: dict[str, Any] = {  # an HF actor: its own tokenizer, no cloning, the paper's prompt and learning rate
    "meter_init": "scratch",  # a copy of a pretrained actor fine-tuned end to end does not fit a CPU demo
    "history_window": 2,
    "max_prompt_tokens": None,
    "max_new_tokens": 32,
    "optim.lr": 1e-6,
    "loss.kl_coef": 0.01,
    "credit.failure_cost": 2048.0,
    "steps": 5,
    "batch_size": 2,
    "group_size": 4,
    "optim.micro_batch_size": 4,
    "eval_every": 5,
    "eval_tasks": 10,
    "test_tasks": 10,
    "guidance_tasks": 10,
    "pool_episodes": 16,
    "credit_tasks": 2,
}

ALFWORLD: dict[str, Any] = {  # the real benchmark (Table 4 turns are 50; fewer here so a CPU run ends)
    "env": "alfworld",
    "test_split": "valid_unseen",
    "env_options": {},
    "max_turns": 20,
    "max_new_tokens": 96,
    "credit.failure_cost": 16384.0,
}


def regime_config(
    *,
    quick: bool = False,
    model: str | None = None,
    env: str = "household",
    data_dir: str | None = None,
    seed: int = 0,
    threads: int | None = None,
    budget: bool = True,
) -> RegimeConfig:
    """The defaults (the regime), then the demo's ``budget`` (``DEMO_BUDGET``; the benchmark turns it off), a
    pretrained ``model`` (SmolLM2 by default on ALFWorld), ``env`` alfworld (game files in ``data_dir``, default
    $ALFWORLD_DATA), then ``quick``; ``seed`` and ``threads`` last."""
    if env not in ("household", "alfworld"):
        raise ValueError(f"the demo runs on household or alfworld, not {env!r}")
    model = model or ("smollm2" if env == "alfworld" else TINY)
    if env == "alfworld" and model == TINY:
        raise ValueError("the tiny actor needs an environment that lists its vocabulary (household); "
                         "on alfworld pass --model (e.g. smollm2)")
    config = RegimeConfig(model=model)
    if budget:
        config = config.replace(**DEMO_BUDGET)
    if not config.is_tiny:
        config = config.replace(**PRETRAINED)
    if env == "alfworld":
        config = config.replace(**ALFWORLD)
    if quick:
        config = config.replace(**{k: v for k, v in QUICK.items() if env == "household" or k != "env_options"})
    return config.replace(seed=seed, data_dir=data_dir, **({"threads": threads} if threads else {}))
