"""The process that runs one response's code against its tests (:mod:`pacs_fast.reward.code_tests` starts it as
``python -I code_child.py FD`` in an empty folder holding ``solution.py``), and the comparisons it judges by.

It reads one job from standard input, ``{"mode", "cases", "fn_name", "limit", "memory_mb", "stop_early"}``, limits
itself (address space, file size, no core dumps), runs the tests and writes one JSON list of statuses to the file
descriptor ``FD``: ``pass``, ``fail`` (a wrong output or return value, a failed assert), ``timeout`` or ``error``
(an exception, a non-zero exit). A test it did not reach is missing from the list.

- ``stdio``: each test in a forked process of its own, the code run as a script (``__main__``) with the test's
  input file on file descriptor 0 and an output file on 1 (``input()``, ``sys.stdin.buffer``, ``open(0)`` and
  ``os.read(0, n)`` all read the input; the file's size limit bounds a flood of output), within ``limit`` seconds
  of wall time and of CPU time; a fork costs ~1 ms where a new interpreter costs ~30 ms.
- ``call`` / ``script``: in this process, the code executed afresh for each test (a ``__main__`` namespace), then
  the call or the test code, within ``limit`` seconds (a timer); its prints are discarded, and an exit (``exit()``,
  ``sys.exit(0)``: a known way to skip the asserts) is an ``error``.

Only the standard library is imported here: the child starts in ~30 ms.
"""
from __future__ import annotations

import builtins
import io
import json
import math
import os
import signal
import sys

FILE_MB = 64  # the largest file the code may write: its captured output included
FLOAT_TOLERANCE = 1e-6


def outputs_match(got: str, want: str) -> bool:
    """Standard output ``got`` against ``want``: lines equal after stripping each one's trailing white space
    (trailing empty lines ignored), else the same white-space separated tokens, numbers within
    :data:`FLOAT_TOLERANCE` (absolute or relative)."""
    def lines(s):
        out = [line.rstrip() for line in s.replace("\r\n", "\n").split("\n")]
        while out and not out[-1]:
            out.pop()
        return out

    if lines(got) == lines(want):
        return True
    a, b = got.split(), want.split()
    return len(a) == len(b) and all(x == y or _close_text(x, y) for x, y in zip(a, b))


def _close_text(x: str, y: str) -> bool:
    try:
        fx, fy = float(x), float(y)
    except ValueError:
        return False
    return math.isfinite(fx) and math.isfinite(fy) and math.isclose(fx, fy, rel_tol=FLOAT_TOLERANCE,
                                                                    abs_tol=FLOAT_TOLERANCE)


def values_match(got, want) -> bool:
    """A function's return value against the expected JSON value: tuples as lists, floats within
    :data:`FLOAT_TOLERANCE`, a bool only as that bool (``True`` is not ``1``)."""
    if isinstance(got, bool) or isinstance(want, bool):
        return got is want
    if isinstance(got, float) or isinstance(want, float):
        try:
            g, w = float(got), float(want)
        except (TypeError, ValueError):
            return False
        return math.isclose(g, w, rel_tol=FLOAT_TOLERANCE, abs_tol=FLOAT_TOLERANCE)
    if isinstance(got, (list, tuple)) and isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(values_match(x, y) for x, y in zip(got, want))
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(values_match(got[k], want[k]) for k in got)
    return type(got) in (int, str, type(None)) and got == want


def _limit(memory_mb: int) -> None:
    import resource
    for what, value in ((resource.RLIMIT_AS, int(memory_mb) << 20), (resource.RLIMIT_FSIZE, FILE_MB << 20),
                        (resource.RLIMIT_CORE, 0)):
        try:
            resource.setrlimit(what, (value, value))
        except (ValueError, OSError):  # (a hard limit below ours stays)
            pass


class _Timeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _script_test(k: int, limit: float) -> str:
    """Runs ``solution.py`` on ``in{k}.txt`` into ``out{k}.txt`` in a forked process; its status before the output
    is compared: ``ran``, ``timeout`` or ``error``."""
    pid = os.fork()
    if pid == 0:  # the test's process: never returns
        code = 1
        try:
            _limit_cpu(limit + 1.0)
            os.closerange(3, 1 << 16)  # (the report's pipe among them: the code cannot write its own verdicts)
            write = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
            for fd, path, flags in ((0, f"in{k}.txt", os.O_RDONLY), (1, f"out{k}.txt", write),
                                    (2, os.devnull, os.O_WRONLY)):
                opened = os.open(path, flags, 0o600)
                os.dup2(opened, fd)
                os.close(opened)
            sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)
            sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
            sys.stderr = open(2, "w", closefd=False)
            sys.argv = ["solution.py"]
            import runpy
            try:
                runpy.run_path("solution.py", run_name="__main__")
                code = 0
            except SystemExit as e:
                code = 0 if e.code in (None, 0) else 1
            sys.stdout.flush()
        except BaseException:
            code = 1
        os._exit(code)
    status = None
    signal.signal(signal.SIGALRM, _alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            _, status = os.waitpid(pid, 0)  # (woken by the child's exit: no polling delay)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Timeout:
        pass
    if status is None:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):  # (it ended as the limit struck)
            pass
        return "timeout"
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU:
        return "timeout"
    return "ran" if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else "error"


def _limit_cpu(seconds: float) -> None:
    import resource
    try:
        value = max(1, math.ceil(seconds))
        resource.setrlimit(resource.RLIMIT_CPU, (value, value))
    except (ValueError, OSError):
        pass


def _in_process(fn, limit: float) -> tuple[str, object]:
    """``fn()`` within ``limit`` seconds, its prints discarded: (status, value)."""
    real = sys.stdout
    sys.stdout = io.StringIO()
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        return "pass", fn()
    except _Timeout:
        return "timeout", None
    except AssertionError:
        return "fail", None
    except BaseException:  # (SystemExit too: `exit()` before the asserts had passed every test unrun)
        return "error", None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        sys.stdout = real


def run_job(job: dict) -> list[str]:
    """The statuses of the job's tests (see the module's docstring); the code is ``solution.py`` of the current
    folder."""
    mode, limit, results = job["mode"], float(job["limit"]), []
    if mode == "stdio":
        for k, (given, want) in enumerate(job["cases"]):
            with open(f"in{k}.txt", "w", encoding="utf-8") as f:
                f.write(given)
            status = _script_test(k, limit)
            if status == "ran":
                with open(f"out{k}.txt", encoding="utf-8", errors="replace") as f:
                    status = "pass" if outputs_match(f.read(), want) else "fail"
            results.append(status)
            if job["stop_early"] and status != "pass":
                break
        return results
    with open("solution.py", encoding="utf-8") as f:
        source = f.read()
    try:
        code = compile(source, "solution.py", "exec")
    except BaseException:
        return ["error"] * len(job["cases"])

    def fresh():
        ns = {"__name__": "__main__", "__builtins__": builtins}
        exec(code, ns)
        return ns

    for case, want in job["cases"]:
        if mode == "call":
            def call(case=case):
                ns = fresh()
                target = ns.get("Solution")
                fn = getattr(target(), job["fn_name"]) if isinstance(target, type) else ns[job["fn_name"]]
                return fn(*case)

            status, value = _in_process(call, limit)
            if status == "pass" and not (values_match(value, want) or (isinstance(want, list) and len(want) == 1
                                                                       and values_match(value, want[0]))):
                status = "fail"
        else:
            status, _ = _in_process(lambda case=case: exec(compile(case, "<test>", "exec"), fresh()), limit)
        results.append(status)
        if job["stop_early"] and status != "pass":
            break
    return results


def main(argv: list[str]) -> None:
    fd = int(argv[1])
    job = json.loads(sys.stdin.read())
    _limit(job["memory_mb"])
    if job["mode"] != "stdio":  # (its tests run in this process; a stdio test's process limits its own)
        _limit_cpu(float(job["limit"]) * len(job["cases"]) + 2.0)
    results = run_job(job)
    with os.fdopen(fd, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv)
