"""Reading ``.pt`` files (checkpoints, a meter's head and features) without running code: :func:`safe_load` is
``torch.load(weights_only=True)``, so such a file holds tensors and plain data only, and a file that holds anything else
or is corrupt is a :class:`CheckpointError` naming it. The trainer's checkpoints and the meter's files both read
through it."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import torch

from deltattg.errors import InputError


class CheckpointError(InputError):
    """A checkpoint (or run folder) that cannot be used: corrupt, unsafe, or another run's. Named in the message."""


def safe_load(path: Path) -> Any:
    """``torch.load(path, weights_only=True)``: tensors and plain containers only, never code. A file holding other
    Python objects (a pickle that could run code) or a corrupt one raises :class:`CheckpointError` naming it."""
    try:
        with warnings.catch_warnings():  # torch's note on a foreign pickle protocol: the refusal below says more
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError("missing", path=str(path)) from None
    except pickle.UnpicklingError as exc:
        text = str(exc)
        unsafe = next((line.strip() for line in text.splitlines() if "GLOBAL" in line), None)
        if unsafe:
            raise CheckpointError(f"refused to load: it holds Python objects, not only tensors and plain data "
                                  f"({unsafe}); loading it could run code", path=str(path)) from None  # fmt: skip
        detail = next((line.strip() for line in text.splitlines() if line.strip().startswith("Unsupported")), "")
        raise CheckpointError(f"refused to load: not a file of tensors and plain data{f' ({detail})' if detail else ''}"
                              "; corrupt, or written by something else", path=str(path)) from None  # fmt: skip
    except Exception as exc:  # a truncated zip archive, garbage bytes, an empty file: RuntimeError, EOFError, ...
        raise CheckpointError(f"corrupt checkpoint file ({first_sentence(exc)})", path=str(path)) from None


def first_sentence(exc: BaseException) -> str:
    """The gist of an exception's message (its first sentence, at most 200 characters), or its type."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split(". ")[0].rstrip(".")[:200]
