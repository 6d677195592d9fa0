"""``python -m pacs_fast.eval --reward-fn module:function``: the user's reward in the math verifier's place
(the trainer's ``reward.fn``, :mod:`pacs_fast.trainer.rewards`): ``function(problems, responses, answers)``,
one number in [0, 1] per response; samples record it with the status ``"user_fn"``. Every failure (an
import, an exception, a return of the wrong kind) is a :class:`UsageError` naming the flag."""
from __future__ import annotations

from pacs_fast.evaluation.args import UsageError

STATUS = "user_fn"


def load_reward_fn(spec: str):
    """``--reward-fn``'s callable (None without it), or a UsageError naming the flag."""
    if not spec:
        return None
    if ":" not in spec:
        raise UsageError(f"--reward-fn must look like 'module:function', got {spec!r}")
    from pacs_fast.trainer.rewards import load_callable

    try:
        return load_callable(spec, "--reward-fn")
    except ValueError as e:
        raise UsageError(str(e)) from None


class UserScorer:
    """``--reward-fn`` in the batch scorer's place (``score(texts, answers, problems)``, ``close()``)."""

    def __init__(self, fn):
        self.fn = fn

    def score(self, texts: list[str], answers: list[str], problems: list[str]):
        """A :class:`~pacs_fast.reward.batch.BatchResult` of the function's rewards (no time limit: an
        evaluation waits for its scores; Ctrl-C stops it, the samples written so far kept)."""
        from pacs_fast.reward.batch import BatchResult
        from pacs_fast.trainer.rewards import user_rewards
        from pacs_fast.trainer.user_functions import UserFunctionError

        try:
            scores = user_rewards(self.fn, problems, texts, answers, key="--reward-fn", timeout_s=None)
        except UserFunctionError as e:
            raise UsageError(str(e)) from e
        return BatchResult(scores, [STATUS] * len(scores), {STATUS: len(scores)}, 0.0)

    def close(self) -> None:
        pass
