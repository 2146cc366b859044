"""Estimators by name, as in verl's ``register_adv_est``: ``@register_estimator("grpo")`` then ``get_estimator``."""

from __future__ import annotations

from collections.abc import Callable

from deltattg.credit.batch import Credit, CreditConfig, StepBatch

Estimator = Callable[[StepBatch, CreditConfig], Credit]
_ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(name: str) -> Callable[[Estimator], Estimator]:
    def decorate(fn: Estimator) -> Estimator:
        if name in _ESTIMATORS and _ESTIMATORS[name] is not fn:
            raise ValueError(f"estimator {name!r} is already registered")
        _ESTIMATORS[name] = fn
        return fn

    return decorate


def get_estimator(name: str) -> Estimator:
    try:
        return _ESTIMATORS[name]
    except KeyError:
        raise KeyError(f"unknown estimator {name!r}; available: {', '.join(available_estimators())}") from None


def available_estimators() -> list[str]:
    return sorted(_ESTIMATORS)


def describe(name: str) -> str:
    """First line of the estimator's docstring."""
    doc = get_estimator(name).__doc__ or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""
