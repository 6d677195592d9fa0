"""The process that runs one response's code against its tests (:mod:`pacs_fast.reward.code_tests` starts it as
``python -I code_child.py`` in an empty folder holding ``solution.py`` and the tests' inputs), and the comparisons
the parent judges by.

It reads one job from standard input, ``{"mode", "cases", "setup", "fn_name", "limit", "memory_mb", "stop_early"}``,
and runs each test in a forked process of its own, killed (with every process it started) at ``limit`` seconds;
then it writes one JSON list of statuses to its standard output: ``ran`` (judged by the parent: standard-input tests by
``out{k}.txt``, calls by the JSON of the return value there), ``pass`` / ``fail`` (test code: its asserts held /
one failed), ``timeout`` or ``error`` (an exception, an exit, a signal). The expected outputs never reach this
process: a program that searches its memory finds only its inputs. ``stop_early``: the first test that does not
pass or run ends the job (the rest are missing from the list).

- ``stdio``: the code runs as a script (``__main__``) with ``in{k}.txt`` on file descriptor 0 and ``out{k}.txt``
  on 1 (``input()``, ``sys.stdin.buffer``, ``open(0)`` all read the input); its threads are joined and its
  ``atexit`` functions run before the output is flushed, as at a normal end.
- ``call``: the code runs as module ``solution``, then ``fn_name(*args)`` (a method of ``class Solution`` when it
  defines one); the value is written as JSON (numpy numbers as numbers, tuples as lists, anything else as its
  repr, which never equals a value).
- ``script``: the code runs as module ``solution``, then the ``setup`` statements, then the test: ``{"expr": ...}``
  (an assert of a literal value, ``assert f(3) == 9``: the expression's value is written as JSON, as a call's, and
  the parent judges it) or ``{"code": ...}`` (any other test code; when it ends without an exception the process
  writes a random token drawn for that test, so an exit before the asserts is no pass; a program that reads that
  token from its own memory can forge the pass: such tests run in the process of the code they test, as in every
  MBPP / HumanEval checker).

Each test's process has descriptors 0-2 only, a CPU limit of ``limit + 1`` s, and (with this process) the address
space ``memory_mb`` and files of 64 MiB. This process makes itself the reaper of orphans (a program's
``setsid`` strays come back to it and are killed after each test) and undumpable (other processes of the user
cannot open its descriptors through ``/proc``). Only the standard library is imported: it starts in ~30 ms.
"""
from __future__ import annotations

import builtins
import json
import math
import os
import re
import signal
import stat
import sys
import threading
from decimal import Decimal

FILE_MB = 64  # the largest file the code may write: its captured output included
FLOAT_TOLERANCE = 1e-6
ASSERT_FAILED = 3  # a test process's exit status when an assert failed


_INTEGER = re.compile(r"[+-]?[0-9]+")


def _is_integer_text(x: str) -> bool:
    return _INTEGER.fullmatch(x) is not None


def read_output(path: str) -> str | None:
    """The text of the regular file ``path`` (at most 64 MiB: the size limit), or None when it is anything else:
    a program may leave a symbolic link, a FIFO or a device where its output was (following it had hung the
    reader, or read another file for the output)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, left = [], (FILE_MB << 20) + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


_TRAILING = re.compile(r"[^\S\n]+(?=\n|\Z)")  # white space at each line's end (a "\r" of "\r\n" included)
_TOKEN = re.compile(r"\S+")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def outputs_match(got: str, want: str) -> bool:
    """Standard output ``got`` against ``want``: the same lines, each stripped of trailing white space (trailing
    empty lines ignored), else the same white-space separated tokens, where a number may stand for an expected
    number: an expected integer only as that integer exactly (``2.0`` for ``2``, never ``1000001`` or
    ``1000001.0`` for ``1000000``), another number within :data:`FLOAT_TOLERANCE` (absolute or relative). Read
    lazily: a 64 MiB output is never split into a list."""
    if _TRAILING.sub("", got).rstrip("\n") == _TRAILING.sub("", want).rstrip("\n"):
        return True
    a, b = _TOKEN.finditer(got), _TOKEN.finditer(want)
    while True:
        x, y = next(a, None), next(b, None)
        if x is None or y is None:
            return x is None and y is None
        if not _tokens_match(x.group(), y.group()):
            return False


def _tokens_match(x: str, y: str) -> bool:
    if x == y:
        return True
    if not (_NUMBER.fullmatch(x) and _NUMBER.fullmatch(y)):  # ('1_000', '--5', 'inf', '²': text, compared as text)
        return False
    if _is_integer_text(y):
        return Decimal(x) == Decimal(y)  # (exact, any length: int() refuses over 4,300 digits)
    fx, fy = float(x), float(y)
    return math.isfinite(fx) and math.isfinite(fy) and math.isclose(fx, fy, rel_tol=FLOAT_TOLERANCE,
                                                                    abs_tol=FLOAT_TOLERANCE)


def values_match(got, want) -> bool:
    """A function's return value (as JSON gives it back) against the expected JSON value: floats within
    :data:`FLOAT_TOLERANCE` where the expected value is a float, integers exactly, a bool only as that bool."""
    if isinstance(got, bool) or isinstance(want, bool):
        return got is want
    if isinstance(want, float):
        return isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=FLOAT_TOLERANCE,
                                                              abs_tol=FLOAT_TOLERANCE)
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(values_match(x, y) for x, y in zip(got, want))
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(values_match(got[k], want[k]) for k in got)
    if isinstance(want, int):
        return type(got) is int and got == want or (type(got) is float and got == want)
    return type(got) is type(want) and got == want


def _plain(value):
    """JSON's ``default``: numpy scalars / arrays as numbers / lists, sets as sorted lists, anything else as its
    repr (a string, equal to no expected value unless that value is the same text)."""
    if hasattr(value, "tolist") and callable(value.tolist):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return f"<{type(value).__name__} {value!r:.200}>"


def _limits(memory_mb: int) -> None:
    import resource
    for what, value in ((resource.RLIMIT_AS, int(memory_mb) << 20), (resource.RLIMIT_FSIZE, FILE_MB << 20),
                        (resource.RLIMIT_CORE, 0)):
        try:
            resource.setrlimit(what, (value, value))
        except (ValueError, OSError):  # (a hard limit below ours stays)
            pass


def prctl(option: int, value: int = 0) -> int | None:
    """Linux's ``prctl(option, value)``: its return value, or None where there is none (not Linux: no reaper, no
    undumpable)."""
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        return None


PR_GET_DUMPABLE, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 3, 4, 36


def _children() -> list[int]:
    me, out = os.getpid(), []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for name in entries:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me:
                out.append(int(name))
    return out


def _reap_all() -> None:
    """Kills and reaps every child of this process (the test's process, and the strays that came back to it as
    their reaper), until none is left."""
    for _ in range(1000):
        kids = _children()
        if not kids:
            return
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in kids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


class _Timeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _Timeout()


# what the test's process calls after the code ran, taken before it runs (``builtins.exec = lambda *a: None`` had
# skipped every assert; a patched ``os._exit`` would have let the process return into this harness's loop)
_exec, _eval, _compile, _open, _exit, _dumps = builtins.exec, builtins.eval, builtins.compile, builtins.open, \
    os._exit, json.dumps


def _run_test(job: dict, k: int, case, token: str) -> None:
    """The test's process (after the fork): never returns."""
    status = 1
    try:
        import resource
        import types
        cpu = max(1, math.ceil(float(job["limit"]) + 1.0))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        os.closerange(3, 1 << 16)
        write = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        stdio = job["mode"] == "stdio"  # (a call's or test code's prints go nowhere: its result is written apart)
        for fd, path, flags in ((0, f"in{k}.txt" if stdio else os.devnull, os.O_RDONLY),
                                (1, f"out{k}.txt" if stdio else os.devnull, write if stdio else os.O_WRONLY),
                                (2, os.devnull, os.O_WRONLY)):
            opened = os.open(path, flags, 0o600)
            os.dup2(opened, fd)
            os.close(opened)
        sys.stdin = sys.__stdin__ = _open(0, encoding="utf-8", errors="replace", closefd=False)
        sys.stdout = sys.__stdout__ = _open(1, "w", encoding="utf-8", closefd=False)
        sys.stderr = sys.__stderr__ = _open(2, "w", closefd=False)
        sys.argv = ["solution.py"]
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        with _open("solution.py", encoding="utf-8") as f:
            code = _compile(f.read(), "solution.py", "exec", dont_inherit=True)
        # a module of its own in sys.modules: what the code defines pickles (multiprocessing, pickle)
        module = types.ModuleType("__main__" if stdio else "solution")
        module.__file__ = "solution.py"
        sys.modules[module.__name__] = module
        ns = module.__dict__
        text = None
        try:
            _exec(code, ns)
            if job["mode"] == "call":
                target, name = ns.get("Solution"), job["fn_name"]
                fn = getattr(target(), name, None) if isinstance(target, type) else None
                fn = fn if fn is not None else ns[name]
                text = _dumps(fn(*case), default=_plain)
            elif job["mode"] == "script":
                for setup in job["setup"]:
                    _exec(_compile(setup, "<setup>", "exec", dont_inherit=True), ns)
                if "expr" in case:  # an assert of a literal value: the value goes to the parent, which judges it
                    text = _dumps(_eval(_compile(case["expr"], "<test>", "eval", dont_inherit=True), ns),
                                  default=_plain)
                else:
                    _exec(_compile(case["code"], "<test>", "exec", dont_inherit=True), ns)
                    text = token
            status = 0
        except AssertionError:
            status = ASSERT_FAILED if job["mode"] == "script" else 1
        except SystemExit as e:  # a script may end so; a call or test code may not (it skipped the asserts)
            status = 0 if stdio and e.code in (None, 0) else 1
        if stdio and status == 0:  # as a normal end: the threads joined, the exit functions run
            for t in threading.enumerate():
                if t is not threading.main_thread() and not t.daemon:
                    t.join()
            import atexit
            atexit._run_exitfuncs()
        sys.stdout.flush()
        if status == 0 and text is not None:
            with _open(f"out{k}.txt", "w", encoding="utf-8") as f:
                f.write(text)
    except BaseException:
        status = 1
    _exit(status)


def _wait(pid: int, limit: float):
    """The wait status of ``pid``, or None when it ran past ``limit`` seconds (then it is killed)."""
    status = None
    signal.signal(signal.SIGALRM, _alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            _, status = os.waitpid(pid, 0)  # (woken by its exit: no polling delay)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Timeout:
        pass
    return status


def run_job(job: dict) -> list[str]:
    """The statuses of the job's tests (see the module's docstring), in the current folder."""
    results = []
    for k, case in enumerate(job["cases"]):
        token = os.urandom(16).hex()
        pid = os.fork()
        if pid == 0:
            _run_test(job, k, case, token)
        status = _wait(pid, float(job["limit"]))
        _reap_all()
        if status is None or (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU):
            result = "timeout"
        elif os.WIFEXITED(status) and os.WEXITSTATUS(status) == ASSERT_FAILED:
            result = "fail"
        elif not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            result = "error"
        elif job["mode"] == "script" and "code" in case:
            result = "pass" if read_output(f"out{k}.txt") == token else "error"
        else:  # (an output or a value: the parent judges it)
            result = "ran"
        results.append(result)
        if job["stop_early"] and result not in ("ran", "pass"):  # (all-or-nothing: the rest cannot matter)
            break
    return results


def main() -> None:
    job = json.loads(sys.stdin.read())
    prctl(PR_SET_DUMPABLE, 0)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    _limits(job["memory_mb"])
    results = run_job(job)
    sys.stdout.write(json.dumps(results))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
