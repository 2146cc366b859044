"""Settings that document themselves: a dataclass field declared with :func:`setting` carries what it means, and a
command line takes the option's help and default from the field (``deltattg.cli.common.add_setting``), so the library's
default, its documentation and the option never drift apart."""

from __future__ import annotations

from dataclasses import MISSING, field
from typing import Any


def setting(default: Any, help: str) -> Any:
    """A dataclass field with ``default`` and its meaning, ``help`` (what ``--help`` prints)."""
    return field(default=default, metadata={"help": help})


def setting_help(config: type, name: str) -> str:
    """The meaning of ``config``'s field ``name`` (``KeyError`` when it was not declared with :func:`setting`)."""
    return config.__dataclass_fields__[name].metadata["help"]


def setting_default(config: type, name: str) -> Any:
    """The default of ``config``'s field ``name``."""
    default = config.__dataclass_fields__[name].default
    if default is MISSING:
        raise ValueError(f"{config.__name__}.{name} has no default")
    return default
