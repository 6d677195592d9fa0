"""One call under a wall-clock limit, as the verifier scores an item (:func:`run_limited`).

math-verify's own timeouts use ``signal.alarm`` with whole seconds and are swallowed inside the library, so the
verifier switches them off and bounds each item itself with ``signal.setitimer``: on the main thread only (a
signal is delivered there); from another thread, or with no limit, the call runs unbounded. A caller's pending
timer (pytest-timeout's, say) is paused and re-armed afterwards, its SIGALRM handler restored. Time spent in C
code that no signal interrupts (huge integer powers) is not bounded here: :class:`pacs_fast.reward.BatchScorer`
kills a worker process that overruns.
"""
from __future__ import annotations

import numbers
import signal
import threading
import time
from typing import Callable, TypeVar

DEFAULT_TIME_LIMIT = 5.0   # seconds per item (math-verify's own default per parse / verify call)
# the longest time limit taken: the OS timer overflows near 9.3e9 s, and past a day a limit is no limit
MAX_TIME_LIMIT = 1e6

T = TypeVar("T")


class ItemTimeout(BaseException):
    """Raised by the item alarm. A BaseException so that math-verify's ``except Exception`` does
    not swallow it."""


def check_time_limit(time_limit):
    """``time_limit`` if it is None, 0 (no limit, as None) or a number of seconds in (0, :data:`MAX_TIME_LIMIT`],
    else a ValueError (a string had raised a bare TypeError, NaN named the maximum, -1 meant no limit)."""
    if time_limit is None:
        return None
    if isinstance(time_limit, bool) or not isinstance(time_limit, numbers.Real) or time_limit != time_limit:
        raise ValueError(f"time_limit must be a number of seconds (None: no limit), got {time_limit!r}")
    if not 0 <= time_limit <= MAX_TIME_LIMIT:
        raise ValueError(f"time_limit must be in [0, {MAX_TIME_LIMIT:g}] seconds (0 or None: no limit), got "
                         f"{time_limit}")
    return time_limit


def run_limited(fn: Callable[[], T], time_limit: float | None, *, on_timeout: T, on_error: T) -> T:
    """``fn()``, or ``on_timeout`` when it runs past ``time_limit`` seconds (module docstring: main thread only;
    None / 0: no limit), or ``on_error`` when it raises an ``Exception``."""
    if not time_limit or threading.current_thread() is not threading.main_thread():
        try:
            return fn()
        except Exception:
            return on_error

    def _on_alarm(signum, frame):
        raise ItemTimeout()

    old_handler = signal.signal(signal.SIGALRM, _on_alarm)
    started = time.monotonic()
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, 0)
    limit = float(time_limit) if old_delay <= 0 else min(float(time_limit), old_delay)
    try:
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            return fn()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except ItemTimeout:
        return on_timeout
    except Exception:
        return on_error
    finally:
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay > 0:
            remaining = old_delay - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(remaining, 1e-3), old_interval)
