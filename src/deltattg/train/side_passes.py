"""Side passes: the work a method adds to the training step beside rollouts, credit and the update, behind one protocol.

Some estimators read what only the actor's own forward passes give, and some runs change their meter as they go:
IGPO / A²TGPO read the reference answer's log-probs after every turn (``deltattg.train.answers``), DelTA the token
hidden states of θ_old's pass (:class:`HiddenStateWeights`), CrEST a privileged self-teacher's pass
(``deltattg.train.teacher``); ``meter.refresh_every`` trains the meter's head on the step's own rollouts, labelled
by their outcomes or by the current actor's completions (:class:`MeterRefresh`). Each is a :class:`SidePass`, built
once per run from its :class:`Setup`, and the loop calls every pass at three points of the step (:class:`SidePasses`):

    rollouts -> before_credit(trajectories)  -> A_i, meter, credit -> after_credit(step, trajectories)
             -> θ_old's log-probs -> token_advantages(UpdateBatch) -> π_ref's log-probs, the update

An estimator's record names its pass's factory (``Estimator.side_pass``, ``"module:function"``, imported here when the
run is built: the credit package never imports the trainer); the meter refresh is the run's, switched on by its
config. A pass's state (``state_dict``) goes into every checkpoint and comes back on resume.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from deltattg.credit import CreditConfig, Estimator
from deltattg.data.labels import LabelSettings
from deltattg.data.tokens import ActionTokens
from deltattg.data.trajectory import Trajectory
from deltattg.envs.base import Environment, Task
from deltattg.meter.fit import agreement_of
from deltattg.meter.loading import read_states
from deltattg.meter.regression import RegressionMeter
from deltattg.meter.train_regression import OnPolicyRefresh
from deltattg.rollout.label_sources import labels_of_batch
from deltattg.rollout.policies import LMPolicy
from deltattg.train.config import TrainConfig
from deltattg.train.rows import Row


@dataclass(frozen=True)
class Setup:
    """What a side pass is built from, once, before the first step: the run's config, its estimator, the actor's
    policy (model, tokenizer, prompt layout), an environment instance, the training tasks (a trajectory's ``group``
    is its task's id) and the run's meter (``None`` when the estimator reads none)."""

    config: TrainConfig
    estimator: Estimator
    policy: LMPolicy
    env: Environment
    tasks: Sequence[Task]
    meter: Any = None
    make_env: Callable[[], Environment] | None = None  # the run's environment constructor (replays, completions)

    @property
    def device(self) -> torch.device:
        """The actor's device."""
        return next(self.policy.model.parameters()).device


@dataclass
class UpdateBatch:
    """One step's rows as the update reads them. ``advantages``: Ã of each row's step ``[rows]``; ``old_logprobs``:
    θ_old's log-probs of each row's response tokens (the sampler's, or recomputed); ``recomputed`` and ``hidden``:
    θ_old's pass over the rows, when one ran (``optim.recompute_old_logprobs``, or a pass that
    :attr:`SidePass.reads_hidden_states`), its log-probs and, for such a pass, the last hidden states
    ``[len(response), d]`` of each row; ``per_token``: each row's own per-token advantages once a side pass set them
    (``None``: every token gets its row's advantage)."""

    trajectories: Sequence[Trajectory]
    rows: Sequence[Row]
    advantages: Tensor
    old_logprobs: Sequence[Tensor]
    recomputed: Sequence[Tensor] | None = None
    hidden: Sequence[Tensor] | None = None
    per_token: list[Tensor] | None = None


class SidePass:
    """A method's work beside the loop. Every hook returns metrics for the step's record (keys of its own); the base
    hooks do nothing. ``phase`` is the timer phase its work counts under (``deltattg.train.trainer.PHASES``);
    ``reads_hidden_states`` asks θ_old's pass to keep the last hidden states for :meth:`token_advantages`."""

    phase: ClassVar[str]
    reads_hidden_states: ClassVar[bool] = False

    def before_credit(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """After the rollouts, before the outcome advantage: set what the estimator reads on the trajectories."""
        return {}

    def after_credit(self, step: int, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """After this step's credit was read (so a change to the meter shows from the next step on)."""
        return {}

    def token_advantages(self, batch: UpdateBatch) -> dict[str, float]:
        """Before the update: set ``batch.per_token`` (scaling it where an earlier pass set it)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Entries of the trainer's checkpoint state (tensors, numbers, lists: what ``weights_only`` loads)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back :meth:`state_dict`'s entries from a checkpoint's trainer state."""


class SidePasses:
    """The run's side passes, each hook of each pass timed under its phase. ``timer(phase)`` is a context manager
    (``deltattg.train.trainer.PhaseTimer``)."""

    def __init__(self, passes: Sequence[SidePass]):
        self.passes = list(passes)

    @property
    def reads_hidden_states(self) -> bool:
        return any(p.reads_hidden_states for p in self.passes)

    def before_credit(self, trajectories: Sequence[Trajectory], timer: Callable) -> dict[str, float]:
        return self._each(timer, lambda p: p.before_credit(trajectories))

    def after_credit(self, step: int, trajectories: Sequence[Trajectory], timer: Callable) -> dict[str, float]:
        return self._each(timer, lambda p: p.after_credit(step, trajectories))

    def token_advantages(self, batch: UpdateBatch, timer: Callable) -> dict[str, float]:
        metrics = self._each(timer, lambda p: p.token_advantages(batch))
        batch.hidden = None  # read by now: not held through π_ref's pass and the update
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {key: value for p in self.passes for key, value in p.state_dict().items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for p in self.passes:
            p.load_state_dict(state)

    def _each(self, timer: Callable, hook: Callable[[SidePass], dict[str, float]]) -> dict[str, float]:
        out: dict[str, float] = {}
        for p in self.passes:
            with timer(p.phase):
                out |= hook(p)
        return out


def side_passes(setup: Setup) -> SidePasses:
    """The run's side passes: its estimator's (:func:`estimator_pass`) and the meter refresh (:func:`meter_refresh`)."""
    return SidePasses([p for p in (estimator_pass(setup), meter_refresh(setup)) if p is not None])


def estimator_pass(setup: Setup) -> SidePass | None:
    """The side pass the estimator's record names (``Estimator.side_pass``, ``"module:function"``), built for the run;
    ``None`` for an estimator without one."""
    spec = setup.estimator.side_pass
    if spec is None:
        return None
    module, _, name = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"estimator {setup.estimator.name!r}: its side pass {spec!r} cannot be loaded: {exc}") from exc
    return factory(setup)


# ---- the on-policy meter refresh (the run's, not an estimator's) -----------------------------------------------------
REFRESH_EPISODES = "meter/refresh_completion_episodes"  # what a best-of-k refresh's completions cost, per step
REFRESH_TOKENS = "meter/refresh_completer_tokens"


@dataclass(frozen=True)
class CompletionLabels:
    """Labels of an RL batch from completions by the current actor (``meter.refresh_labels=best-of-k``): the
    ``completer`` shares the actor's model, so it completes with the weights of the moment; its samples come from a
    stream of their own (seeded per refresh), so the training's random streams are as they would be without it."""

    completer: LMPolicy
    settings: LabelSettings
    make_env: Callable[[], Environment] | None
    max_turns: int
    count_action: ActionTokens  # the completions' actions in the actor's tokens, memoised over the run

    def __call__(self, trajectories: Sequence[Trajectory], seed: int) -> tuple[dict[str, Any], dict[str, float]]:
        """The labels by trajectory id, and ``meter/refresh_*`` counts of what completing them cost."""
        device = next(self.completer.model.parameters()).device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            labels, cost = labels_of_batch(trajectories, self.settings, self.completer, self.count_action,
                                           self.make_env, self.max_turns)  # fmt: skip
        return labels, {REFRESH_EPISODES: float(cost.episodes), "meter/refresh_env_steps": float(cost.env_steps),
                        REFRESH_TOKENS: float(cost.completer_tokens),
                        "meter/refresh_unreplayable": float(cost.unreplayable)}  # fmt: skip


class MeterRefresh(SidePass):
    """Every ``every`` steps, once the step's credit was read, the meter's head trains on the step's rollouts
    (:class:`~deltattg.meter.train_regression.OnPolicyRefresh`, shuffled from ``seed + step``), labelled by their
    outcomes or by ``labels`` (:class:`CompletionLabels`; then the record also says how the meter agreed with them
    before it learnt them, ``meter/refresh_before_*``, and how the meter as loaded agrees with them,
    ``meter/refresh_frozen_*``: the refreshed and the frozen meter's fit on the same current-policy states). Its head
    is checkpointed as ``meter_head``, so a resumed run reads with the head the run had refreshed."""

    phase = "meter"

    def __init__(self, refresh: OnPolicyRefresh, every: int, seed: int, labels: CompletionLabels | None = None,
                 failure_cost: float | None = None):
        self.refresh, self.every, self.seed, self.labels = refresh, every, seed, labels
        self.failure_cost = failure_cost
        self.frozen_head = {k: v.detach().clone() for k, v in refresh.meter.head.state_dict().items()}  # as loaded

    def after_credit(self, step: int, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        if step % self.every:
            return {}
        if self.labels is None:
            return self.refresh.update(trajectories, seed=self.seed + step)
        labels, cost = self.labels(trajectories, self.seed + step)
        before = self.agreement(trajectories, labels, "meter/refresh_before_")
        with self.head_as_loaded():
            frozen = self.agreement(trajectories, labels, "meter/refresh_frozen_")
        return before | frozen | self.refresh.update(trajectories, seed=self.seed + step, labels=labels) | cost

    def agreement(self, trajectories: Sequence[Trajectory], labels: dict[str, Any], prefix: str) -> dict[str, float]:
        """How the meter agrees with the batch's labels on the states the policy now visits: b̂'s balanced accuracy,
        v̂'s and Δ's Spearman, Δ's sign (``meter.fit``), each named ``prefix`` + its key."""
        read = read_states(self.refresh.meter, trajectories)[0]
        agreement = agreement_of(trajectories, read, [labels[t.id] for t in trajectories], self.failure_cost)
        keys = ("b_balanced_accuracy", "ttg_spearman", "delta_spearman", "delta_sign_agreement")
        return {prefix + key: getattr(agreement, key) for key in keys}

    @contextmanager
    def head_as_loaded(self) -> Iterator[None]:
        """The meter reads with the head it was loaded with (the frozen meter's, for a paired comparison on the same
        batch), then with the refreshed one again."""
        meter = self.refresh.meter
        refreshed = {k: v.detach().clone() for k, v in meter.head.state_dict().items()}
        meter.head.load_state_dict(self.frozen_head)
        meter.weights_changed()
        try:
            yield
        finally:
            meter.head.load_state_dict(refreshed)
            meter.weights_changed()

    def state_dict(self) -> dict[str, Any]:
        return {"meter_head": self.refresh.meter.head.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.refresh.meter.head.load_state_dict(state["meter_head"])
        self.refresh.meter.weights_changed()


def meter_refresh(setup: Setup) -> MeterRefresh | None:
    """The refresh ``meter.refresh_every`` asks for (ours: the meter's head keeps learning from the batch's own
    outcomes); ``None`` when it is 0 or the run reads no meter. Refuses a meter that is not an in-process regression
    meter."""
    settings = setup.config.meter
    if setup.meter is None or not settings.refresh_every:
        return None
    if not isinstance(setup.meter, RegressionMeter):
        raise ValueError(f"meter.refresh_every trains an in-process regression meter; meter.path {settings.path} is a "
                         f"{type(setup.meter).__name__}")  # fmt: skip
    refresh = OnPolicyRefresh(setup.meter, lr=settings.refresh_lr, epochs=settings.refresh_epochs,
                              delta_weight=settings.refresh_delta_weight)
    labels = None
    if settings.refresh_labels != "outcome":
        rollout = setup.config.rollout
        completer = LMPolicy(setup.policy.model, setup.policy.tokenizer, setup.policy.sampling, setup.policy.prompt,
                             name="completer")  # fmt: skip
        source = LabelSettings(settings.refresh_labels, "actor", settings.refresh_completions, setup.config.run.seed,
                               max_turns=rollout.max_turns)  # fmt: skip
        count_action = ActionTokens(completer.tokenizer)
        labels = CompletionLabels(completer, source, setup.make_env, rollout.max_turns, count_action)
    seed, failure_cost = setup.config.run.seed, setup.config.credit.failure_cost
    return MeterRefresh(refresh, settings.refresh_every, seed, labels, failure_cost)


# ---- DelTA's token weights (an estimator that reads the token hidden states) -----------------------------------------
class HiddenStateWeights(SidePass):
    """The estimator's ``token_weights`` (DelTA's ω) from θ_old's last hidden states: the per-token advantages A·ω
    (:func:`token_weighted_advantages`). θ_old's pass is the update's (timed there): with
    ``optim.recompute_old_logprobs`` its log-probs are θ_old's; without, DelTA still runs it (verl-DelTA's
    old-log-prob pass always runs) and θ_old stays the sampler's."""

    phase = "update"
    reads_hidden_states = True

    def __init__(self, estimator: Estimator, credit: CreditConfig, device: torch.device | str):
        self.estimator, self.credit, self.device = estimator, credit, device

    def token_advantages(self, batch: UpdateBatch) -> dict[str, float]:
        if batch.recomputed is None or batch.hidden is None:
            raise ValueError("DelTA's token weights read θ_old's pass with its hidden states, and none ran")
        batch.per_token, metrics = token_weighted_advantages(self.estimator, self.credit, batch.advantages,
                                                             batch.recomputed, batch.hidden, self.device,
                                                             per_token=batch.per_token)  # fmt: skip
        return metrics


def hidden_state_pass(setup: Setup) -> HiddenStateWeights:
    """DelTA's side pass (its record's ``side_pass``)."""
    return HiddenStateWeights(setup.estimator, setup.config.credit, setup.device)


def token_advantage_row(advantages: Tensor, lengths: Sequence[int], per_token: Sequence[Tensor] | None,
                        like: Tensor) -> Tensor:  # fmt: skip
    """Every response token's advantage of the batch as one row ``[1, M]`` (float32, on ``like``'s device): each row's
    ``advantages`` entry repeated over its ``lengths`` tokens, or the rows' own ``per_token`` advantages where a side
    pass set them."""
    if per_token is not None:
        return torch.cat([a.float() for a in per_token]).to(like)[None]
    return torch.repeat_interleave(advantages.detach().cpu().float(), torch.tensor(lengths))[None].to(like)


def token_weighted_advantages(
    estimator: Estimator,
    config: CreditConfig,
    advantages: Tensor,
    logprobs: Sequence[Tensor],
    hidden: Sequence[Tensor],
    device: torch.device | str = "cpu",
    *,
    per_token: Sequence[Tensor] | None = None,
) -> tuple[list[Tensor], dict[str, float]]:
    """Each row's per-token advantages Ã_k = A·ω_k, ω from the estimator's ``token_weights`` over every response token
    of the batch at once (DelTA's statistics are batch-wide, as in verl-DelTA's actor), and ``<name>/omega_mean``,
    ``_min``, ``_max``, ``_std`` (population) over those tokens. ``advantages``: one per row (A_i of its step);
    ``per_token``: each row's own per-token advantages instead, where another pass set them; ``logprobs`` and
    ``hidden``: each row's response log-probs and last hidden states from one θ_old pass
    (:func:`~deltattg.train.rows.rows_logprobs_and_hidden`); p = exp(log-prob) at the rollout temperature, as verl
    computes it. ω is computed on ``device`` (the actor's), the per-token advantages come back on the CPU.

    Cost: that pass is one no-grad forward over the batch — the pass ``optim.recompute_old_logprobs`` runs anyway. The
    hidden states, ``tokens × d`` values in the actor's dtype, are held on the CPU until ω is computed."""
    if estimator.token_weights is None:
        raise ValueError(f"estimator {estimator.name!r} has no token weights")
    lengths = [len(lp) for lp in logprobs]
    prob = torch.cat(list(logprobs)).to(device).float().exp()[None]  # every token of the batch as one row: [1, M]
    advantage = token_advantage_row(advantages, lengths, per_token, prob)
    omega = estimator.token_weights(torch.cat(list(hidden)).to(device)[None], prob, advantage,
                                    torch.ones_like(prob, dtype=torch.bool), config)[0]  # fmt: skip
    out = (advantage[0] * omega).to("cpu", advantages.dtype)
    name = estimator.name
    metrics = {} if omega.numel() == 0 else {
        f"{name}/omega_mean": omega.mean().item(), f"{name}/omega_min": omega.min().item(),
        f"{name}/omega_max": omega.max().item(), f"{name}/omega_std": omega.std(correction=0).item()}  # fmt: skip
    return list(out.split(lengths)), metrics
