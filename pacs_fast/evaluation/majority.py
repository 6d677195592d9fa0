"""maj@k: majority-vote accuracy with k samples (Qwen2.5-Math's maj@64, DeepSeek-R1's cons@64).

Per problem, ``n`` responses in the order stored, each with the answer it states (a string, or None: it does not
vote -- no answer extracted, or a status other than ``ok``) and its stored score:

1. **Classes** (:func:`answer_classes`): the distinct answer strings, by descending count (ties: first seen
   first), each join the first existing class whose first string (its most common) they are the same as
   (``same(representative, string)``, :func:`pacs_fast.reward.answers.same_answer`), or open a new one.
   Identical strings are one class without a comparison. The work is bounded: only the :data:`MAX_COMPARED` most
   common strings are compared, with at most :data:`MAX_COMPARISONS` calls of ``same`` per problem (~1 ms each for
   two decimals); each string past either bound is a class of its own (a rare answer: it seldom decides a vote),
   as is one whose comparison ran past the time limit (:func:`slow_answers_skipped`).
2. **Correctness** (:func:`class_correctness`): a class is correct when more than half of its members (over all
   ``n`` responses) have a score above 0.5 (pass@k's :func:`~pacs_fast.evaluation.results.is_correct`). The
   members agree by construction (same answer, same gold); where they do not (math-verify's equivalence is not
   transitive: ``10\\%`` equals both ``10`` and ``0.1``), the majority of the members decides, a tie is incorrect.
3. **maj@k** (:func:`majority_at_k`): the mean over the ``n // k`` disjoint consecutive blocks of ``k`` responses
   of the block's majority correctness: 1 when the class with the most votes in the block is correct, 0 when not;
   ``t`` classes tied at the top give (correct ones among them) / ``t``; a block without a vote gives 0. Each block
   is ``k`` independent samples, so the mean is an unbiased estimate of the majority-vote accuracy with ``k``
   samples; deterministic (no resampling). maj@1 is the share of responses in a correct class.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Sequence

MAX_COMPARED = 256  # distinct answers per problem compared through math-verify (the most common ones)
MAX_COMPARISONS = 4096  # calls of the equivalence per problem (256 distinct decimals, all different: 32,640)


def answer_classes(answers: Sequence[str | None], same: Callable[[str, str], bool],
                   max_compared: int = MAX_COMPARED, max_comparisons: int = MAX_COMPARISONS) -> list[int | None]:
    """The class of each response (list of ``n`` ints numbered 0, 1, ... in order of count; None for a None
    answer) from ``answers`` (``n`` strings or None) and the equivalence ``same(a, b) -> bool`` (module docstring,
    step 1). ``same`` is called at most ``max_comparisons`` times (and at most ``min(distinct, max_compared)`` x
    classes), never on equal strings."""
    counts = Counter(a for a in answers if a is not None)
    first = {}
    for i, a in enumerate(answers):
        if a is not None:
            first.setdefault(a, i)
    order = sorted(counts, key=lambda a: (-counts[a], first[a]))
    reps: list[str] = []
    class_of: dict[str, int] = {}
    calls = 0
    for rank, a in enumerate(order):
        found = None
        for c, rep in enumerate(reps if rank < max_compared else ()):
            if calls >= max_comparisons:
                break
            calls += 1
            if same(rep, a):
                found = c
                break
        if found is None:
            found = len(reps)
            reps.append(a)
        class_of[a] = found
    return [None if a is None else class_of[a] for a in answers]


def class_correctness(classes: Sequence[int | None], correct: Sequence[bool]) -> dict[int, bool]:
    """Class -> whether it is correct: more than half of its members are ``correct`` (``n`` bools, one per
    response; module docstring, step 2)."""
    members: Counter = Counter()
    right: Counter = Counter()
    for c, ok in zip(classes, correct):
        if c is not None:
            members[c] += 1
            right[c] += bool(ok)
    return {c: 2 * right[c] > members[c] for c in members}


def block_credit(classes: Sequence[int | None], class_ok: dict[int, bool]) -> float:
    """The majority correctness of one block of responses (their classes): 0 without a vote; else the share of
    correct classes among those tied for the most votes."""
    votes = Counter(c for c in classes if c is not None)
    if not votes:
        return 0.0
    top = max(votes.values())
    tied = [c for c, v in votes.items() if v == top]
    return sum(class_ok[c] for c in tied) / len(tied)


def majority_at_k(classes: Sequence[int | None], class_ok: dict[int, bool], k: int) -> float:
    """maj@k of one problem: the mean :func:`block_credit` of the ``len(classes) // k`` consecutive blocks of ``k``
    (the last ``len(classes) % k`` responses are left out). ValueError when ``k`` is not in ``[1, n]``."""
    n = len(classes)
    if not 1 <= k <= n:
        raise ValueError(f"majority_at_k: k = {k} is not in [1, n = {n}]")
    blocks = n // k
    return sum(block_credit(classes[b * k:(b + 1) * k], class_ok) for b in range(blocks)) / blocks


def problem_majority(answers: Sequence[str | None], correct: Sequence[bool], ks: Sequence[int],
                     same: Callable[[str, str], bool]) -> dict[int, float]:
    """k -> maj@k of one problem (``answers``, ``correct``: ``n`` each; every k in ``[1, n]``)."""
    if len(answers) != len(correct):
        raise ValueError(f"problem_majority: {len(answers)} answers for {len(correct)} scores")
    classes = answer_classes(answers, same)
    class_ok = class_correctness(classes, correct)
    return {k: majority_at_k(classes, class_ok, k) for k in ks}


# -- samples records --------------------------------------------------------------------------------
def record_answers(rec: dict[str, Any], extraction: str, time_limit: float | None) -> list[str | None] | None:
    """The voting answer of each response of a samples record (``n`` strings or None), or None when the record
    cannot tell (no ``answers`` and no ``responses`` of one per score). Its ``answers`` where it holds them (written
    by the eval), else extracted from its ``responses`` (:func:`pacs_fast.reward.answers.extract_answer`); a
    response whose status is not ``ok`` (``no_answer``, ``timeout``, ``error``, ``gold_error``) does not vote."""
    from pacs_fast.reward.answers import extract_answer
    from pacs_fast.reward.verifier import OK

    n = len(rec["scores"])
    statuses = rec.get("statuses")
    votes = [True] * n if not isinstance(statuses, list) or len(statuses) != n else [s == OK for s in statuses]
    answers = rec.get("answers")
    if answers is None:
        responses = rec.get("responses")
        if not isinstance(responses, list) or len(responses) != n:
            return None
        answers = [extract_answer(r, extraction, time_limit) if v else None for r, v in zip(responses, votes)]
    return [a if v and isinstance(a, str) else None for a, v in zip(answers, votes)]


def records_majority(records: list[dict[str, Any]], ks: Sequence[int], extraction: str,
                     time_limit: float | None, correct=lambda s: float(s) > 0.5) -> dict[str, float] | None:
    """``{str(k): maj@k}`` of a benchmark: the mean over its problem ``records`` of each problem's maj@k (ks within
    every record's ``n``), or None when a record cannot tell its answers (:func:`record_answers`)."""
    totals = dict.fromkeys(ks, 0.0)
    for rec in records:
        answers = record_answers(rec, extraction, time_limit)
        if answers is None:
            return None
        same = slow_answers_skipped(time_limit)  # (per problem)
        for k, v in problem_majority(answers, [correct(s) for s in rec["scores"]], ks, same).items():
            totals[k] += v
    return {str(k): totals[k] / len(records) for k in ks} if records else None


def slow_answers_skipped(time_limit: float | None) -> Callable[[str, str], bool]:
    """:func:`pacs_fast.reward.answers.same_answer` under ``time_limit``, except that an answer whose comparison ran
    past the limit is compared no more (it is "not the same" as any other): answers math-verify cannot compare in
    time (towers of powers, ``9^{9^{9^9}}``) cost one limit each (two when one is a class's representative), not one
    per other class. A timeout does not say which of ``same(a, b)``'s two is slow, and a string with a comparison
    that finished in time is taken for not slow. Else ``b`` (the string being classed, :func:`answer_classes`: never
    more common than ``a``) is; ``a`` (a class's representative, often the most common answer) only when ``b`` was
    compared in time or at ``a``'s second timeout: a representative marked slow for a tower compared with it would
    take no later equal string into its class."""
    from pacs_fast.reward.answers import same_answer

    slow: set[str] = set()
    timed_out: set[str] = set()  # representatives with a timeout
    compared: set[str] = set()   # strings with a comparison that finished in time

    def same(a: str, b: str) -> bool:
        if a in slow or b in slow:
            return False
        verdict = same_answer(a, b, time_limit, on_timeout=None)
        if verdict is None:
            if b not in compared:
                slow.add(b)
            if a not in compared and (b in compared or a in timed_out):
                slow.add(a)
            timed_out.add(a)
        else:
            compared.update((a, b))
        return bool(verdict)

    return same
