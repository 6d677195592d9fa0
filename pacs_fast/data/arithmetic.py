"""The built-in verifiable task: small-integer arithmetic answered in ``\\boxed{}``.

A problem is ``"47+38"``; its prompt (for the character-level tiny model) is ``"47+38="`` and the
expected response is ``"\\boxed{85}"``, checked by the math verifier against the answer ``"85"``.
Operands have 1..``max_digits`` digits (the digit count drawn uniformly, then the value), so the
task mixes easy and harder problems. Train and held-out problems are disjoint.

Records are dicts ``{"id", "problem", "answer", "prompt", "response"}`` (``response`` is the
reference solution, used only by the supervised warm-up).
"""
from __future__ import annotations

import random

OPS = "+-*"


def _operand(rng: random.Random, max_digits: int) -> int:
    d = rng.randint(1, max_digits)
    return rng.randint(0 if d == 1 else 10 ** (d - 1), 10 ** d - 1)


def make_problem(a: int, op: str, b: int) -> dict:
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS!r}, got {op!r}")
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    problem = f"{a}{op}{b}"
    return {"id": problem, "problem": problem, "answer": str(value), "prompt": f"{problem}=",
            "response": f"\\boxed{{{value}}}"}


def arithmetic_splits(train_size: int, eval_size: int, *, seed: int = 0, max_digits: int = 2,
                      ops: str = "+-") -> tuple[list[dict], list[dict]]:
    """Disjoint (train, held-out) lists of distinct problems, deterministic in ``seed``.

    If fewer distinct problems exist than asked for, the training list holds all the rest.
    """
    if max_digits < 1:
        raise ValueError(f"max_digits must be >= 1, got {max_digits}")
    if not ops or set(ops) - set(OPS):
        raise ValueError(f"ops must be a non-empty subset of {OPS!r}, got {ops!r}")
    if train_size < 1 or eval_size < 0:
        raise ValueError(f"train_size must be >= 1 and eval_size >= 0, got {train_size}, {eval_size}")
    total = len(ops) * (10 ** max_digits) ** 2
    if eval_size >= total:
        raise ValueError(f"eval_size={eval_size} leaves no training problems ({total} exist)")
    rng = random.Random(f"arithmetic-{seed}")
    seen: set[str] = set()

    def draw(n: int) -> list[dict]:
        out = []
        # Rejection sampling; for small spaces fall back to enumeration so it terminates.
        tries = 0
        while len(out) < n and tries < 20 * n + 1000:
            tries += 1
            p = make_problem(_operand(rng, max_digits), rng.choice(ops), _operand(rng, max_digits))
            if p["id"] not in seen:
                seen.add(p["id"])
                out.append(p)
        if len(out) < n:
            rest = [make_problem(a, op, b) for op in ops for a in range(10 ** max_digits)
                    for b in range(10 ** max_digits) if f"{a}{op}{b}" not in seen]
            rng.shuffle(rest)
            for p in rest[: n - len(out)]:
                seen.add(p["id"])
                out.append(p)
        return out

    held_out = draw(eval_size)
    train = draw(min(train_size, total - eval_size))
    return train, held_out
