"""Estimators by name, as in verl's ``register_adv_est``: each a record (:class:`Estimator`) that says what it reads.

The trainer, the CLI (``credit``, ``score``, ``inspect``, ``train``, ``methods``) and the demo ask the record instead
of keeping their own lists: which inputs to gather (outcome only, meter readings and which field, per-step rewards
and anchor observations, verified step outcomes, ...), whether the failure cost C must be set, and which trajectories
the frozen meter reads (Algorithm 1's query rule, :meth:`Estimator.queried`). Two hooks turn what only the actor's own
forward passes give into per-token weights of the advantage: ``token_weights`` (the token hidden states: DelTA) and
``teacher_weights`` (a privileged self-teacher's log-probs and entropies: CrEST). The forward passes themselves are
the trainer's: the record's ``side_pass`` names, as text, the trainer's side pass that runs them each step
(``deltattg.train.side_passes``), so that this package never imports the trainer.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from deltattg.credit.batch import Credit, CreditConfig, StepBatch
from deltattg.data.trajectory import MeterOutput

Compute = Callable[[StepBatch, CreditConfig], Credit]
TokenWeights = Callable[[Tensor, Tensor, Tensor, Tensor, CreditConfig], Tensor]
"""``(hidden [N, L, d], token_prob [N, L], advantage [N, L], mask [N, L], config) -> ω [N, L]``: per-token weights of
the advantage from the actor's last hidden states (the LM head's inputs) and the sampled tokens' probabilities, over
the whole batch of the update at once; the trainer hands the policy loss A·ω."""


@dataclass(frozen=True)
class TeacherTokens:
    """A privileged self-teacher's reading of the sampled response tokens ``[N, L]``: ``logprob`` log π_T of each
    sampled token and ``entropy`` H_T (nats) of the teacher's whole next-token distribution there, both at the
    rollout temperature, over a vocabulary of ``vocab_size`` entries (so 0 <= H_T <= log ``vocab_size``)."""

    logprob: Tensor
    entropy: Tensor
    vocab_size: int


TeacherWeights = Callable[[TeacherTokens, Tensor, Tensor, Tensor, CreditConfig], Tensor]
"""``(teacher, student_logprob [N, L], advantage [N, L], mask [N, L], config) -> w [N, L]``: per-token weights of the
advantage from a self-teacher's pass over the sampled tokens (:class:`TeacherTokens`) and the student's own
log-probs of them (θ_old's, those of the update); the trainer hands the policy loss A·w (CrEST)."""


class Reads(str, enum.Enum):
    """An input an estimator needs beyond the outcome (rewards, groups, step tokens), which every estimator reads."""

    METER = "meter readings of the decision states"
    STEP_REWARDS = "per-step rewards"
    ANCHORS = "anchor observations"
    ANSWER_PROBS = "per-turn answer probabilities"
    HIDDEN_STATES = "token hidden states"
    TEACHER_LOGPROBS = "teacher log-probs"
    VERIFIED = "verified step outcomes"
    HISTORIES = "decision-state identities (the messages before each action; optional)"

    @property
    def in_records(self) -> bool:
        """Whether a trajectory record can carry it, so that ``deltattg credit`` and ``inspect`` can run an estimator
        that reads it; the others come from the actor's own forward passes, inside ``deltattg train``."""
        return self in RECORD_INPUTS


RECORD_INPUTS = frozenset({Reads.METER, Reads.STEP_REWARDS, Reads.ANCHORS, Reads.ANSWER_PROBS, Reads.VERIFIED,
                           Reads.HISTORIES})
"""The inputs a trajectory record can carry (``meter``; ``steps[].reward``; the messages or ``steps[].observation``;
``answer_logprobs``; ``steps[].verified``; the messages). Token hidden states and teacher log-probs come only from
the actor's forward passes."""

TRAINER_INPUTS = frozenset({Reads.ANSWER_PROBS, Reads.HIDDEN_STATES, Reads.TEACHER_LOGPROBS})
"""The inputs ``deltattg train`` computes at each step with the actor itself, in the estimator's side pass (a record
may carry answer log-probs too, but during training they are the current actor's)."""

SIDE_PASS = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
"""``module:function``: how a record names its side pass's factory."""


@dataclass(frozen=True)
class Option:
    """A setting of one estimator: a ``CreditConfig`` field (its default is the field's), what it means, and its
    domain as a command line reads it — ``low`` / ``high`` (``low_open``: ``low`` excluded) for a number, ``choices``
    for a word; a bool is a ``--flag`` / ``--no-flag``. ``credit`` and ``inspect`` build their options from these
    records (``deltattg.cli.records.add_credit_options``); ``CreditConfig`` checks the same domains for every other
    caller."""

    name: str
    help: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    choices: tuple[str, ...] = ()
    metavar: str | None = None

    @property
    def default(self) -> Any:
        return CreditConfig.__dataclass_fields__[self.name].default

    @property
    def kind(self) -> type:
        """The setting's type: that of its default, a float where it has none (C)."""
        return float if self.default is None else type(self.default)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


EPSILON = Option("epsilon", "ε of the group standard deviation (Eq. 14)", low=0, low_open=True, high=1)
"""The one setting every estimator reads (its outcome advantage's group normalisation)."""


@dataclass(frozen=True)
class Estimator:
    """One credit estimator: its function and what it reads.

    ``meter_field`` is the field of a meter reading it uses (``can_complete`` for the Token-to-Go and feasibility
    signals, ``logit``, ``score``), ``None`` when it reads no meter; ``needs_failure_cost`` whether C (Eq. 7) must be
    set; ``options`` the ``CreditConfig`` fields it uses beyond ε. ``token_weights``, for an estimator that reads the
    token hidden states (DelTA), turns them into per-token weights ω of its advantage (:data:`TokenWeights`); its
    ``compute`` gives the advantage ω scales. ``teacher_weights``, for an estimator that reads teacher log-probs
    (CrEST), does the same from a privileged self-teacher's pass over the sampled tokens (:data:`TeacherWeights`).

    ``side_pass``, for an estimator that reads what only the actor gives during training (:data:`TRAINER_INPUTS`),
    names the factory of the trainer's side pass that computes it and applies the hooks above, as
    ``"module:function"`` (the function takes the run's ``deltattg.train.side_passes.Setup``). It is a name rather
    than the function so that data flows one way: the credit package stays importable without the trainer (torch
    models, environments), and the record, complete when its module registers it, says where its pass lives; the
    trainer imports it once, when it builds the run.
    """

    name: str
    compute: Compute
    summary: str
    reads: frozenset[Reads] = frozenset()
    meter_field: str | None = None
    needs_failure_cost: bool = False
    options: tuple[Option, ...] = field(default=())
    token_weights: TokenWeights | None = None
    teacher_weights: TeacherWeights | None = None
    side_pass: str | None = None

    def __post_init__(self) -> None:
        if (Reads.HIDDEN_STATES in self.reads) != (self.token_weights is not None):
            raise ValueError(f"estimator {self.name!r}: reading the token hidden states and turning them into token "
                             "weights (token_weights) go together")
        if (Reads.TEACHER_LOGPROBS in self.reads) != (self.teacher_weights is not None):
            raise ValueError(f"estimator {self.name!r}: reading teacher log-probs and turning them into token weights "
                             "(teacher_weights) go together")
        computed = self.reads & TRAINER_INPUTS
        if computed and self.side_pass is None:
            what = ", ".join(r.value for r in sorted(computed))
            raise ValueError(f"estimator {self.name!r} reads {what}, which the trainer computes in a side pass: name "
                             "its factory (side_pass='module:function')")  # fmt: skip
        if self.side_pass is not None and not SIDE_PASS.fullmatch(self.side_pass):
            raise ValueError(f"estimator {self.name!r}: side_pass must be 'module:function', got {self.side_pass!r}")

    def __call__(self, batch: StepBatch, config: CreditConfig) -> Credit:
        return self.compute(batch, config)

    @property
    def needs_meter(self) -> bool:
        return Reads.METER in self.reads

    @property
    def readout(self) -> str:
        """The generative meter's readout that yields :attr:`meter_field`: the completion logit alone, or the answer
        with the logit and the calibrated p̃ beside it (read in the same pass on a shared prefix; the robust
        record's soft readout and trust read p̃)."""
        return "logit" if self.meter_field == "logit" else "both"

    @property
    def actor_reads(self) -> frozenset[Reads]:
        """What it reads from the actor itself (no trajectory record carries it: see :attr:`Reads.in_records`)."""
        return frozenset(r for r in self.reads if not r.in_records)

    def records_problem(self) -> str | None:
        """Why it cannot run on trajectory records (``deltattg credit``, ``inspect``), or ``None`` when it can."""
        if not self.actor_reads:
            return None
        what = ", ".join(r.value for r in sorted(self.actor_reads))
        return f"{self.name} reads the actor's {what}: it runs inside `deltattg train`"

    def queried(self, advantage: Tensor) -> Tensor:
        """Which trajectories the frozen meter reads: those with A_i ≠ 0 (Algorithm 1, line 9); a trajectory with
        A_i = 0 keeps 0 whatever its readings say."""
        return advantage != 0

    def reading_problem(self, readings: Sequence[Sequence[MeterOutput | None]]) -> tuple[int, int] | None:
        """The first ``(trajectory, step)`` whose valid reading lacks :attr:`meter_field`, or ``None`` when every valid
        reading carries it (invalid readings are ``None`` and handled by Algorithm 1's fallback)."""
        if self.meter_field is None:
            return None
        for i, row in enumerate(readings):
            for t, reading in enumerate(row):
                if reading is not None and getattr(reading, self.meter_field) is None:
                    return i, t
        return None

    def inputs(self) -> str:
        """What it reads, for ``deltattg methods``: the outcome, then every further input (the meter with its field;
        an input only the actor gives marked so) and the failure cost C where it must be set."""
        needs = [r.value + (f" ({self.meter_field})" if r is Reads.METER else "")
                 + ("" if r.in_records else " (the actor's: deltattg train only)") for r in sorted(self.reads)]
        needs += ["the failure cost C"] if self.needs_failure_cost else []
        return ", ".join(["outcome", *needs])


_ESTIMATORS: dict[str, Estimator] = {}


def register(estimator: Estimator) -> Estimator:
    if estimator.name in _ESTIMATORS and _ESTIMATORS[estimator.name] != estimator:
        raise ValueError(f"estimator {estimator.name!r} is already registered")
    _ESTIMATORS[estimator.name] = estimator
    return estimator


def register_estimator(name: str, **spec: Any) -> Callable[[Compute], Compute]:
    """``@register_estimator("grpo")`` on a ``(StepBatch, CreditConfig) -> Credit`` function: registers its record
    (``spec``: the :class:`Estimator` fields beyond name, function and summary, which is the docstring's first line)."""

    def decorate(fn: Compute) -> Compute:
        doc = (fn.__doc__ or "").strip()
        register(Estimator(name, fn, doc.splitlines()[0] if doc else "", **spec))
        return fn

    return decorate


def get_estimator(name: str) -> Estimator:
    try:
        return _ESTIMATORS[name]
    except KeyError:
        raise KeyError(f"unknown estimator {name!r}; available: {', '.join(available_estimators())}") from None


def available_estimators() -> list[str]:
    return sorted(_ESTIMATORS)
