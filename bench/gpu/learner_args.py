"""The rows (shapes, learners) and the command line of bench/gpu/learner.py, each value checked when the arguments are
parsed. bench/gpu/lease.sh checks its arguments before its first phase (a mistake must not cost the lease) with this
file alone, which imports no torch (~1.5 s a check)::

    python bench/gpu/learner_args.py --out OUT [the arguments of bench/gpu/learner.py]   # exit 0, or 2 and the error
"""
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


SHAPES = {  # name: (layers, hidden, heads, kv_heads, ffn)
    "qwen2.5-1.5b": (28, 1536, 12, 2, 8960),
    "qwen2.5-0.5b": (24, 896, 14, 2, 4864),
}
TINY = {"tiny": (2, 64, 4, 2, 128)}
LEARNERS = {
    "torch packed varlen": dict(packing="on", packed_attention="varlen"),
    "torch packed varlen + Liger layers": dict(packing="on", packed_attention="varlen", fused_layers="on"),
    "torch padded + SDPA": dict(packing="off"),
    "torch packed dense": dict(packing="on", packed_attention="dense"),
    "megatron packed THD": dict(packing="on", backend="megatron"),
    "megatron packed THD + Liger SwiGLU": dict(packing="on", backend="megatron", fused_layers="on"),
    "megatron padded": dict(packing="off", backend="megatron"),
}


def parser(description: str = "") -> argparse.ArgumentParser:
    """The arguments of bench/gpu/learner.py."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", required=True, help="folder for learner.json and learner.md")
    ap.add_argument("--dry-run", action="store_true", help="CPU, a tiny shape and tiny lengths (seconds)")
    ap.add_argument("--budget-s", type=seconds_arg, default=180.0, help="rows not started after this many seconds")
    ap.add_argument("--steps", type=positive_arg, default=3, help="timed updates per row (median)")
    ap.add_argument("--shapes", type=names_arg(SHAPES, "shapes"), default=",".join(SHAPES))
    ap.add_argument("--lengths", type=lengths_arg, default="4k,mix,16k,32k,1k",
                    help="comma-separated response lengths: <n>k (n x 1,024 tokens), <n> tokens, or mix")
    ap.add_argument("--learners", type=names_arg(LEARNERS, "learners"), default=",".join(LEARNERS))
    ap.add_argument("--recompute", default="auto", choices=("auto", "off", "selective", "full"),
                    help="activation recompute of every row (auto: the least that fits, from the memory model)")
    ap.add_argument("--token-budgets", default=[], type=budgets_arg,
                    help="comma-separated learner.max_tokens_per_micro_batch values (positive integers): one row per "
                         "value (the memory curve; with --recompute), instead of the largest the memory model allows")
    ap.add_argument("--check-args", action="store_true", help="parse the arguments and exit (as this file run "
                                                                   "alone does, without importing torch)")
    return ap


if __name__ == "__main__":
    parser().parse_args()  # (exit 2 with argparse's message on a bad argument)
