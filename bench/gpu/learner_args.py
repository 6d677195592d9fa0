"""The command-line types of bench/gpu/learner.py: each value checked when the arguments are parsed (bench/gpu/lease.sh
runs ``--check-args`` before its first phase: a mistake must not cost the lease)."""
from __future__ import annotations

import argparse
import math


def budgets_arg(text: str) -> list[int]:
    """``--token-budgets``: positive integers, comma-separated (0 would mean no budget to the learner, and a
    prediction without activations)."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"token budgets are comma-separated integers, got {text!r}") from None
    if any(b < 1 for b in out):
        raise argparse.ArgumentTypeError(f"token budgets must be >= 1, got {text!r}")
    return out


def seconds_arg(text: str) -> float:
    """``--budget-s``: a finite number of seconds > 0 (nan compared false everywhere and ran rows without a model; 0 or
    less starts no row)."""
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not math.isfinite(x) or x <= 0:
        raise argparse.ArgumentTypeError(f"a finite number of seconds > 0, got {text!r}")
    return x


def positive_arg(text: str) -> int:
    """``--steps``: timed updates per row, >= 1 (their median is the row's time)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"a positive integer, got {text!r}")
    return n


def lengths_arg(text: str) -> list[str]:
    """``--lengths``: comma-separated ``<n>k``, ``<n>`` (tokens, >= 1) or ``mix``, each checked here (a bad one had
    ended the run with a traceback, ``0k`` with a division by zero, ``-4k`` timed an 8-token row)."""
    out = [x.strip() for x in text.split(",") if x.strip()]
    for x in out:
        digits = x[:-1] if x.endswith("k") else x
        if x != "mix" and not (digits.isdigit() and int(digits) > 0):
            raise argparse.ArgumentTypeError(f"lengths are <n>k, <n> (tokens, >= 1) or mix, got {x!r} in {text!r}")
    if not out:
        raise argparse.ArgumentTypeError("no length given")
    return out


def names_arg(known, what: str):
    """An argparse type: comma-separated names of ``known`` (spaces around the commas ignored), each checked here
    (an unknown one had become a failed row, and the run went on)."""
    def parse(text: str) -> list[str]:
        out = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in out if x not in known]
        if bad or not out:
            raise argparse.ArgumentTypeError(f"unknown {what} {bad or text!r}; known: {', '.join(known)}")
        return out
    parse.__name__ = what
    return parse
