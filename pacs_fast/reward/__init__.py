"""Verifiable rewards: math answer equivalence (math-verify) with time limits.

- :func:`math_reward` scores one response (the PACS reference semantics; ``extraction="boxed"`` reads
  only complete ``\\boxed{}`` answers, ``extraction="answer_tag"`` the last ``<answer>...</answer>``).
- :class:`BatchScorer` / :func:`score_batch` score thousands in worker processes, each item within
  a time limit, with counts of timeouts and parse failures.
- :mod:`pacs_fast.reward.code_tests`: code run against test cases (``reward.fn=pacs_fast.reward.code_tests:pass_all``).
"""
from pacs_fast.reward.batch import BatchResult, BatchScorer, get_scorer, score_batch
from pacs_fast.reward.verifier import (DEFAULT_TIME_LIMIT, EXTRACTIONS, STATUSES, ScoredItem, boxed_answers,
                                       gold_parses, math_reward, score_item)

__all__ = ["BatchResult", "BatchScorer", "DEFAULT_TIME_LIMIT", "EXTRACTIONS", "STATUSES", "ScoredItem",
           "boxed_answers", "get_scorer", "gold_parses", "math_reward", "score_batch", "score_item"]
