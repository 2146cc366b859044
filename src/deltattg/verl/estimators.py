"""deltattg's estimators in verl's advantage registry, so that ``algorithm.adv_estimator=deltattg`` resolves.

verl calls a registered estimator with the token-level rewards, the response mask and the uid only; step-level credit
also needs each row's episode, step index and trajectory record. :class:`~deltattg.verl.trainer.DeltaTTGTrainer`
fetches them for the rows of the batch and opens a :func:`step_context` around verl's own advantage step (rollout
correction and all), inside which these functions compute the credit. The token-level rewards are not read: each
episode's outcome is the environment's reward in its record. Called without that context (a plain verl trainer),
they raise an error that says which trainer to use.

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
from deltattg.verl.credit import check_rows_in_step, step_row_credit

VERL_INPUTS = frozenset({Reads.METER, Reads.STEP_REWARDS, Reads.ANCHORS, Reads.VERIFIED, Reads.HISTORIES})
"""What the agent loop's trajectory records give an estimator beyond the outcome (meter readings come from the meter;
the decision states' histories, which ``deltattg_robust`` reads, from each record's messages)."""
METHOD_ATTRIBUTE = "deltattg_method"  # set on every function this module registers: the deltattg estimator it runs


class EstimatorNameTaken(ValueError):
    """verl's advantage registry holds another function under a name deltattg's estimators use."""


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
    """The deltattg estimator behind a verl ``adv_estimator`` name, or None when it is not one of ours. A name of ours
    that verl's registry holds for another function raises ``ValueError``: verl would run that function while the
    deltattg trainer prepared the step for ours."""
    name = str(adv_estimator)
    other = holder(name)
    if other is not None:
        raise ValueError(f"algorithm.adv_estimator={name}: verl's advantage registry holds {_qualified(other)} under "
                         f"that name, not deltattg's {verl_names()[name]} estimator (another plugin, or verl itself, "
                         "registered it first); the deltattg trainer refuses to run it")  # fmt: skip
    return verl_names().get(name)


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
        check_rows_in_step(context.keys, context.padding, context.extra_fields, index, response_mask)
        result = step_row_credit(method, context.config, context.keys, context.padding, context.extra_fields,
                                 response_mask, context.meter)  # fmt: skip
        context.metrics.update(result.metrics)
        return result.advantages, result.advantages

    compute.__name__ = f"deltattg_credit_{method}"
    setattr(compute, METHOD_ATTRIBUTE, method)
    return compute


def holder(name: str) -> Callable[..., Any] | None:
    """The function verl's registry holds under ``name`` when it is not deltattg's estimator for that name (another
    plugin's, or verl's own in a later release); None when the name is free or ours."""
    held = ADV_ESTIMATOR_REGISTRY.get(name)
    if held is None or getattr(held, METHOD_ATTRIBUTE, None) == verl_names().get(name):
        return None
    return held


def _qualified(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def register_estimators() -> list[str]:
    """Register every runnable estimator under its verl name (idempotent); returns the names.

    A name the registry already holds for another function is left to it, as verl's own ``register_adv_est``
    would refuse to replace it: once every free name is registered, :class:`EstimatorNameTaken` names the taken
    ones. (verl hides a plugin's import errors, so :mod:`deltattg.verl.plugin` turns it into a warning; the deltattg
    trainer refuses to run a taken name, :func:`method_of`.)"""
    taken = []
    for name, method in verl_names().items():
        if name not in ADV_ESTIMATOR_REGISTRY:
            register_adv_est(name)(verl_estimator(method))
        elif (other := holder(name)) is not None:
            taken.append(f"{name} (held by {_qualified(other)})")
    if taken:
        raise EstimatorNameTaken(f"verl's advantage registry already holds {', '.join(taken)}: deltattg's estimators "
                                 "of these names are not registered")  # fmt: skip
    return sorted(verl_names())
