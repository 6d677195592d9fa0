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
- ``["assert f(1) == 2", ...]`` (MBPP): each statement with an assert one test, run after the code and the
  entries without one (set-up: ``"import math"``);
- ``"def check(candidate): ...\\ncheck(f)"`` (HumanEval's test program): one test, run after the code; a program
  that calls and asserts nothing at its top level (HumanEval's ``test`` field alone) is refused.

The code is the last fenced block tagged python (``py``, ``python3``), else the last untagged one; for a call test,
the last such block that defines the function (an example-usage block after it is not the code). A response
without one scores 0. Standard output matches when its lines, each stripped of trailing white space, equal the
expected ones (trailing empty lines ignored), else when the two split into the same tokens, integers exactly and
other numbers within 1e-6 (absolute or relative); a return value matches with floats within 1e-6 where the
expected value is a float, integers exactly, numpy numbers as numbers.

Each response's tests run in one child process (:mod:`pacs_fast.reward.code_child`), ``python -I`` (no user
site, no ``PYTHON*`` variables) in an empty temporary folder, in a session of its own (killed at the end), with
limits on its address space (``memory_mb``) and file size (64 MiB: the captured output too); each test runs in a
process forked from it, killed at ``time_limit_s`` with every process it started (the child reaps the orphans of
``setsid`` strays and kills them), with descriptors 0-2 only. A standard-input test runs the code as a script
(``__main__``) on real descriptors (``open(0).read()`` reads the test's input); calls and test code load it as
module ``solution``. The expected outputs, return values and literals of ``assert <expression> == <literal>``
(MBPP's shape, judged as a call's value) never reach the child: this process judges them, so a program that
searches its memory, forges the child's report or patches its functions finds nothing to copy; while code runs,
this process is undumpable (another process of a non-root user cannot open its memory or descriptors through
``/proc``). Other test code (HumanEval's ``check``) is judged inside the code's own process, as in every MBPP /
HumanEval checker: an exit before the asserts or a patched ``exec`` earns nothing (a random token proves the end),
but a program that searches its memory for that token, or returns an object equal to everything, can pass one.
This is isolation against accidents and the known reward hacks, NOT a security sandbox: the code can read and
write what the training's user can. Train on untrusted prompts inside a container or VM.

:func:`score` is the function behind both: ``score(responses, tests, *, all_or_nothing, time_limit_s, memory_mb,
workers)``; wrap it in a function of your own for other limits (``reward.fn=my_code:score``).
"""
from __future__ import annotations

import ast
import contextlib
import functools
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pacs_fast.reward.batch import usable_cpus
from pacs_fast.reward.code_child import (PR_GET_DUMPABLE, PR_SET_DUMPABLE, outputs_match,  # noqa: F401 (API)
                                         prctl, read_output, values_match)

TIME_LIMIT_S = 5.0  # per test (the public code sets' checkers use 1-10 s)
MEMORY_MB = 4096  # address space of the child (numpy's import reserves ~1 GiB of it)
STATUSES = ("pass", "fail", "timeout", "error")

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+\-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = ("", "python", "py", "python3", "py3")


def extract_code(response: str, defines: str | None = None) -> str | None:
    """The code of ``response``: its last fenced block tagged python (``py``, ``python3``), else its last untagged
    one (an untagged block after the code is usually a sample's input or output); with ``defines`` (a call
    test's function), the last such block that defines it, when one does. None when there is no block."""
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(response) if tag.lower() in _PYTHON_TAGS]
    tagged = [body for tag, body in blocks if tag]
    pool = tagged or [body for _, body in blocks]
    if defines and pool:
        named = re.compile(rf"^\s*(?:async\s+)?(?:def\s+{re.escape(defines)}\b|class\s+Solution\b)", re.MULTILINE)
        pool = [body for body in pool if named.search(body)] or pool
    return pool[-1] if pool else None


@dataclass(frozen=True)
class TestCases:
    """Parsed tests: ``mode`` is ``stdio`` (``cases``: (input text, expected output text)), ``call`` (``cases``:
    (argument list, expected value), ``fn_name``) or ``script`` (``cases``: (test code, None); ``setup``: the
    statements run before each, an assert list's entries that assert nothing)."""
    mode: str
    cases: tuple
    fn_name: str | None = None
    setup: tuple = ()


def parse_tests(spec) -> TestCases:
    """:class:`TestCases` from one row's tests (JSON text, or the parsed value); a ValueError saying what is
    wrong with them."""
    if isinstance(spec, str):
        text = spec.strip()
        if text[:1] in "[{":
            try:
                spec = json.loads(text)
            except ValueError as e:
                raise ValueError(f"the tests are not valid JSON ({e})") from None
        elif text[:1] == '"' and not text.startswith('"""'):
            try:  # (the JSON text of a test program)
                spec = json.loads(text)
            except ValueError:  # (a program that starts with a string)
                spec = text
        else:
            spec = text
    if isinstance(spec, str) and spec.strip()[:1] in "[{":  # (JSON encoded twice, as some APPS copies hold it)
        return parse_tests(spec)
    if isinstance(spec, str):  # a test program (HumanEval's check(...))
        return TestCases("script", ((_test_program(spec.strip()), None),))
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
            if all(isinstance(a, str) for a in inputs):  # LiveCodeBench's: each argument a JSON line, the output JSON
                args, outputs = [_json_lines(a, "input") for a in inputs], [_json_value(o) for o in outputs]
            else:
                args = [a if isinstance(a, list) else [a] for a in inputs]
            return TestCases("call", tuple(zip(args, outputs)), fn)
        return TestCases("stdio", tuple((_text(i, "input"), _text(o, "output")) for i, o in zip(inputs, outputs)))
    if isinstance(spec, list):
        if all(isinstance(t, str) for t in spec):
            tests = [t for t in spec if _asserts(t)]
            if spec and not tests:
                raise ValueError("a test list of statements holds no assert (its entries without one are run "
                                 "before each test, as its set-up)")
            return TestCases("script", tuple((t, _literal_assert(t)) for t in tests),
                             setup=tuple(t for t in spec if not _asserts(t)))
        if all(isinstance(t, dict) and "input" in t and "output" in t for t in spec):
            kinds = {t.get("testtype", "stdin") for t in spec}
            if kinds - {"stdin"}:
                raise ValueError(f"tests of type {sorted(kinds - {'stdin'})} need a function name: give them as "
                                 f"{{'inputs': [...], 'outputs': [...], 'fn_name': ...}}")
            return TestCases("stdio", tuple((_text(t["input"], "input"), _text(t["output"], "output"))
                                            for t in spec))
        raise ValueError("a test list holds assert statements (strings) or {'input', 'output'} objects")
    raise ValueError(f"tests must be an object, a list or a test program, got {type(spec).__name__}")


def _json_lines(text: str, what: str) -> list:
    """A call's arguments given as text, one JSON value per line (LiveCodeBench's functional tests)."""
    try:
        return [json.loads(line) for line in text.split("\n") if line.strip()]
    except ValueError as e:
        raise ValueError(f"a call's {what} given as text must hold one JSON value per line ({e}): "
                         f"{text[:80]!r}") from None


def _json_value(text):
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        raise ValueError(f"a call's output given as text must be one JSON value: {text[:80]!r}") from None


def _literal_assert(source: str) -> dict | None:
    """``{"expr": <expression>, "want": <value>}`` when ``source`` is one ``assert <expression> == <literal>``
    (either side; MBPP's shape): the parent then judges the expression's value as a call's, and no patch of the
    code's process can pass it. None for any other test code (run and judged in the code's process)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return None
    test = tree.body[0].test
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return None
    for expr, literal in ((test.left, test.comparators[0]), (test.comparators[0], test.left)):
        try:
            value = ast.literal_eval(literal)
            want = json.loads(json.dumps(value, allow_nan=False))  # (tuples as lists, as the value comes back)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            continue
        return {"expr": ast.get_source_segment(source, expr), "want": want}
    return None


def _asserts(source: str) -> bool:
    """Whether ``source`` (Python) holds an assert; a ValueError when it is not Python."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ValueError(f"a test is not Python ({e.msg}, line {e.lineno}): {source[:80]!r}") from None
    return any(isinstance(node, ast.Assert) for node in ast.walk(tree))


def _test_program(source: str) -> str:
    """A test program (HumanEval's ``check``): it must call something at its top level or assert there; a
    program that only defines ``check`` tests nothing (HumanEval's ``test`` field: append ``check(f)``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ValueError(f"the tests are neither JSON nor a Python test program ({e.msg}, line {e.lineno})") from None
    runs = any(isinstance(node, ast.Assert) or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call))
               for node in tree.body)
    if not runs:
        defined = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)]
        hint = (f"it defines {defined[0]}() but never calls it: append e.g. {defined[0]}(<the function>)" if defined
                else "it asserts nothing and calls nothing")
        raise ValueError(f"the test program tests nothing: {hint}")
    return source


def _length(x) -> str:
    return str(len(x)) if isinstance(x, list) else type(x).__name__


def _text(x, what: str) -> str:
    if isinstance(x, list) and all(isinstance(s, str) for s in x):  # (lines, as some sets store them)
        return "".join(x) if all(s.endswith("\n") for s in x) else "\n".join(x)
    if not isinstance(x, str):
        raise ValueError(f"each standard {what} must be text, got {type(x).__name__}")
    return x


STARTUP_S = 2.0  # the child's start-up, beyond its tests' limits
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "code_child.py")


def _child_env() -> dict:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
    if "LD_LIBRARY_PATH" in os.environ:  # (a Python built against libraries a module system adds: HPC, conda)
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    return env


def _run_child(job: str, cwd: str, wall: float) -> tuple[int | None, bytes]:
    """Runs the child on ``job`` in ``cwd`` for at most ``wall`` seconds, then kills its session: (its exit
    status, None when it was killed at ``wall``; its report). The report comes through a socket: a process of the
    user can open another's pipe through ``/proc/<pid>/fd`` and write to it, not a socket."""
    ours, theirs = socket.socketpair()
    try:
        with subprocess.Popen([sys.executable, "-I", CHILD], stdin=subprocess.PIPE, stdout=theirs.fileno(),
                              stderr=subprocess.DEVNULL, cwd=cwd, env=_child_env(), start_new_session=True) as proc:
            theirs.close()
            report, deadline = bytearray(), time.monotonic() + wall
            try:
                proc.stdin.write(job.encode())  # (the child reads it whole before it writes anything)
                proc.stdin.close()
                while len(report) <= MAX_REPORT:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    ours.settimeout(left)
                    chunk = ours.recv(1 << 16)
                    if not chunk:
                        break
                    report += chunk
                returncode = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except (OSError, subprocess.TimeoutExpired):  # (a broken pipe, the deadline: killed below)
                returncode = None
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # the session is the child's own: what is left of it goes too
                except (ProcessLookupError, PermissionError):
                    pass
        return returncode, bytes(report)
    finally:
        ours.close()
        theirs.close()


MAX_REPORT = 1 << 24  # bytes of the child's report read at most (its statuses: ~8 bytes a test)
_dumpable_lock = threading.Lock()
_dumpable_users = [0, None]  # (calls inside, the flag to restore)


@contextlib.contextmanager
def _undumpable():
    """This process undumpable while code runs (Linux): another process of the user, the code's, can then open
    neither its memory (``/proc/<pid>/mem``: the expected outputs) nor its descriptors (``/proc/<pid>/fd``: its
    pipes and files); a process with CAP_SYS_PTRACE (root) still can. Restored after the last call ends."""
    with _dumpable_lock:
        if _dumpable_users[0] == 0:
            _dumpable_users[1] = prctl(PR_GET_DUMPABLE)
            prctl(PR_SET_DUMPABLE, 0)
        _dumpable_users[0] += 1
    try:
        yield
    finally:
        with _dumpable_lock:
            _dumpable_users[0] -= 1
            if _dumpable_users[0] == 0 and _dumpable_users[1] in (1, 2):
                prctl(PR_SET_DUMPABLE, _dumpable_users[1])


@functools.lru_cache(maxsize=None)
def _child_starts() -> None:
    """Runs the child once on no tests (first use in a process): a child that cannot start (a Python that needs
    another environment) raises here, naming why, instead of scoring every response 0."""
    with tempfile.TemporaryDirectory(prefix="pacs_fast_code_", ignore_cleanup_errors=True) as cwd:
        job = json.dumps({"mode": "stdio", "cases": [], "setup": [], "fn_name": None, "limit": 1.0,
                          "memory_mb": MEMORY_MB, "stop_early": False})
        returncode, report = _run_child(job, cwd, 60.0)
    if returncode != 0 or report.strip() != b"[]":
        probe = subprocess.run([sys.executable, "-I", CHILD], input=job.encode(), capture_output=True,
                               cwd=tempfile.gettempdir(), env=_child_env(), timeout=60)
        why = (probe.stderr.decode(errors="replace").strip().splitlines() or [f"exit status {returncode}"])[-1]
        raise RuntimeError(f"the code reward's child process ({sys.executable} -I {CHILD}) cannot run: {why}")


def run_tests(code: str, tests: TestCases, *, time_limit_s: float = TIME_LIMIT_S, memory_mb: int = MEMORY_MB,
              stop_early: bool = False) -> list[str]:
    """Runs ``code`` against ``tests`` in a child process (:mod:`pacs_fast.reward.code_child`: each test in a
    process of its own) in an empty temporary folder, and judges what it printed or returned; each test's status:
    ``pass``, ``fail`` (a wrong output or return value, a failed assert), ``timeout`` or ``error`` (an exception,
    an exit, or a test the child did not report). ``stop_early``: the tests after the first that does not pass
    are not run (``error``). The expected outputs stay in this process; a child killed before its end (by the
    code: it may kill its parent) reports nothing."""
    if not (0 < time_limit_s < math.inf) or memory_mb < 64:
        raise ValueError(f"time_limit_s must be > 0 and finite, memory_mb >= 64; got {time_limit_s}, {memory_mb}")
    n = len(tests.cases)
    if n == 0:
        return []
    _child_starts()
    wall = (time_limit_s + 0.2) * n + STARTUP_S
    if tests.mode == "stdio":
        cases = [None] * n  # (the inputs are files; the expected outputs stay here)
    elif tests.mode == "call":
        cases = [args for args, _ in tests.cases]
    else:
        cases = [{"expr": judged["expr"]} if judged else {"code": test} for test, judged in tests.cases]
    job = json.dumps({"mode": tests.mode, "cases": cases, "setup": list(tests.setup), "fn_name": tests.fn_name,
                      "limit": float(time_limit_s), "memory_mb": int(memory_mb),
                      "stop_early": bool(stop_early)})
    with tempfile.TemporaryDirectory(prefix="pacs_fast_code_", ignore_cleanup_errors=True) as cwd:
        with open(os.path.join(cwd, "solution.py"), "w", encoding="utf-8") as f:
            f.write(code)
        if tests.mode == "stdio":
            for k, (given, _) in enumerate(tests.cases):
                with open(os.path.join(cwd, f"in{k}.txt"), "w", encoding="utf-8") as f:
                    f.write(given)
        with _undumpable():
            returncode, report = _run_child(job, cwd, wall)
        try:  # (a child that did not end on its own: its report, whoever wrote it, counts for nothing)
            statuses = [r if r in STATUSES + ("ran",) else "error" for r in json.loads(report)][:n] \
                if returncode == 0 else []
        except (ValueError, TypeError):  # broken by the code: its tests fail
            statuses = []
        results = [_judge(tests, k, status, cwd) for k, status in enumerate(statuses)]
    return results + ["error"] * (n - len(results))


def _judge(tests: TestCases, k: int, status: str, cwd: str) -> str:
    """A test's status from the child's, judging what it printed (stdio) or returned (a call, an assert of a literal
    value) against the expected value here; only test code (``script`` without a literal) is judged in the child."""
    want = tests.cases[k][1]
    if tests.mode == "script" and want is None:
        return status if status in STATUSES else "error"
    if status != "ran":  # (a pass or fail the child cannot know is a forgery: an error)
        return status if status in ("timeout", "error") else "error"
    got = read_output(os.path.join(cwd, f"out{k}.txt"))  # (a regular file only: not where a link points)
    if got is None:
        return "error"
    try:
        if tests.mode == "stdio":
            return "pass" if outputs_match(got, want) else "fail"
        value, want = json.loads(got), (want["want"] if tests.mode == "script" else want)
        ok = values_match(value, want) or (tests.mode == "call" and isinstance(want, list) and len(want) == 1
                                           and values_match(value, want[0]))
    except (ValueError, RecursionError):  # (the code's own JSON: nested past the parser, a number too long)
        return "error"
    return "pass" if ok else "fail"


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
    if workers is None:  # (under torchrun every rank of a node scores its share at once: each takes its part)
        workers = max(1, usable_cpus() // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)))

    def one(i: int) -> float:
        cases = parsed[i]
        code = extract_code(responses[i], defines=cases.fn_name)
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
