"""Rewards for code: the response's last fenced code block run against the problem's test cases, each response
in a Python child process of its own (``reward.fn=pacs_fast.reward.code_tests:pass_all``).

    python -m pacs_fast.train data.dataset=code.jsonl data.answer_key=tests \\
        reward.fn=pacs_fast.reward.code_tests:pass_all          # 1 when every test passes, else 0
    reward.fn=pacs_fast.reward.code_tests:pass_fraction          # the share of tests passed, in [0, 1]

``answers[i]`` (the row's ``data.answer_key`` field; a list or an object arrives as its JSON text) holds the tests,
in one of the layouts the public code sets use:

- ``{"inputs": [...], "outputs": [...]}`` (APPS, TACO, PRIME, DeepCoder): standard input -> standard output;
  with ``"fn_name": "f"`` each input is the list of ``f``'s arguments and each output its return value (a
  method of ``class Solution`` when the code defines one; an output given as a one-element list, APPS' habit,
  matches the bare value too);
- ``[{"input": "...", "output": "..."}, ...]`` (LiveCodeBench's, NeMo's): standard input -> standard output;
- ``["assert f(1) == 2", ...]`` (MBPP): each statement one test, run after the code;
- ``"def check(candidate): ...\\ncheck(f)"`` (HumanEval's test program): one test, run after the code.

Standard output matches when its lines, each stripped of trailing white space, equal the expected ones (trailing
empty lines ignored), or, failing that, when the two split into the same white-space separated tokens, numbers
within 1e-6 (absolute or relative). A response with no fenced block (```` ```python ```` or a bare ```` ``` ````)
scores 0.

Each response's tests run in one child process, ``python -I`` (no user site, no ``PYTHON*`` variables) in an
empty temporary folder, in a session of its own (its process group is killed at the end, strays included), with
limits on its address space (``memory_mb``) and file size (64 MiB: the captured output too)
(:mod:`pacs_fast.reward.code_child`). A standard-input test runs the code as a script in a forked process on real
file descriptors (``open(0).read()`` reads the test's input), within ``time_limit_s`` of wall and CPU time;
function-call and test-code tests run in the child itself, each within ``time_limit_s`` (a timer). The child is
killed after all its tests' limits plus 2 s; the tests it did not report fail.
This is isolation against accidents (an endless loop, a memory blow-up, a stray file), NOT a security sandbox:
the code can read and write what the training's user can. Train on untrusted prompts inside a container or VM.

:func:`score` is the function behind both: ``score(responses, tests, *, all_or_nothing, time_limit_s, memory_mb,
workers)``; wrap it in a function of your own for other limits (``reward.fn=my_code:score``).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pacs_fast.reward.code_child import outputs_match, values_match  # noqa: F401 (API)

TIME_LIMIT_S = 5.0  # per test (the public code sets' checkers use 1-10 s)
MEMORY_MB = 4096  # address space of the child (numpy's import reserves ~1 GiB of it)
STATUSES = ("pass", "fail", "timeout", "error")

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+\-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = ("", "python", "py", "python3", "py3")


def extract_code(response: str) -> str | None:
    """The last fenced code block of ``response`` tagged python (or untagged); None when there is none."""
    blocks = [body for tag, body in _FENCE.findall(response) if tag.lower() in _PYTHON_TAGS]
    return blocks[-1] if blocks else None


@dataclass(frozen=True)
class TestCases:
    """Parsed tests: ``mode`` is ``stdio`` (``cases``: (input text, expected output text)), ``call`` (``cases``:
    (argument list, expected value), ``fn_name``) or ``script`` (``cases``: (test code, None))."""
    mode: str
    cases: tuple
    fn_name: str | None = None


def parse_tests(spec) -> TestCases:
    """:class:`TestCases` from one row's tests (JSON text, or the parsed value); a ValueError saying what is
    wrong with them."""
    if isinstance(spec, str):
        text = spec.strip()
        if text[:1] in "[{\"":
            try:
                spec = json.loads(text)
            except ValueError as e:
                raise ValueError(f"the tests are not valid JSON ({e})") from None
        else:  # a test program (HumanEval's check(...)), given as text
            return TestCases("script", ((text, None),))
    if isinstance(spec, str):  # (JSON text of a string: a test program)
        return TestCases("script", ((spec, None),))
    if isinstance(spec, dict):
        if not ("inputs" in spec and "outputs" in spec):
            raise ValueError(f"a test object needs 'inputs' and 'outputs' lists (has {sorted(spec)[:6]})")
        inputs, outputs, fn = spec["inputs"], spec["outputs"], spec.get("fn_name")
        if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
            raise ValueError(f"'inputs' and 'outputs' must be lists of one length (have {_length(inputs)} and "
                             f"{_length(outputs)})")
        if fn:
            if not isinstance(fn, str) or not fn.isidentifier():
                raise ValueError(f"'fn_name' must be a Python name, got {fn!r}")
            args = [a if isinstance(a, list) else [a] for a in inputs]
            return TestCases("call", tuple(zip(args, outputs)), fn)
        return TestCases("stdio", tuple((_text(i, "input"), _text(o, "output")) for i, o in zip(inputs, outputs)))
    if isinstance(spec, list):
        if all(isinstance(t, str) for t in spec):
            return TestCases("script", tuple((t, None) for t in spec))
        if all(isinstance(t, dict) and "input" in t and "output" in t for t in spec):
            kinds = {t.get("testtype", "stdin") for t in spec}
            if kinds - {"stdin"}:
                raise ValueError(f"tests of type {sorted(kinds - {'stdin'})} need a function name: give them as "
                                 f"{{'inputs': [...], 'outputs': [...], 'fn_name': ...}}")
            return TestCases("stdio", tuple((_text(t["input"], "input"), _text(t["output"], "output"))
                                            for t in spec))
        raise ValueError("a test list holds assert statements (strings) or {'input', 'output'} objects")
    raise ValueError(f"tests must be an object, a list or a test program, got {type(spec).__name__}")


def _length(x) -> str:
    return str(len(x)) if isinstance(x, list) else type(x).__name__


def _text(x, what: str) -> str:
    if isinstance(x, list) and all(isinstance(s, str) for s in x):  # (lines, as some sets store them)
        return "\n".join(x)
    if not isinstance(x, str):
        raise ValueError(f"each standard {what} must be text, got {type(x).__name__}")
    return x


STARTUP_S = 2.0  # the child's start-up, beyond its tests' limits
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "code_child.py")


def _child_env() -> dict:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}


def run_tests(code: str, tests: TestCases, *, time_limit_s: float = TIME_LIMIT_S, memory_mb: int = MEMORY_MB,
              stop_early: bool = False) -> list[str]:
    """Runs ``code`` against ``tests`` in a child process (:mod:`pacs_fast.reward.code_child`) in an empty
    temporary folder; each test's status: ``pass``, ``fail`` (a wrong output or return value, a failed assert),
    ``timeout`` or ``error`` (an exception, a non-zero exit, or a child killed before it reported the test).
    ``stop_early``: the tests after the first that does not pass are not run (``error``)."""
    n = len(tests.cases)
    if n == 0:
        return []
    wall = (time_limit_s + 0.1) * n + STARTUP_S
    job = json.dumps({"mode": tests.mode, "cases": list(tests.cases), "fn_name": tests.fn_name,
                      "limit": float(time_limit_s), "memory_mb": int(memory_mb), "stop_early": bool(stop_early)})
    with tempfile.TemporaryDirectory(prefix="pacs_fast_code_") as cwd:
        with open(os.path.join(cwd, "solution.py"), "w", encoding="utf-8") as f:
            f.write(code)
        read, write = os.pipe()
        try:
            proc = subprocess.Popen([sys.executable, "-I", CHILD, str(write)], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd, env=_child_env(),
                                    pass_fds=(write,), start_new_session=True)
        finally:
            os.close(write)
        with os.fdopen(read, "r") as pipe:
            try:
                proc.communicate(job.encode(), timeout=wall)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the session is the child's own: strays go with it
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
            text = pipe.read()
    try:
        results = [r if r in STATUSES else "error" for r in json.loads(text)]
    except (ValueError, TypeError):  # killed, crashed, or broken by the code: its unfinished tests fail
        results = []
    return (results + ["error"] * n)[:n]


def score(responses: list[str], tests: list, *, all_or_nothing: bool = True, time_limit_s: float = TIME_LIMIT_S,
          memory_mb: int = MEMORY_MB, workers: int | None = None) -> list[float]:
    """One reward per response: 1.0 / 0.0 (``all_or_nothing``: every test passes) or the share of its tests that
    pass. ``tests[i]``: response i's tests (JSON text or parsed, :func:`parse_tests`); a ValueError naming the
    response when they cannot be read (before any code runs). ``workers``: child processes at once (default: the
    CPUs this process may use)."""
    if len(tests) != len(responses):
        raise ValueError(f"{len(responses)} responses but {len(tests)} test sets")
    parsed = []
    for i, t in enumerate(tests):
        try:
            parsed.append(parse_tests(t))
        except ValueError as e:
            raise ValueError(f"the tests of response {i} cannot be read: {e}") from None
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    def one(i: int) -> float:
        code, cases = extract_code(responses[i]), parsed[i]
        if code is None or not cases.cases:
            return 0.0
        results = run_tests(code, cases, time_limit_s=time_limit_s, memory_mb=memory_mb, stop_early=all_or_nothing)
        passed = sum(r == "pass" for r in results)
        return float(passed == len(results)) if all_or_nothing else passed / len(results)

    with ThreadPoolExecutor(max_workers=max(1, min(int(workers), len(responses) or 1))) as pool:
        return list(pool.map(one, range(len(responses))))


def check_answer(answer) -> None:
    """A row's tests, read as :func:`score` reads them: a ValueError saying what is wrong, or that there are none.
    The trainer and the eval CLI call it on every row before any model loads (``pass_all.check_answer``)."""
    if not parse_tests(answer).cases:
        raise ValueError("the tests hold no test case (every response would score 0)")


def pass_all(problems: list[str], responses: list[str], answers: list[str]) -> list[float]:
    """``reward.fn``: 1.0 when the response's code passes every test of ``answers[i]``, else 0.0."""
    return score(responses, answers, all_or_nothing=True)


def pass_fraction(problems: list[str], responses: list[str], answers: list[str]) -> list[float]:
    """``reward.fn``: the share of the tests of ``answers[i]`` that the response's code passes."""
    return score(responses, answers, all_or_nothing=False)


pass_all.check_answer = pass_fraction.check_answer = check_answer
