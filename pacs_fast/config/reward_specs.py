"""``reward.fn`` as a list of components and ``reward.fn_weights`` (parsed and checked here, before any model
loads; the mix itself: :mod:`pacs_fast.trainer.reward_mix`). A component is ``verifier`` (the run's math
verifier) or ``module:function``; the weights are >= 0 and sum to 1 (equal when none are given)."""
from __future__ import annotations

import math

VERIFIER = "verifier"
WEIGHT_SUM_TOLERANCE = 1e-6  # (0.7 + 0.2 + 0.1 is 0.9999999999999999 in floats)


def reward_specs(fn: str) -> list[str]:
    """The components of ``reward.fn`` (comma-separated; one for a single function, none when empty)."""
    return [s.strip() for s in str(fn or "").split(",") if s.strip()]


def uses_verifier(fn: str) -> bool:
    """Whether the math verifier scores (``reward.fn`` empty, or ``verifier`` among its components)."""
    specs = reward_specs(fn)
    return not specs or VERIFIER in specs


def user_specs(fn: str) -> list[str]:
    """The ``module:function`` components of ``reward.fn``."""
    return [s for s in reward_specs(fn) if s != VERIFIER]


def is_mix(fn: str, weights) -> bool:
    """Whether ``reward.fn`` / ``reward.fn_weights`` ask for a weighted mix (else one function, or the verifier)."""
    return len(reward_specs(fn)) > 1 or bool(weights)


def component_names(specs: list[str]) -> list[str]:
    """Metric names of the components (``specs`` distinct): ``verifier``, or a function's own name; where two
    share one, each of those is its whole spec (``a:score``, ``b:score``), which no other component has."""
    short = [s.rsplit(":", 1)[-1].rsplit(".", 1)[-1] for s in specs]
    return [s if short.count(n) > 1 else n for s, n in zip(specs, short)]


def same_mix(a: str, b: str) -> bool:
    """Whether two ``reward.fn`` values name the same components in the same order (spaces aside)."""
    return reward_specs(a) == reward_specs(b)


def checked_weights(fn: str, weights, key: str = "reward.fn_weights", fn_key: str = "reward.fn") -> list[float]:
    """The mix's weights (equal when none are given), or a ValueError naming ``key``: one weight per component
    of ``fn_key``, each finite and >= 0, summing to 1; the components are ``verifier`` or ``module:function``,
    each named once."""
    specs = reward_specs(fn)
    bad = [s for s in specs if s != VERIFIER and ":" not in s]
    if bad:
        raise ValueError(f"{fn_key}: {bad[0]!r} is neither 'verifier' (the math verifier) nor 'module:function'")
    twice = sorted({s for s in specs if specs.count(s) > 1})
    if twice:
        raise ValueError(f"{fn_key} names {twice[0]!r} twice (give each component once, with its weight in "
                         f"{key})")
    if not weights:
        return [1.0 / len(specs)] * len(specs) if specs else []
    if len(specs) < 2:
        example = (f"{fn_key} verifier,my_checks:format_score {key} 0.8,0.2" if key.startswith("--") else
                   f"{fn_key}=verifier,my_checks:format_score {key}=[0.8,0.2]")
        given = f"names one, {specs[0]}" if specs else "is empty (the math verifier alone)"
        raise ValueError(f"{key} weighs the components of a list in {fn_key} (e.g. {example}); {fn_key} {given}: "
                         f"leave {key} out")
    try:
        if any(isinstance(w, bool) for w in weights):  # (YAML's true / false are no weights)
            raise TypeError
        values = [float(w) for w in weights]
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be numbers, got {list(weights)!r}") from None
    if len(values) != len(specs):
        raise ValueError(f"{key} has {len(values)} weights for the {len(specs)} components of {fn_key} "
                         f"({', '.join(specs)})")
    if any(not math.isfinite(w) or w < 0 for w in values):
        raise ValueError(f"{key} must be finite and >= 0, got {values}")
    if abs(sum(values) - 1.0) > WEIGHT_SUM_TOLERANCE:
        raise ValueError(f"{key} must sum to 1 (the reward is their weighted sum of rewards in [0, 1], so that it "
                         f"stays in [0, 1]), got {values} (sum {sum(values):g})")
    return values
