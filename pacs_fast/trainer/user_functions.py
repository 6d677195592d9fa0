"""Loading and calling the functions a config names (``reward.fn``, ``reward.appeal``, ``reward.step_rewards``)
safely.

A user function runs with a time limit (``reward.user_fn_timeout_s``) and its return is checked by
type before anything uses it: a list / tuple (or a 1-D numpy array / torch tensor) of numbers or
bools. A string is never iterated by character (``"0000"`` is not four verdicts), ``None`` and nested
lists are refused. Every failure -- a hang, an exception, a bad return -- raises
:class:`UserFunctionError` with one line naming the key; the training loop turns it into a stop that
names the step and saves nothing for it. This module imports nothing from the rest of ``pacs_fast``
(pacs_fast/trainer/rewards.py, reward_mix.py and step_credit.py call it).

A function that never returns cannot be killed from Python: it is left running in a daemon thread
and the run stops (the process exits, the thread with it).

What user code changes of the process that the run's own work reads is put back after each call and after its
module's import: the working directory (a relative ``train.out_dir``: a function that ``chdir``-ed had sent the
run's files elsewhere and stopped it with a traceback; a module that ``chdir``-ed to its folder when imported had
put the run folder there), torch's thread count (the count threads started later take) and, after an import, the
handlers of SIGINT / SIGTERM / SIGHUP (the run's stop; a function's thread cannot set them: Python refuses). The
global RNGs a function draws from are left as they are (the run's own draws are seeded: it trains the same).
"""
from __future__ import annotations

import copy
import importlib
import inspect
import math
import numbers
import os
import signal
import sys
import threading


class UserFunctionError(ValueError):
    """A user function the config names (``reward.appeal``, ``reward.step_rewards``) returned
    something unusable; the trainer stops the run on it with this one-line message."""


def call_with_time_limit(fn, args: tuple, *, key: str, timeout_s: float | None, kwargs: dict | None = None):
    """``fn(*args, **kwargs)``, or UserFunctionError when it raises or runs longer than ``timeout_s`` (None: no
    limit)."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn(*args, **(kwargs or {}))
        except BaseException as e:  # noqa: BLE001 - reported to the caller with the key
            box["error"] = e

    saved = _process_state()
    worker = threading.Thread(target=run, name=f"user-fn {key}", daemon=True)
    worker.start()
    try:
        worker.join(timeout_s)
    finally:
        _restore_process_state(saved)
    if worker.is_alive():
        raise UserFunctionError(f"{key} did not return within {timeout_s:g} s (reward.user_fn_timeout_s)")
    if "error" in box:
        e = box["error"]
        if isinstance(e, UserFunctionError):  # (a mix of rewards: one of its functions, named already)
            raise e
        raise UserFunctionError(f"{key} raised {_described(e)}") from e
    return box["value"]


# the signals whose handlers are the run's own (pacs_fast/signals.py: Ctrl-C, a scheduler's stop, a closed terminal)
_RUN_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


def _process_state() -> tuple:
    """What user code may change that the run reads: the working directory (as a descriptor: a path the code
    renames still leads back), torch's thread count (when torch is loaded) and, from the main thread (a module
    being imported: a function's thread cannot set them), the handlers of the run's stop signals."""
    try:
        cwd = os.open(".", getattr(os, "O_PATH", os.O_RDONLY) | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # (a working directory already gone: nothing to return to)
        cwd = None
    torch = sys.modules.get("torch")
    main = threading.current_thread() is threading.main_thread()
    return cwd, (torch.get_num_threads() if torch is not None else None), \
        ({sig: signal.getsignal(sig) for sig in _RUN_SIGNALS} if main else {})


def _restore_process_state(saved: tuple) -> None:
    cwd, threads, handlers = saved
    if cwd is not None:
        try:
            os.fchdir(cwd)
        finally:
            os.close(cwd)
    torch = sys.modules.get("torch")
    if threads is not None and torch is not None:  # (also the count new threads start with, which a
        torch.set_num_threads(threads)  # set_num_threads in the function's thread changes for the process)
    for sig, handler in handlers.items():
        if handler is not None and signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)


def as_list(value, what: str, key: str) -> list:
    if hasattr(value, "tolist") and getattr(value, "ndim", 1) == 1:  # numpy array, torch tensor
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise UserFunctionError(f"{key} returned {type(value).__name__} {_short(value)} for {what}: expected a list")
    return list(value)


def _described(e: BaseException) -> str:
    """``Type: message`` of an exception on one line (``Type`` alone for an empty message: a bare ``assert``)."""
    try:
        text = one_line(str(e))
    except Exception:  # noqa: BLE001 - an exception whose __str__ fails still names its type
        text = ""
    return f"{type(e).__name__}: {text}" if text else f"{type(e).__name__} (no message)"


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line (runs of whitespace, newlines included, as one space), at most ``limit``
    characters: the stop message of a run is one line."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _short(value) -> str:
    return one_line(repr(value), 60)


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) or (hasattr(x, "item") and getattr(x, "ndim", 1) == 0
                                           and isinstance(x.item(), numbers.Real))


def checked_flags(value, count: int, *, key: str) -> list[bool]:
    """``count`` verdicts (bools, or the numbers 0 / 1) as bools."""
    items = as_list(value, f"{count} responses", key)
    if len(items) != count:
        raise UserFunctionError(f"{key} returned {len(items)} verdicts for {count} responses")
    out = []
    for i, x in enumerate(items):
        if not _is_number(x) or float(x) not in (0.0, 1.0):
            raise UserFunctionError(f"{key} returned {_short(x)} as the verdict of response {i}: expected a bool "
                                    "(or 0 / 1)")
        out.append(bool(float(x)))
    return out


def checked_numbers(value, *, key: str, what: str) -> list[float]:
    """A list of finite numbers (bools count as 0 / 1)."""
    items = as_list(value, what, key)
    out = []
    for x in items:
        if not _is_number(x):
            raise UserFunctionError(f"{key} returned {_short(value)} for {what}: not a list of numbers")
        x = float(x)
        if not math.isfinite(x):
            raise UserFunctionError(f"{key} returned a non-finite reward for {what}: {_short(value)}")
        out.append(x)
    return out


def load_callable(spec: str, key: str):
    """The callable named by ``spec = "module:function"`` (or ``"module:object.attribute"``: a class's
    static method, an instance's method) (the config key ``key``, e.g. ``reward.appeal``); a ValueError
    naming the key when it cannot be imported."""
    module, _, name = spec.partition(":")
    saved = _process_state()  # (a module that chdir-s to its folder when imported: the run's files stay put)
    try:
        fn = importlib.import_module(module)
        for part in name.split("."):
            fn = getattr(fn, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{key}={spec!r} cannot be loaded: {one_line(str(e))}") from e
    except SystemExit as e:  # a module that exits while it is imported (a script's sys.exit)
        raise ValueError(f"{key}={spec!r} cannot be loaded: importing {module} called sys.exit({e.code!r})") from e
    except Exception as e:  # the module itself fails: a SyntaxError, or an error raised while it runs
        raise ValueError(f"{key}={spec!r} cannot be loaded: importing {module} raised {type(e).__name__}: "
                         f"{one_line(str(e))}") from e
    finally:
        _restore_process_state(saved)
    if not callable(fn):
        raise ValueError(f"{key}={spec!r} is not callable")
    return fn


def answer_check(specs: list[str], key: str):
    """One function checking a row's answer text for every reward function of ``specs`` (``module:function``
    names; ``verifier`` and the like skipped) that declares a ``check_answer(answer)`` attribute (raising a
    ValueError that says what is wrong: the code reward's tests that cannot be read), so that a bad row is named
    before any model loads; None when none declares one."""
    checks = [c for c in (getattr(load_callable(s, key), "check_answer", None) for s in specs if ":" in s) if c]
    if not checks:
        return None

    def check(answer: str) -> None:
        for c in checks:
            c(answer)
    return check


def check_reward_signature(fn, keywords: list[str], key: str, fields_setting: str) -> None:
    """A ValueError naming ``key`` when ``fn`` cannot be called as ``fn(problems, responses, answers,
    **{keyword: ...})`` (``keywords``: the fields ``fields_setting`` hands it); nothing when Python
    cannot tell (a builtin without a signature)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind([], [], [], **{kw: [] for kw in keywords})
    except TypeError as e:
        call = ", ".join(["problems", "responses", "answers"] + keywords)
        given = f"the fields of {fields_setting}" if keywords else f"none: {fields_setting} names no dataset field"
        raise ValueError(f"{key} cannot take the call function({call}) (keyword arguments: {given}): {e}; its "
                         f"signature is {signature}") from None


def user_rewards(fn, problems: list[str], texts: list[str], answers: list[str], *, key: str,
                 timeout_s: float | None, fields: list[dict] | None = None) -> list[float]:
    """``fn(problems, texts, answers, **columns)``: one reward in [0, 1] per response, within ``timeout_s``
    (None: no limit); a :class:`~pacs_fast.trainer.user_functions.UserFunctionError` naming ``key`` (the
    setting that names ``fn``) when it raises, hangs, or returns anything else. ``fields``: each response's
    ``{keyword: value}`` (all with the same keywords), handed over as one list per keyword (a copy)."""
    count = len(texts)  # (before the call: a function may change the lists it is given)
    columns = {}
    if fields:  # a copy of each row's values (one per row, shared by its responses: a row of 1 MB of tests was
        # copied once per response, G times), so that a function that edits them edits nothing of the run's
        copies: dict[int, dict] = {}
        for f in fields:
            if id(f) not in copies:
                copies[id(f)] = copy.deepcopy(f)
        columns = {kw: [copies[id(f)][kw] for f in fields] for kw in fields[0]}
    got = call_with_time_limit(fn, (list(problems), list(texts), list(answers)), key=key, timeout_s=timeout_s,
                               kwargs=columns)
    rewards = checked_numbers(got, key=key, what=f"{count} responses")
    if len(rewards) != count:
        raise UserFunctionError(f"{key} returned {len(rewards)} rewards for {count} responses")
    bad = [i for i, r in enumerate(rewards) if not 0.0 <= r <= 1.0]
    if bad:
        raise UserFunctionError(f"{key} returned {rewards[bad[0]]!r} as the reward of response {bad[0]} ({len(bad)} "
                                f"of {count} outside [0, 1]): rewards must lie in [0, 1] (PACS's label; the "
                                f"baselines' advantages assume it too)")
    return rewards
