"""Environments by name, for the command line: ``household`` (built in), ``alfworld`` and ``bfcl`` (extras)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deltattg.envs.base import Environment

ENVIRONMENTS = ("household", "alfworld", "bfcl")
DEFAULT_SPLIT = {"household": "train", "alfworld": "train", "bfcl": "base"}


def env_factory(name: str, *, data: str | None = None, short: bool = False, **options: Any) -> Callable[[], Environment]:
    """A zero-argument constructor of environment ``name`` (each rollout gets its own instance)."""
    if name == "household":
        from deltattg.envs.household import HouseholdConfig, HouseholdEnv

        config = HouseholdConfig.short(**options) if short else HouseholdConfig(**options)
        return lambda: HouseholdEnv(config)
    if name == "alfworld":
        try:
            from deltattg.envs.alfworld import ALFWorldEnv
        except ImportError as exc:
            raise ImportError("the alfworld environment needs the [alfworld] extra (pip install 'deltattg[alfworld]')") from exc
        return lambda: ALFWorldEnv(data, **options)
    if name == "bfcl":
        try:
            from deltattg.envs.bfcl import BFCLEnv
        except ImportError as exc:
            raise ImportError("the bfcl environment needs the [bfcl] extra (see README: BFCL)") from exc
        return lambda: BFCLEnv(**options)
    raise ValueError(f"unknown environment {name!r}; choose from {', '.join(ENVIRONMENTS)}")
