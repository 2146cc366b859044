"""deltattg's estimators in verl's advantage registry, so that ``algorithm.adv_estimator=deltattg`` resolves.

verl calls a registered estimator with the token-level rewards, the response mask and the uid only; step-level credit
also needs each row's episode, step index and trajectory record. :class:`~deltattg.verl.trainer.DeltaTTGTrainer`
fetches them for the rows of the batch and opens a :func:`step_context` around verl's own advantage step (KL in
reward, rollout correction and all), inside which these functions compute the credit. Called without that context (a
plain verl trainer), they raise an error that says which trainer to use.

verl's own ``grpo`` keeps its name; ours (Eq. 14, one outcome advantage per episode on every step) is ``grpo_step``,
and the DeltaTTG ablations carry a ``deltattg_`` prefix (``deltattg_pos``, ``deltattg_rho0``, ...; ``deltattg_robust``
keeps its name). Registered are the
estimators whose inputs the agent loop's records carry (:data:`VERL_INPUTS`); those that read the actor's own forward
passes (IGPO / A²TGPO's answer probabilities, DelTA's hidden states, CrEST's self-teacher) run inside ``deltattg
train`` only.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch import Tensor
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

from deltattg.credit import CreditConfig, available_estimators, get_estimator
from deltattg.credit.registry import Reads
from deltattg.credit.layouts import StepLayoutError
from deltattg.meter.base import Meter
from deltattg.verl.credit import parse_row_key, step_row_credit

VERL_INPUTS = frozenset({Reads.METER, Reads.STEP_REWARDS, Reads.ANCHORS, Reads.VERIFIED})
"""What the agent loop's trajectory records give an estimator beyond the outcome (meter readings come from the meter)."""


@dataclass
class StepContext:
    """What the advantage step of one training step needs beyond verl's arguments; collects the credit metrics."""

    keys: Sequence[str]
    padding: Sequence[bool]
    extra_fields: Sequence[Mapping[str, Any] | None]
    config: CreditConfig
    meter: Meter | None = None
    metrics: dict[str, float] = field(default_factory=dict)


_CONTEXT: contextvars.ContextVar[StepContext | None] = contextvars.ContextVar("deltattg_step_context", default=None)


@contextlib.contextmanager
def step_context(context: StepContext) -> Iterator[StepContext]:
    token = _CONTEXT.set(context)
    try:
        yield context
    finally:
        _CONTEXT.reset(token)


def verl_name(method: str) -> str:
    """The name of deltattg estimator ``method`` in verl's registry."""
    if method == "grpo":
        return "grpo_step"
    prefixed = get_estimator(method).needs_meter and not method.startswith("deltattg")
    return f"deltattg_{method}" if prefixed else method


def verl_names() -> dict[str, str]:
    """verl name -> deltattg estimator, for every estimator that runs on verl's rows."""
    return {verl_name(m): m for m in available_estimators() if get_estimator(m).reads <= VERL_INPUTS}


def method_of(adv_estimator: str) -> str | None:
    """The deltattg estimator behind a verl ``adv_estimator`` name, or None when it is not one of ours."""
    return verl_names().get(str(adv_estimator))


def verl_estimator(method: str) -> Callable[..., tuple[Tensor, Tensor]]:
    """verl's estimator signature around :func:`step_row_credit`; returns (advantages, returns), both the credit."""

    def compute(token_level_rewards: Tensor, response_mask: Tensor, config: Any = None, index: np.ndarray | None = None,
                **_: Any) -> tuple[Tensor, Tensor]:  # fmt: skip
        context = _CONTEXT.get()
        if context is None:
            raise RuntimeError(f"algorithm.adv_estimator={verl_name(method)} needs deltattg's trainer, which "
                               "hands it each row's episode and step: set trainer.v1.trainer_mode=deltattg")  # fmt: skip
        if len(context.keys) != response_mask.shape[0]:
            raise StepLayoutError(f"{response_mask.shape[0]} rows reached the estimator but the step context has "
                                  f"{len(context.keys)} keys")  # fmt: skip
        if index is not None:
            for key, uid, pad in zip(context.keys, index, context.padding):
                if not pad and parse_row_key(key).group != str(uid):
                    raise StepLayoutError(f"row {key!r} arrived with uid {uid!r}: rows and keys are out of step")
        result = step_row_credit(method, context.config, context.keys, context.padding, context.extra_fields,
                                 response_mask, token_level_rewards.sum(dim=-1), context.meter)  # fmt: skip
        context.metrics.update(result.metrics)
        return result.advantages, result.advantages

    compute.__name__ = f"deltattg_credit_{method}"
    return compute


def register_estimators() -> list[str]:
    """Register every runnable estimator under its verl name (idempotent); returns the names."""
    for name, method in verl_names().items():
        if name not in ADV_ESTIMATOR_REGISTRY:
            register_adv_est(name)(verl_estimator(method))
    return sorted(verl_names())
