"""Several rewards in one (``reward.fn=verifier,my_checks:format_score reward.fn_weights=[0.8,0.2]``; TRL's
``reward_funcs`` with ``reward_weights``): each response's reward is the weighted sum of its components' rewards,
each in [0, 1], with weights >= 0 that sum to 1, so the sum stays a reward in [0, 1] (PACS's label).

A component is ``verifier`` (the run's math verifier: ``reward.extraction``, ``reward.time_limit_s``,
``train.reward_workers``) or ``module:function``, called as a single ``reward.fn`` is:
``function(problems, responses, answers, **fields)`` (``reward.fn_fields`` go to every function). The mix is
itself such a function (:class:`RewardMix`), so the trainer's scorer memoises it, times it
(``reward.user_fn_timeout_s`` for the whole mix) and checks it as it does one function; it keeps each
component's rewards of its last call (:attr:`RewardMix.last_parts`) for the per-component metrics
``reward/<name>/mean``. A component that returns anything but one number in [0, 1] per response stops the
run with one line naming it.
"""
from __future__ import annotations

from pacs_fast.config.reward_specs import VERIFIER, checked_weights, component_names, reward_specs
from pacs_fast.trainer.user_functions import check_reward_signature, load_callable, user_rewards


class RewardMix:
    """``function(problems, responses, answers, **fields)`` of a weighted mix of components ``(name, callable,
    weight)``; a callable of ``None`` is the math verifier (``verifier``: a
    :class:`~pacs_fast.reward.batch.BatchScorer` from ``verifier_factory()``, made at the first call that needs
    it). ``key``: the setting that names the mix, in errors. After a call, :attr:`last_parts` holds
    ``{name: [reward per response]}``."""

    def __init__(self, components: list[tuple[str, object, float]], *, verifier_factory=None, key: str = "reward.fn"):
        self.components, self.verifier_factory, self.key = components, verifier_factory, key
        self.verifier = None
        self.last_parts: dict[str, list[float]] = {}
        self.running: str | None = None  # the component being called (named when the mix runs out of time)

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.components]

    def __call__(self, problems, responses, answers, **fields) -> list[float]:
        rows = [dict(zip(fields, values)) for values in zip(*fields.values())] if fields else None
        parts: dict[str, list[float]] = {}
        for name, fn, _ in self.components:
            self.running = name
            if fn is None:
                if self.verifier is None:
                    self.verifier = self.verifier_factory()
                parts[name] = [float(x) for x in self.verifier.score(list(responses), list(answers)).scores]
            else:  # (the mix's own time limit covers its components: none of their own)
                parts[name] = user_rewards(fn, problems, responses, answers, key=f"{self.key} component {name}",
                                           timeout_s=None, fields=rows)
        self.last_parts, self.running = parts, None
        totals = [sum(w * parts[name][i] for name, _, w in self.components) for i in range(len(responses))]
        return [min(max(t, 0.0), 1.0) for t in totals]  # (weights summing to 1 within 1e-6)

    def close(self) -> None:
        if self.verifier is not None:
            self.verifier.close()


def make_reward_mix(fn: str, weights, *, keywords: list[str], verifier_factory, key: str = "reward.fn",
                    weights_key: str = "reward.fn_weights", fields_key: str = "reward.fn_fields") -> RewardMix:
    """The :class:`RewardMix` of ``fn`` / ``weights`` (checked: :func:`checked_weights`); each function loaded
    and its signature checked against ``keywords`` (the fields it is handed); ``verifier_factory()``: the
    verifier's batch scorer, made at the mix's first call. A ValueError naming the setting."""
    specs = reward_specs(fn)
    values = checked_weights(fn, weights, weights_key, key)
    components = []
    for name, spec, w in zip(component_names(specs), specs, values):
        if spec == VERIFIER:
            components.append((name, None, w))
            continue
        f = load_callable(spec, key)
        check_reward_signature(f, keywords, f"{key} component {spec!r}", fields_key)
        components.append((name, f, w))
    return RewardMix(components, verifier_factory=verifier_factory, key=key)
