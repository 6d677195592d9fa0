"""``python -m pacs_fast.eval --reward-fn module:function``: the user's reward in the math verifier's place
(the trainer's ``reward.fn``, :mod:`pacs_fast.trainer.rewards`): ``function(problems, responses, answers)``,
one number in [0, 1] per response; samples record it with the status ``"user_fn"``. ``--reward-fields
tests,entry_point`` hands it those dataset fields as keyword arguments (the trainer's ``reward.fn_fields``,
:mod:`pacs_fast.config.reward_fields`). Every failure (an import, a signature that cannot take the call,
an exception, a return of the wrong kind) is a :class:`UsageError` naming the flag."""
from __future__ import annotations

from pacs_fast.evaluation.args import UsageError

STATUS = "user_fn"


def reward_field_keywords(spec: str, reward_fn: str) -> dict[str, str]:
    """``--reward-fields a,b.c``'s ``{field name: keyword}`` (empty without it), or a UsageError naming the
    flag (a name that cannot be a keyword, one given twice, the flag without ``--reward-fn``)."""
    if not spec:
        return {}
    from pacs_fast.config.reward_fields import field_keywords

    if not reward_fn:
        raise UsageError("--reward-fields hands dataset fields to --reward-fn; give --reward-fn module:function "
                         "(the math verifier reads no fields)")
    names = [name.strip() for name in spec.split(",") if name.strip()]  # (a stray or trailing comma: nothing)
    if not names:
        raise UsageError(f"--reward-fields {spec!r} names no field (give field names separated by commas)")
    try:
        return field_keywords(names, "--reward-fields")
    except ValueError as e:
        raise UsageError(str(e)) from None


def load_reward_fn(spec: str, keywords: list[str] = (), weights: str = "", verifier_factory=None):
    """``--reward-fn``'s callable (None without it), or a UsageError naming the flag (also when it cannot be
    called as ``function(problems, responses, answers, **{keyword: ...})``). A comma-separated list (``verifier``:
    the math verifier, made by ``verifier_factory()``) is a :class:`~pacs_fast.trainer.reward_mix.RewardMix`
    weighted by ``--reward-weights`` (``weights``: comma-separated, default equal)."""
    if not spec:
        return None
    from pacs_fast.config.reward_specs import is_mix

    values = [w.strip() for w in weights.split(",") if w.strip()]
    if is_mix(spec, values):
        from pacs_fast.trainer.reward_mix import make_reward_mix

        try:
            return make_reward_mix(spec, values, keywords=list(keywords), verifier_factory=verifier_factory,
                                   key="--reward-fn", weights_key="--reward-weights", fields_key="--reward-fields")
        except ValueError as e:
            raise UsageError(str(e)) from None
    if ":" not in spec:
        raise UsageError(f"--reward-fn must look like 'module:function', got {spec!r}")
    from pacs_fast.trainer.user_functions import check_reward_signature, load_callable

    try:
        fn = load_callable(spec, "--reward-fn")
        check_reward_signature(fn, list(keywords), f"--reward-fn {spec}", "--reward-fields")
    except ValueError as e:
        raise UsageError(str(e)) from None
    return fn


class UserScorer:
    """``--reward-fn`` in the batch scorer's place (``score(texts, answers, problems)``, ``close()``)."""

    def __init__(self, fn):
        self.fn = fn

    def score(self, texts: list[str], answers: list[str], problems: list[str], fields: list[dict] | None = None):
        """A :class:`~pacs_fast.reward.batch.BatchResult` of the function's rewards (no time limit: an
        evaluation waits for its scores; Ctrl-C stops it, the samples written so far kept); ``fields``: each
        response's ``{keyword: value}`` of ``--reward-fields``."""
        from pacs_fast.reward.batch import BatchResult
        from pacs_fast.trainer.user_functions import UserFunctionError, user_rewards

        try:
            scores = user_rewards(self.fn, problems, texts, answers, key="--reward-fn", timeout_s=None,
                                  fields=fields)
        except UserFunctionError as e:
            raise UsageError(str(e)) from e
        return BatchResult(scores, [STATUS] * len(scores), {STATUS: len(scores)}, 0.0)

    @property
    def last_parts(self) -> dict[str, list[float]]:
        """A mix of rewards' ``{component name: [reward per response]}`` of the last :meth:`score` call (``{}``
        for one function)."""
        return dict(getattr(self.fn, "last_parts", None) or {})

    def close(self) -> None:
        if hasattr(self.fn, "close"):  # (a mix of rewards: its verifier's workers)
            self.fn.close()
