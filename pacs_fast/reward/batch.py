"""Scoring thousands of responses in parallel, each within a time limit.

:class:`BatchScorer` keeps a pool of worker processes (started once, reused across calls). The
parent splits a batch into chunks, gives each idle worker one chunk, and receives one small
message per scored item. Two limits bound the time of every item:

1. inside the worker, a ``signal.setitimer`` alarm stops the item at ``time_limit`` seconds
   (status ``"timeout"``; the worker lives on);
2. the parent knows when each worker's current item started (the previous reply); if no reply
   comes by ``time_limit + grace`` seconds (the item is stuck in C code that signals cannot
   interrupt, e.g. ``10^{10^{10}}`` in big-integer arithmetic) it kills the worker with SIGKILL,
   records ``"timeout"``, starts a replacement and hands it the rest of the chunk.

A crashed worker (segfault, out of memory) gives status ``"error"`` for its current item and is
replaced the same way. Workers are fresh interpreters started with ``subprocess`` (about 1 s
each, once per pool; a replacement costs the same): nothing forks a process that holds a CUDA
context or a model, and the user's ``__main__`` is never re-imported.

Items the verifier's exact fast path decides (an integer gold answer and one boxed integer, see
:mod:`pacs_fast.reward.verifier`) are scored in the parent, in microseconds, and never shipped:
they cannot hang, and a batch made only of them starts no worker.

Example::

    with BatchScorer(num_workers=8, time_limit=5.0) as scorer:
        result = scorer.score(responses, answers)
    result.scores, result.counts["timeout"], result.counts["no_answer"]
"""
from __future__ import annotations

import atexit
import numbers
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Callable, Sequence

from pacs_fast.reward.boxes import HARMONY, with_prompt_think
from pacs_fast.reward.verifier import (DEFAULT_TIME_LIMIT, ERROR, NO_ANSWER, STATUSES, TIMEOUT,
                                       _fast_score, check_extraction, check_time_limit, gold_text, read_part,
                                       score_item, warm_up)


@dataclass
class BatchResult:
    """Scores of one batch, in input order.

    scores: ``float`` per response (1.0 correct, 0.0 otherwise).
    statuses: per response, one of ``pacs_fast.reward.verifier.STATUSES``.
    counts: status -> number of responses (every status present, 0 if absent).
    seconds: wall-clock time of the call.
    """

    scores: list[float]
    statuses: list[str]
    counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def num_timeouts(self) -> int:
        return self.counts.get(TIMEOUT, 0)

    @property
    def num_parse_failures(self) -> int:
        """Responses from which no answer could be extracted."""
        return self.counts.get(NO_ANSWER, 0)


def _worker_main(recv_conn, send_conn, time_limit: float | None, extraction: str = "reference") -> None:
    """Worker loop: receive a chunk ``[(index, response, answer), ...]``, reply per item."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    warm_up()  # imports and grammar caches, untimed: the parent sends items (with deadlines) after "ready"
    send_conn.send("ready")
    while True:
        try:
            chunk = recv_conn.recv()
        except (EOFError, OSError):
            return
        if chunk is None:
            return
        for index, response, answer in chunk:
            item = score_item(response, answer, time_limit, extraction)
            send_conn.send((index, item.score, item.status))


def _worker_entry() -> None:
    """Entry point of a worker interpreter: ``argv = [recv_fd, send_fd, time_limit, extraction]``."""
    try:  # die with the parent even when stuck in C code (Linux)
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass
    recv_fd, send_fd = int(sys.argv[1]), int(sys.argv[2])
    time_limit = None if sys.argv[3] == "none" else float(sys.argv[3])
    _worker_main(Connection(recv_fd, writable=False), Connection(send_fd, readable=False), time_limit, sys.argv[4])


_WORKER_CODE = "import sys; from pacs_fast.reward.batch import _worker_entry; _worker_entry()"


class _Worker:
    """One verifier interpreter started with ``subprocess`` (not ``multiprocessing``: no fork of a
    process holding CUDA state, and no re-import of the user's ``__main__``)."""

    def __init__(self, time_limit: float | None, extraction: str):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = dict(os.environ)
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER_CODE, str(to_child_r), str(from_child_w),
                 "none" if time_limit is None else repr(time_limit), extraction],
                pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL, env=env, close_fds=True)
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self.send_conn = Connection(to_child_w, readable=False)
        self.conn = Connection(from_child_r, writable=False)
        self.ready = False
        self.pending: list[tuple[int, str, str]] = []  # items sent, not yet answered, in order
        self.item_started = 0.0                          # when pending[0] started

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except Exception:
            pass
        self.close_conns()

    def close_conns(self) -> None:
        for c in (self.send_conn, self.conn):
            try:
                c.close()
            except Exception:
                pass



def usable_cpus() -> int:
    """CPUs this process may run on (its affinity, which a batch scheduler's allocation sets)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

class BatchScorer:
    """A reusable pool of verifier processes with a per-item time limit.

    Args:
        num_workers: worker processes (default: usable CPUs, at most 16). ``0`` scores inline in
            the calling process (alarm-based limit only; for debugging and tiny batches).
        time_limit: seconds per item (float).
        grace: extra seconds before the parent kills a worker whose item overran.
        chunk_size: items per message to a worker (smaller chunks are used near the end of a batch).
        worker_alarm: ``False`` switches the in-worker alarm off, leaving every limit to the parent's
            watchdog (kill + replace); the tests use it to exercise that path.
        extraction: what is read from a response: ``"reference"`` | ``"boxed"`` | ``"answer_tag"``
            (pacs_fast/reward/verifier.py, pacs_fast/reward/answer_tag.py).
        think_open: the prompts open a ``<think>`` their responses continue (DeepSeek-R1's generation prompt:
            pacs_fast/reward/boxes.py ``opens_think``): ``"boxed"`` and ``"answer_tag"`` read each response as
            ``<think>`` + response, so that a draft box or tag in a response cut inside its thinking is no answer;
            ``"harmony"`` (gpt-oss's prompts): each response's final channel alone (``final_channel``).
    """

    def __init__(self, num_workers: int | None = None, *, time_limit: float = DEFAULT_TIME_LIMIT,
                 grace: float = 1.0, chunk_size: int = 32,
                 worker_alarm: bool = True, extraction: str = "reference", think_open: bool = False):
        if num_workers is None:
            num_workers = min(usable_cpus(), 16)
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if not time_limit > 0:
            raise ValueError(f"time_limit must be > 0 seconds, got {time_limit}")
        check_time_limit(time_limit)
        if grace < 0:
            raise ValueError(f"grace must be >= 0, got {grace}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.extraction = check_extraction(extraction)
        self.think_open = think_open if think_open == HARMONY else bool(think_open)  # (boxes.py opens_think)
        self.num_workers = num_workers
        self.time_limit = float(time_limit)
        self.grace = float(grace)
        self.chunk_size = chunk_size
        self.worker_alarm = worker_alarm
        self.workers_replaced = 0
        self._startup_failures = 0
        self._workers: list[_Worker] = []
        self._closed = False

    # -- pool management -------------------------------------------------------------------------
    def _start_workers(self) -> None:
        if self._closed:
            raise RuntimeError("BatchScorer is closed")
        while len(self._workers) < self.num_workers:
            self._workers.append(_Worker(self.time_limit if self.worker_alarm else None, self.extraction))

    def _replace(self, w: _Worker) -> _Worker:
        w.kill()
        self.workers_replaced += 1
        new = _Worker(self.time_limit if self.worker_alarm else None, self.extraction)
        self._workers[self._workers.index(w)] = new
        return new

    def close(self) -> None:
        """Stops the workers (idempotent)."""
        self._closed = True
        for w in self._workers:
            try:
                w.send_conn.send(None)
            except Exception:
                pass
        for w in self._workers:  # workers hold no state worth a slow interpreter shutdown
            w.kill()
        self._workers = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- scoring ---------------------------------------------------------------------------------
    def score(self, responses: Sequence[str], answers: Sequence[str] | str,
              callback: Callable[[int], None] | None = None) -> BatchResult:
        """Scores ``responses[i]`` against ``answers[i]`` (or one answer for all).

        ``callback(num_done)`` is called as items finish (for progress bars).
        """
        t0 = time.perf_counter()
        if isinstance(answers, (str, numbers.Number)):  # one gold for all
            answers = [answers] * len(responses)
        if len(answers) != len(responses):
            raise ValueError(f"answers has {len(answers)} items but responses has {len(responses)}")
        answers = [gold_text(a) for a in answers]  # numbers as the verifier reads them; no gold: a ValueError
        responses = with_prompt_think(responses, self.think_open, self.extraction)  # (a prompt's open <think>)
        n = len(responses)
        scores = [0.0] * n
        statuses = [ERROR] * n
        if n:
            if self.num_workers == 0:
                for i, (r, a) in enumerate(zip(responses, answers)):
                    item = score_item(r, a, self.time_limit, self.extraction)
                    scores[i], statuses[i] = item.score, item.status
                    if callback:
                        callback(i + 1)
            else:
                rest = []  # items the fast path does not decide, for the workers
                for i, (r, a) in enumerate(zip(responses, answers)):
                    item = _fast_score(read_part(r, self.extraction), a) if isinstance(r, str) else None
                    if item is None:
                        rest.append(i)
                        continue
                    scores[i], statuses[i] = item.score, item.status
                    if callback:
                        callback(i + 1 - len(rest))
                try:
                    if rest:
                        self._score_parallel(responses, answers, scores, statuses, callback, rest, n - len(rest))
                except BaseException:  # e.g. Ctrl-C: workers may hold stale items; start afresh next time
                    for w in self._workers:
                        w.kill()
                    self._workers = []
                    raise
        counts = Counter(statuses)
        return BatchResult(scores, statuses, {s: counts.get(s, 0) for s in STATUSES},
                           time.perf_counter() - t0)

    def _score_parallel(self, responses, answers, scores, statuses, callback, indices, done_before) -> None:
        """Scores ``responses[i]`` for ``i`` in ``indices`` in the workers; ``callback`` counts on
        from ``done_before`` items already scored."""
        self._start_workers()
        n = done_before + len(indices)
        todo = list(reversed(indices))  # a stack of indices; pop() gives the next in order
        done = done_before
        deadline_s = self.time_limit + self.grace

        def dispatch(w: _Worker) -> None:
            if not todo:
                return
            busy = max(1, len(self._workers))
            size = max(1, min(self.chunk_size, len(todo) // (2 * busy) or 1))
            chunk = []
            for _ in range(min(size, len(todo))):
                i = todo.pop()
                chunk.append((i, responses[i] if isinstance(responses[i], str) else "", answers[i]))
            w.pending = chunk
            w.item_started = time.monotonic()
            try:
                w.send_conn.send(chunk)
            except Exception:  # the worker died before we could send: a fresh one takes the chunk
                self._requeue(w.pending, todo)
                w.pending = []
                self._replace(w)

        def fail_current(w: _Worker, status: str) -> _Worker:
            nonlocal done
            if not w.ready:
                self._startup_failures += 1
                if self._startup_failures > 2 * self.num_workers + 2:
                    raise RuntimeError(
                        f"BatchScorer: verifier worker processes keep dying at start-up (exit code "
                        f"{w.proc.poll()}); check that math-verify imports in a fresh interpreter")
            if w.pending:
                i = w.pending[0][0]
                scores[i], statuses[i] = 0.0, status
                done += 1
                self._requeue(w.pending[1:], todo)
                if callback:
                    callback(done)
            w.pending = []
            return self._replace(w)

        while done < n:
            for w in list(self._workers):
                if w.ready and not w.pending and todo:
                    dispatch(w)
            now = time.monotonic()
            waits = [w.item_started + deadline_s - now for w in self._workers if w.pending]
            timeout = max(0.0, min(waits)) if waits else 1.0
            ready = wait([w.conn for w in self._workers], timeout=timeout)
            by_conn = {id(w.conn): w for w in self._workers}
            for conn in ready:
                w = by_conn.get(id(conn))
                if w is None:
                    continue
                try:
                    while conn.poll():
                        msg = conn.recv()
                        if msg == "ready":
                            w.ready = True
                            continue
                        i, score, status = msg
                        if w.pending and w.pending[0][0] == i:
                            w.pending.pop(0)
                        scores[i], statuses[i] = score, status
                        done += 1
                        w.item_started = time.monotonic()
                        if callback:
                            callback(done)
                except (EOFError, OSError):  # the worker died (crash, OOM kill)
                    fail_current(w, ERROR)
            now = time.monotonic()
            for w in list(self._workers):
                if w.pending and now - w.item_started > deadline_s and not w.conn.poll():
                    fail_current(w, TIMEOUT)  # (a reply already waiting is read next round instead)
                elif not w.ready and not w.alive():
                    fail_current(w, ERROR)

    @staticmethod
    def _requeue(items, todo: list[int]) -> None:
        for i, _, _ in reversed(items):
            todo.append(i)


# -- a shared default scorer -------------------------------------------------------------------
_default: BatchScorer | None = None


def get_scorer(num_workers: int | None = None, time_limit: float = DEFAULT_TIME_LIMIT,
               extraction: str = "reference") -> BatchScorer:
    """A process-wide scorer, created on first use and reused while the settings stay the same."""
    global _default
    if _default is not None and (_default.time_limit != float(time_limit) or _default.extraction != extraction
                                 or (num_workers is not None and _default.num_workers != num_workers)):
        _default.close()
        _default = None
    if _default is None:
        _default = BatchScorer(num_workers, time_limit=time_limit, extraction=extraction)
    return _default


def score_batch(responses: Sequence[str], answers: Sequence[str] | str, *, num_workers: int | None = None,
                time_limit: float = DEFAULT_TIME_LIMIT, extraction: str = "reference",
                callback: Callable[[int], None] | None = None) -> BatchResult:
    """Scores a batch with the shared :func:`get_scorer` pool (see :class:`BatchScorer`)."""
    return get_scorer(num_workers, time_limit, extraction).score(responses, answers, callback=callback)


@atexit.register
def _close_default() -> None:
    if _default is not None:
        _default.close()


__all__ = ["BatchResult", "BatchScorer", "get_scorer", "score_batch"]
