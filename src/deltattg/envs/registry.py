"""Environments by name, for the command line and the trainer: ``household`` (built in), ``alfworld`` and ``bfcl``
(extras)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deltattg.envs.base import Environment

ENVIRONMENTS = ("household", "alfworld", "bfcl")
DEFAULT_SPLIT = {"household": "train", "alfworld": "train", "bfcl": "base"}
HOUSEHOLD_SIZES = ("short", "full")


def env_factory(
    name: str, *, data: str | None = None, size: str = "full", max_steps: int | None = None, **options: Any
) -> Callable[[], Environment]:
    """A zero-argument constructor of environment ``name`` (each rollout gets its own instance).

    household: ``size`` short (CPU demos) or full, ``options`` are ``HouseholdConfig`` knobs; alfworld: ``data`` is
    the json_2.1.1 folder (default ``$ALFWORLD_DATA``); ``max_steps`` overrides the environment's step limit.
    """
    limit = {} if max_steps is None else {"max_steps": max_steps}
    if name == "household":
        from deltattg.envs.household import HouseholdConfig, HouseholdEnv

        if size not in HOUSEHOLD_SIZES:
            raise ValueError(f"household size must be short or full, got {size!r}")
        knobs = {k: tuple(v) if isinstance(v, list) else v for k, v in {**options, **limit}.items()}
        config = HouseholdConfig.short(**knobs) if size == "short" else HouseholdConfig(**knobs)
        return lambda: HouseholdEnv(config)
    if options:
        raise ValueError(f"environment {name!r} takes no options (got {sorted(options)})")
    if name == "alfworld":
        try:
            from deltattg.envs.alfworld import ALFWorldEnv
        except ImportError as exc:
            raise ImportError("the alfworld environment needs the [alfworld] extra (pip install 'deltattg[alfworld]')") from exc
        return lambda: ALFWorldEnv(data, **limit)
    if name == "bfcl":
        try:
            from deltattg.envs.bfcl import BFCLEnv
        except ImportError as exc:
            raise ImportError("the bfcl environment needs bfcl-eval (pip install --no-deps bfcl-eval mpmath)") from exc
        return lambda: BFCLEnv(**limit)
    raise ValueError(f"unknown environment {name!r}; choose from {', '.join(ENVIRONMENTS)}")


def rebuild(description: dict[str, Any]) -> Callable[[], Environment]:
    """The constructor of the environment a ``describe()`` dict names (``envs.base.Describable``): every option is
    given, so the full-size defaults underneath never show through."""
    if not isinstance(description, dict) or not isinstance(description.get("name"), str):
        raise ValueError(f"an environment description is {{\"name\": ..., \"options\": {{...}}}}, got {description!r}")
    options = description.get("options") or {}
    if not isinstance(options, dict):
        raise ValueError(f"environment options must be a mapping, got {options!r}")
    return env_factory(description["name"], **options)
