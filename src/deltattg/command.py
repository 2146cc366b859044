"""What every ``deltattg`` command shares: the exit statuses, the usage error, argparse types for numeric options,
and running a parsed command under the bad-input contract (``deltattg``, ``deltattg train`` and ``deltattg demo``
all go through :func:`run_parsed`)."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from deltattg.errors import InputError, ServiceDown

EXIT_BAD_INPUT = 2
EXIT_NO_READING = 3  # `score`: not one valid reading (nothing written)
EXIT_SERVICE_DOWN = 69  # a server the run depends on kept failing (sysexits' EX_UNAVAILABLE)
EXIT_INTERRUPTED = 130  # Ctrl-C
EXIT_BROKEN_PIPE = 141  # the reader of stdout went away (128 + SIGPIPE, as a shell reports it)


class UsageError(Exception):
    """A bad option combination, reported like argparse does (exit 2)."""


def number(kind: type = float, *, low: float | None = None, high: float | None = None,
           low_open: bool = False) -> Callable[[str], Any]:
    """An argparse ``type``: a finite ``kind`` (float or int) within ``[low, high]`` (``(low, high]`` when
    ``low_open``); anything else is refused at parse time with the range in the message (exit 2)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except (TypeError, ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}")
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if (low is not None and (value < low or (low_open and value == low))) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {_range_text(low, high, low_open)}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _range_text(low: float | None, high: float | None, low_open: bool) -> str:
    def shown(bound: float) -> str:
        return str(bound) if isinstance(bound, int) else f"{bound:g}"

    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{shown(low)}, {shown(high)}]"
    if low is not None:
        return f"{'>' if low_open else '>='} {shown(low)}"
    return f"<= {shown(high)}"  # type: ignore[arg-type]


MAX_SEED = 2**32 - 1
positive_float = number(float, low=0, low_open=True)
probability = number(float, low=0, high=1)
positive_int = number(int, low=1)
seed_int = number(int, low=0, high=MAX_SEED)
failure_cost = number(float, low=0, low_open=True, high=1e12)  # credit.batch.MAX_CREDIT_SETTING


def turn_limit(text: str) -> int | str | None:
    """An argparse ``type`` for ``--turn-limit``: a positive number of turns, ``auto`` or ``none`` (``None``)."""
    if text in ("auto", "none"):
        return None if text == "none" else text
    return number(int, low=1, high=10**6)(text)


@contextlib.contextmanager
def library_bars(shown: bool) -> Iterator[None]:
    """While a command runs with ``--no-progress`` (``shown`` false), transformers draws no progress bars either (its
    "Loading weights"); its switch is put back afterwards. Without transformers installed there is nothing to
    switch."""
    if shown:
        yield
        return
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def run_parsed(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse ``argv`` and run the chosen ``func``: bad input and bad option combinations end with ``PROG COMMAND:
    error: ...`` and exit status 2 (shared by ``deltattg`` and the subcommands that also run on their own)."""
    args = parser.parse_args(argv)
    # the command line as typed (the program and its arguments), for what a command records of itself
    args.command_line = [*parser.prog.split(), *(sys.argv[1:] if argv is None else argv)]
    prog = " ".join(filter(None, [parser.prog, getattr(args, "command", None)]))
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        with library_bars(getattr(args, "progress", True)):
            return func(args)
    except InputError as exc:
        print(f"deltattg: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except UsageError as exc:
        parser.exit(EXIT_BAD_INPUT, f"{prog}: error: {exc}\n")
    except ServiceDown as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_SERVICE_DOWN
    except KeyboardInterrupt:  # outputs are atomic: an interrupted command leaves none half-written
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `deltattg methods | head`: the reader left; say nothing more (Python's advice)
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
