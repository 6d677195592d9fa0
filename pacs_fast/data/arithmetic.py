"""The built-in verifiable task: small-integer arithmetic answered in ``\\boxed{}``.

A problem is ``"47+38"``; its prompt (for the character-level tiny model) is ``"47+38="`` and the
expected response is ``"\\boxed{85}"``, checked by the math verifier against the answer ``"85"``.
Operands have 1..``max_digits`` digits (the digit count drawn uniformly, then the value), so the
task mixes easy and harder problems. With ``terms = 3`` a problem chains two operations
(``"47+38-9"``, the usual precedence: ``*`` before ``+``/``-``, else left to right), a harder,
two-step family (see docs/EFFICACY.md). Train and held-out problems are disjoint.

Records are dicts ``{"id", "problem", "answer", "prompt", "response"}`` (``response`` is the
reference solution, used only by the supervised warm-up).
"""
from __future__ import annotations

import random

OPS = "+-*"


def _operand(rng: random.Random, max_digits: int) -> int:
    d = rng.randint(1, max_digits)
    return rng.randint(0 if d == 1 else 10 ** (d - 1), 10 ** d - 1)


def evaluate_expression(operands: list[int], ops: list[str]) -> int:
    """Value of ``operands[0] ops[0] operands[1] ...`` with ``*`` binding tighter than ``+``/``-``."""
    if len(ops) != len(operands) - 1:
        raise ValueError(f"{len(operands)} operands need {len(operands) - 1} operators, got {len(ops)}")
    terms, signs = [operands[0]], []
    for op, b in zip(ops, operands[1:]):
        if op not in OPS:
            raise ValueError(f"op must be one of {OPS!r}, got {op!r}")
        if op == "*":
            terms[-1] *= b
        else:
            terms.append(b)
            signs.append(1 if op == "+" else -1)
    return terms[0] + sum(s * t for s, t in zip(signs, terms[1:]))


def make_problem(a: int, op: str, b: int, *more) -> dict:
    """A problem from ``a op b [op c ...]`` (``more`` alternates operator, operand)."""
    operands, ops = [a, b] + list(more[1::2]), [op] + list(more[0::2])
    value = evaluate_expression(operands, ops)
    problem = "".join(f"{o}{x}" for o, x in zip([""] + ops, operands))
    return {"id": problem, "problem": problem, "answer": str(value), "prompt": f"{problem}=",
            "response": f"\\boxed{{{value}}}"}


def arithmetic_splits(train_size: int, eval_size: int, *, seed: int = 0, max_digits: int = 2,
                      ops: str = "+-", terms: int = 2) -> tuple[list[dict], list[dict]]:
    """Disjoint (train, held-out) lists of distinct problems, deterministic in ``seed``.

    If fewer distinct problems exist than asked for, the training list holds all the rest.
    """
    if max_digits < 1:
        raise ValueError(f"max_digits must be >= 1, got {max_digits}")
    if not ops or set(ops) - set(OPS):
        raise ValueError(f"ops must be a non-empty subset of {OPS!r}, got {ops!r}")
    if train_size < 1 or eval_size < 0:
        raise ValueError(f"train_size must be >= 1 and eval_size >= 0, got {train_size}, {eval_size}")
    if not 2 <= terms <= 4:
        raise ValueError(f"terms must be in 2..4, got {terms}")
    total = len(ops) ** (terms - 1) * (10 ** max_digits) ** terms
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
            parts = [_operand(rng, max_digits)]
            for _ in range(terms - 1):
                parts += [rng.choice(ops), _operand(rng, max_digits)]
            p = make_problem(*parts)
            if p["id"] not in seen:
                seen.add(p["id"])
                out.append(p)
        if len(out) < n:
            import itertools
            digits = range(10 ** max_digits)
            rest = []
            for nums in itertools.product(digits, repeat=terms):
                for chosen in itertools.product(ops, repeat=terms - 1):
                    parts = [nums[0]] + [x for pair in zip(chosen, nums[1:]) for x in pair]
                    if "".join(map(str, parts)) not in seen:
                        rest.append(make_problem(*parts))
            rng.shuffle(rest)
            for p in rest[: n - len(out)]:
                seen.add(p["id"])
                out.append(p)
        return out

    held_out = draw(eval_size)
    train = draw(min(train_size, total - eval_size))
    return train, held_out
