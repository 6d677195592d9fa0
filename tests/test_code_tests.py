"""The code reward (pacs_fast/reward/code_tests.py): the last fenced block run against the row's tests in child
processes, each test layout of the public code sets, the output comparison, limits and clean-up.

Each check runs real child processes (a Python start-up each, ~20-50 ms); the time limits here are short (0.5-1 s)
so that the timeouts cost little, and far above what the passing programs need (a few ms of work each).
"""
import json
import os
import sys
import time

import pytest

from pacs_fast.reward import code_tests as ct


def fenced(code: str, tag: str = "python") -> str:
    return f"Let me solve it.\n```{tag}\n{code}\n```\nDone."


ADD = json.dumps({"inputs": ["1 2\n", "3 4\n", "10 -3\n"], "outputs": ["3\n", "7\n", "7\n"]})


def test_the_last_python_block_is_the_code():
    text = "```python\nfirst()\n```\ntext\n```cpp\nint main(){}\n```\n```\nsecond()\n```\n```py\nthird()\n```"
    assert ct.extract_code(text) == "third()\n"
    assert ct.extract_code("```\nbare()\n```") == "bare()\n"
    assert ct.extract_code("```cpp\nint main(){}\n```") is None
    assert ct.extract_code("print(1)  # no fence") is None
    assert ct.extract_code("```python\nunclosed()") is None


def test_each_layout_of_the_public_sets_is_read():
    t = ct.parse_tests(ADD)
    assert t.mode == "stdio" and t.cases[1] == ("3 4\n", "7\n")
    t = ct.parse_tests(json.dumps([{"input": "1\n", "output": "2\n", "testtype": "stdin"}]))
    assert t.mode == "stdio" and t.cases == (("1\n", "2\n"),)
    t = ct.parse_tests(json.dumps({"inputs": [[1, 2], 5], "outputs": [3, 6], "fn_name": "f"}))
    assert t.mode == "call" and t.fn_name == "f" and t.cases == (([1, 2], 3), ([5], 6))
    t = ct.parse_tests(json.dumps(["assert f(1) == 2", "assert f(2) == 3"]))
    assert t.mode == "script" and len(t.cases) == 2
    t = ct.parse_tests("def check(c):\n    assert c(1) == 2\ncheck(f)")
    assert t.mode == "script" and len(t.cases) == 1
    assert ct.parse_tests({"inputs": [["1", "2"]], "outputs": [["3"]]}).cases == (("1\n2", "3"),)  # lines as lists


@pytest.mark.parametrize("spec, words", [
    ('{"inputs": [1, 2], "outputs": [1]}', "lists of one length (have 2 and 1)"),
    ('{"input": "1", "output": "2"}', "needs 'inputs' and 'outputs'"),
    ('{"inputs": [1], "outputs": [2], "fn_name": "not a name"}', "'fn_name' must be a Python name"),
    ('[{"input": "1", "output": "2", "testtype": "functional"}]', "need a function name"),
    ('{"inputs": ["1", 2], "outputs": ["1", "2"]}', "must be text, got int"),
    ('[1, 2]', "assert statements (strings) or {'input', 'output'} objects"),
    ('{"inputs": [1,', "not valid JSON"),
])
def test_tests_that_cannot_be_read_are_named_before_any_code_runs(spec, words):
    with pytest.raises(ValueError, match="the tests of response 1 cannot be read") as e:
        ct.score([fenced("print(1)")] * 2, [ADD, spec])
    assert words in str(e.value)


def test_output_comparison():
    assert ct.outputs_match("3  \n7\n\n\n", "3\n7")  # trailing white space and empty lines
    assert ct.outputs_match("1 2 3\n", "1\n2\n3\n")  # the same tokens
    assert ct.outputs_match("0.3333333\n", "0.33333333333\n")  # within 1e-6
    assert not ct.outputs_match("0.3334\n", "0.3333\n")
    assert not ct.outputs_match("3\n7\n", "3\n")
    assert not ct.outputs_match("inf\n", "1e308\n")


def test_standard_input_programs_run_as_scripts():
    """Every way a competitive program reads its input works (real file descriptors), and each wrong program
    fails only the tests it gets wrong."""
    tests = ct.parse_tests(ADD)
    readers = ["a, b = map(int, input().split())\nprint(a + b)",
               "import sys\na, b = map(int, sys.stdin.buffer.read().split())\nsys.stdout.write(f'{a + b}\\n')",
               "a, b = map(int, open(0).read().split())\nprint(a + b)",
               "import os\na, b = map(int, os.read(0, 100).split())\nprint(a + b)",
               "def main():\n    print(sum(map(int, input().split())))\nif __name__ == '__main__':\n    main()",
               "import sys\nprint(sum(map(int, input().split())))\nsys.exit(0)"]
    for code in readers:
        assert ct.run_tests(code, tests, time_limit_s=5) == ["pass"] * 3, code
    assert ct.run_tests("print(7)", tests, time_limit_s=5) == ["fail", "pass", "pass"]
    assert ct.run_tests("a, b = map(int, input().split())\nprint(a // (b - 2))", tests, time_limit_s=5) == \
        ["error", "fail", "fail"]  # 1 // 0 raises; 3 // 2 and 10 // -5 print wrong sums
    assert ct.run_tests("import sys\nprint(3)\nsys.exit(1)", tests, time_limit_s=5)[0] == "error"
    assert ct.run_tests("def broken(:\n  pass", tests, time_limit_s=5) == ["error"] * 3
    assert ct.run_tests("print(3)", tests, time_limit_s=5, stop_early=True) == ["pass", "fail", "fail"]  # (the
    # child never sees the expected outputs: it stops early at a timeout or an error only)
    assert ct.run_tests("while True:\n    pass", tests, time_limit_s=0.3, stop_early=True) == ["timeout", "error",
                                                                                             "error"]


def test_limits_end_loops_blow_ups_and_floods():
    tests = ct.parse_tests(json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]}))
    t0 = time.monotonic()
    assert ct.run_tests("while True:\n    pass", tests, time_limit_s=0.5) == ["timeout"]
    assert ct.run_tests("import time\ntime.sleep(60)", tests, time_limit_s=0.5) == ["timeout"]
    assert time.monotonic() - t0 < 20  # (each within its limit plus the start-up allowance)
    assert ct.run_tests("x = bytearray(8 << 30)\nprint(3)", tests, time_limit_s=5, memory_mb=1024) == ["error"]
    t0 = time.monotonic()  # the output file's size limit (64 MiB) ends a flood long before the time limit
    assert ct.run_tests("import sys\nfor _ in range(2000):\n    sys.stdout.write('x' * 65536)\nprint(3)", tests,
                        time_limit_s=30) == ["error"] and time.monotonic() - t0 < 25


def test_strays_and_files_are_cleaned_up(tmp_path):
    """The child's session is killed with it (a process it started is gone), and its folder is removed."""
    mark = tmp_path / "pid"
    code = ("import os, subprocess\np = subprocess.Popen(['sleep', '60'])\n"
            f"open({str(mark)!r}, 'w').write(f'{{p.pid}} {{os.getcwd()}}')\nprint(3)")
    assert ct.run_tests(code, ct.parse_tests(json.dumps([{"input": "", "output": "3"}])), time_limit_s=5) == \
        ["pass"]
    pid, cwd = mark.read_text().split(" ", 1)
    assert not os.path.exists(cwd)
    for _ in range(50):
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":  # killed, not yet reaped by its new parent
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the stray 'sleep 60' (pid {pid}) still runs")


def test_function_calls():
    spec = {"inputs": [[1, 2], [0.1, 0.2], [[1, 2], [3]]], "outputs": [3, 0.3, [[1, 2, 3]]], "fn_name": "add"}
    tests = ct.parse_tests(spec)
    assert ct.run_tests("def add(a, b):\n    return a + b", tests, time_limit_s=5) == ["pass"] * 3  # [x] as x
    assert ct.run_tests("class Solution:\n    def add(self, a, b):\n        return a + b", tests, time_limit_s=5) == \
        ["pass"] * 3
    assert ct.run_tests("def add(a, b):\n    return (a + b) if a != 1 else 4", tests, time_limit_s=5) == \
        ["fail", "pass", "pass"]
    assert ct.run_tests("def add(a, b):\n    print('noise')\n    return tuple(a + b) if isinstance(a, list) "
                        "else a + b", tests, time_limit_s=5) == ["pass"] * 3  # (a tuple is JSON's list)
    assert ct.run_tests("def add(a, b):\n    return True", ct.parse_tests({"inputs": [[0, 0]], "outputs": [1],
                                                                           "fn_name": "add"}), time_limit_s=5) == \
        ["fail"]  # True is not 1
    assert ct.run_tests("def other(a, b):\n    return a + b", tests, time_limit_s=5) == ["error"] * 3
    loop = "def add(a, b):\n    while a == 1:\n        pass\n    return a + b"
    assert ct.run_tests(loop, tests, time_limit_s=0.5) == ["timeout", "pass", "pass"]


def test_test_code():
    asserts = ct.parse_tests(["assert f(3) == 9", "assert f(-2) == 4", "assert f(0) == 1"])
    assert ct.run_tests("def f(x):\n    return x * x", asserts, time_limit_s=5) == ["pass", "pass", "fail"]
    program = ct.parse_tests("def check(candidate):\n    assert candidate(3) == 9\ncheck(f)")
    assert ct.run_tests("def f(x):\n    return x * x", program, time_limit_s=5) == ["pass"]
    assert ct.run_tests("import os\nos._exit(0)", asserts, time_limit_s=5) == ["error"] * 3  # no report: failed


def test_score_all_or_nothing_and_fraction():
    responses = [fenced("a, b = map(int, input().split())\nprint(a + b)"), fenced("print(7)"), "no code at all",
                 fenced("a, b = map(int, input().split())\nprint(a + b)", tag="cpp")]
    tests = [ADD] * 4
    assert ct.score(responses, tests, time_limit_s=5) == [1.0, 0.0, 0.0, 0.0]
    assert ct.score(responses, tests, all_or_nothing=False, time_limit_s=5) == [1.0, 2 / 3, 0.0, 0.0]
    assert ct.pass_all(["p"], responses[:1], [ADD]) == [1.0]
    assert ct.pass_fraction(["p"], responses[1:2], [ADD]) == [pytest.approx(2 / 3)]
    with pytest.raises(ValueError, match="2 responses but 1 test sets"):
        ct.score(responses[:2], tests[:1])


def test_a_training_run_scores_code_with_it(tmp_path):
    """reward.fn names it like any user function: a JSONL of problems with test objects (data.answer_key=tests)
    trains, and the held-out evaluation and the samples hold its rewards (the tiny model writes no code: every
    reward is 0; the scoring itself is checked above)."""
    import subprocess

    from pacs_fast.data.tiny import make_tiny_model

    make_tiny_model(tmp_path / "m")
    rows = [{"problem": f"Print {i} + 1.", "tests": {"inputs": [""], "outputs": [str(i + 1)]}} for i in range(40)]
    data = tmp_path / "code.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cmd = [sys.executable, "-m", "pacs_fast.train", f"data.dataset={data}", "data.answer_key=tests",
           f"model.path={tmp_path / 'm'}", "reward.fn=pacs_fast.reward.code_tests:pass_all",
           "data.instruction=Write a Python program in a ```python block.", "data.eval_size=4",
           "rollout.n=2", "rollout.eval_n=1", "rollout.max_new_tokens=4", "train.prompts_per_step=2",
           "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=2", "train.steps=1", "train.progress=false",
           "train.threads=1", "train.plots=false", "train.tensorboard=false", f"train.out_dir={tmp_path}",
           "train.run_name=code", "train.log_samples=2"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    from pacs_fast.trainer.metrics import read_jsonl
    records = read_jsonl(tmp_path / "code" / "metrics.jsonl")
    assert [r["step"] for r in records if r["kind"] == "eval"] == [0, 1]
    assert all(r["eval/acc"] == 0.0 for r in records if r["kind"] == "eval")  # (no code, no pass)
    samples = read_jsonl(tmp_path / "code" / "samples.jsonl")
    assert len(samples) == 2 and all(s["reward"] == 0.0 and s["answer"].startswith('{"inputs"') for s in samples)


def test_known_ways_to_skip_the_tests_earn_nothing():
    """Policies trained on unit-test rewards learn to end the process before the asserts run (`exit(0)` at the top)
    or to return an object equal to everything: neither passes. A standard-input program may still end with
    sys.exit(0) (it printed its answer)."""
    asserts = ct.parse_tests(["assert f(3) == 9"])
    for code in ["import sys\nsys.exit(0)\ndef f(x):\n    return 0", "exit()\n", "raise SystemExit",
                 "import os\nos._exit(0)", "def f(x):\n    import sys\n    sys.exit(0)"]:
        assert ct.run_tests(code, asserts, time_limit_s=5) == ["error"], code
    calls = ct.parse_tests({"inputs": [[3]], "outputs": [9], "fn_name": "f"})
    always = "class Any:\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return Any()"
    assert ct.run_tests(always, calls, time_limit_s=5) == ["fail"]
    assert ct.run_tests("def f(x):\n    exit(0)", calls, time_limit_s=5) == ["error"]
    fake = "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'[\"pass\"]')\n    except OSError:\n" \
           "        pass\nos._exit(0)"  # (a standard-input test's process holds no descriptor but 0, 1 and 2)
    assert ct.run_tests(fake, ct.parse_tests(ADD), time_limit_s=5) == ["fail"] * 3


def test_rows_whose_tests_cannot_be_read_are_named_before_any_model_loads(tmp_path, capsys):
    """A row with unreadable (or no) tests had stopped the run at the held-out evaluation, after the model loaded;
    the reward's check_answer now names the file, row and field while the data loads, in the trainer and the eval
    CLI alike."""
    from pacs_fast import eval as ev
    from pacs_fast.config import load_config
    from pacs_fast.trainer.problems import load_problems

    rows = [{"problem": f"p{i}", "tests": {"inputs": ["1"], "outputs": ["2"]}} for i in range(20)]
    rows[7]["tests"] = {"inputs": ["1", "2"], "outputs": ["2"]}
    rows[9]["tests"] = {"inputs": [], "outputs": []}
    data = tmp_path / "code.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, [f"data.dataset={data}", "data.answer_key=tests",
                             "reward.fn=pacs_fast.reward.code_tests:pass_fraction"])
    with pytest.raises(ValueError, match=r"code.jsonl:8: field 'tests': 'inputs' and 'outputs' must be lists of one "
                                         r"length \(have 2 and 1\) \(reward.fn=pacs_fast.reward.code_tests:"
                                         r"pass_fraction reads it\)"):
        load_problems(cfg)
    data.write_text("".join(json.dumps(r) + "\n" for i, r in enumerate(rows) if i != 7))
    with pytest.raises(ValueError, match=r"code.jsonl:9: field 'tests': the tests hold no test case"):
        load_problems(cfg)
    from pacs_fast.data.tiny import make_tiny_model

    make_tiny_model(tmp_path / "m")
    assert ev.main(["--model", str(tmp_path / "m"), "--benchmarks", str(data), "--answer-field", "tests",
                    "--reward-fn", "pacs_fast.reward.code_tests:pass_all", "--out", str(tmp_path / "ev")]) == 2
    err = capsys.readouterr().err
    assert "code.jsonl:9: field 'tests': the tests hold no test case" in err
    # the default instruction asks for a boxed answer, never a code block: warned, as the trainer warns
    assert "warning: --reward-fn pacs_fast.reward.code_tests:... scores the last fenced code block" in err
    assert ev.main(["--model", str(tmp_path / "m"), "--benchmarks", str(data), "--answer-field", "tests",
                    "--instruction", "", "--reward-fn", "pacs_fast.reward.code_tests:pass_all",
                    "--out", str(tmp_path / "ev")]) == 2
    assert "fenced code block" not in capsys.readouterr().err
    assert len(load_problems(load_config(None, [f"data.dataset={data}", "data.answer_key=tests"]))[0]) > 0  # (no
    # code reward: the verifier reads answers as text, no such check)


S3 = json.dumps({"inputs": ["3\n1 2 3\n", "2\n5 5\n", "1\n7\n"], "outputs": ["6\n", "10\n", "7\n"]})
C3 = {"inputs": [[1, 2], [3, 4], [10, 20]], "outputs": [3, 7, 30], "fn_name": "add"}


def test_the_expected_outputs_never_reach_the_code():
    """A hostile sweep's forgeries (2026-12-01), each of which had scored 1: reading `want` from the harness's frames
    or its gc objects, writing verdicts to its report descriptor or through /proc, patching its comparison. The
    child now gets the inputs only; the parent judges outputs and return values."""
    stdio, calls = ct.parse_tests(S3), ct.parse_tests(C3)
    frames = ("import sys\nf = sys._getframe()\nwhile f is not None and 'want' not in f.f_locals:\n    f = f.f_back\n"
              "sys.stdout.write(f.f_locals['want'] if f else 'none')")
    gc_walk = ("import gc, sys\nfor o in gc.get_objects():\n    if isinstance(o, dict) and 'cases' in o and "
               "'stop_early' in o:\n        print(o)\n")
    proc_fd = ("import os, json\npp = os.getppid()\ntry:\n    w = os.open(f'/proc/{pp}/fd/1', os.O_WRONLY)\n"
               "    os.write(w, json.dumps(['ran'] * 3).encode())\nexcept OSError:\n    pass\nos.kill(pp, 9)")
    for code in (frames, gc_walk, proc_fd):
        assert "pass" not in ct.run_tests(code, stdio, time_limit_s=5), code
    patch = "import __main__\n__main__.values_match = lambda a, b: True\ndef add(a, b):\n    return 0"
    call_frames = ("import sys\ndef add(a, b):\n    f = sys._getframe()\n    while f is not None and 'want' not in "
                   "f.f_locals:\n        f = f.f_back\n    return f.f_locals['want'] if f else 0")
    for code in (patch, call_frames):
        assert "pass" not in ct.run_tests(code, calls, time_limit_s=5), code


def test_strays_that_leave_the_session_are_killed(tmp_path):
    """A `setsid` stray had outlived score(), and one holding the report's pipe kept score() waiting 40 s; the
    child reaps its orphans and kills them after each test. (A program that kills the child itself can still leave
    one: the README says so; only a container or a cgroup contains that.)"""
    mark = tmp_path / "pid"
    code = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n"
            f"    open({str(mark)!r}, 'w').write(str(os.getpid()))\n    time.sleep(60)\n    os._exit(0)\n"
            "time.sleep(0.3)\ndef add(a, b):\n    return a + b")
    t0 = time.monotonic()
    assert ct.run_tests(code, ct.parse_tests(C3), time_limit_s=5) == ["pass"] * 3
    assert time.monotonic() - t0 < 20
    pid = mark.read_text()
    time.sleep(0.2)
    state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] if os.path.exists(f"/proc/{pid}") else "-"
    assert state in ("-", "Z"), f"the setsid stray (pid {pid}) still runs"


def test_numbers_and_values_are_compared_as_they_should_be():
    """Integers match exactly (a relative 1e-6 had let 1000001 pass for 1000000 and answers mod 1e9+7 be off by
    ~1000); floats within 1e-6; numpy numbers as numbers."""
    assert not ct.outputs_match("1000001\n", "1000000\n")
    assert not ct.outputs_match("999999999", "1000000006")
    assert ct.outputs_match("0.1000000001", "0.1") and ct.outputs_match("5000050000", "5000050000")
    assert not ct.values_match(1000001.0, 1000000) and not ct.values_match(1000001, 1000000)
    assert ct.values_match(2.0, 2) and ct.values_match(0.30000000000000004, 0.3)
    tests = ct.parse_tests({"inputs": [[[1, 2, 3]]], "outputs": [6], "fn_name": "total"})
    assert ct.run_tests("import numpy as np\ndef total(xs):\n    return np.sum(xs)", tests, time_limit_s=10) == ["pass"]


def test_common_program_shapes_that_had_failed():
    """A thread not joined (the Codeforces recursion template), output written at exit, sys.__stdout__; a module's
    demo block (calls and asserts load the code as a module, not __main__)."""
    stdio = ct.parse_tests(S3)
    body = "def main():\n    input()\n    print(sum(map(int, input().split())))\n"
    shapes = [body + "import sys, threading\nsys.setrecursionlimit(1 << 25)\nthreading.stack_size(1 << 26)\n"
                     "threading.Thread(target=main).start()",
              "import atexit, io, sys\nbuf = io.StringIO()\ninput()\nbuf.write(str(sum(map(int, input().split()))) + "
              "'\\n')\natexit.register(lambda: sys.stdout.write(buf.getvalue()))",
              "import sys\ninput()\nsys.__stdout__.write(str(sum(map(int, input().split()))) + '\\n')"]
    for code in shapes:
        assert ct.run_tests(code, stdio, time_limit_s=10) == ["pass"] * 3, code
    demo = "def add(a, b):\n    return a + b\nif __name__ == '__main__':\n    print(add(int(input()), 1))"
    assert ct.run_tests(demo, ct.parse_tests(C3), time_limit_s=5) == ["pass"] * 3
    assert ct.run_tests(demo, ct.parse_tests(["assert add(1, 2) == 3"]), time_limit_s=5) == ["pass"]


def test_a_loop_inside_one_c_call_ends_at_the_limit():
    """The in-process timer could not interrupt `sum(range(10**13))` (20 tests at a 1 s limit took 22 s): each test
    is a process of its own, killed at its limit."""
    t0 = time.monotonic()
    out = ct.run_tests("def add(a, b):\n    return sum(range(10 ** 13))", ct.parse_tests(C3), time_limit_s=0.5,
                       stop_early=True)
    assert out == ["timeout", "error", "error"] and time.monotonic() - t0 < 5


def test_test_layouts_that_had_misled():
    """A HumanEval `test` field as shipped (defines check, never calls it) had passed any code; a bare number as
    the tests had passed anything; a program starting with a docstring was read as bad JSON; an assert list's
    set-up entry ran apart from its asserts; lines that end in newlines were joined with more."""
    with pytest.raises(ValueError, match=r"defines check\(\) but never calls it"):
        ct.parse_tests("def check(candidate):\n    assert candidate(1) == 2\n")
    with pytest.raises(ValueError, match="tests nothing"):
        ct.parse_tests("6")
    t = ct.parse_tests('"""A docstring."""\nassert f(1) == 2')
    assert t.mode == "script"
    t = ct.parse_tests(["import math", "assert f(math.pi) == math.pi"])
    assert t.setup == ("import math",) and len(t.cases) == 1
    assert ct.run_tests("def f(x):\n    return x", t, time_limit_s=5) == ["pass"]
    assert ct.parse_tests({"inputs": [["1\n", "2\n"]], "outputs": ["3\n"]}).cases[0][0] == "1\n2\n"


def test_the_code_is_the_solution_block_not_a_sample():
    """An untagged block after the code (the sample's output) or an example-usage block had been taken for it."""
    text = "```python\nprint(6)\n```\nFor the sample it prints\n```\n6\n```"
    assert ct.extract_code(text) == "print(6)\n"
    text = "```python\ndef add(a, b):\n    return a + b\n```\nUsage:\n```python\nprint(add(1, 2))\n```"
    assert ct.extract_code(text, defines="add") == "def add(a, b):\n    return a + b\n"
    assert ct.score([text], [json.dumps(C3)], time_limit_s=5) == [1.0]


def test_what_the_code_leaves_behind_cannot_hang_or_fool_the_judge(tmp_path):
    """A review (2026-12-01): an output of '--5' made int() raise in the judge, which would have stopped the run;
    a symbolic link where the output was had been followed (a file holding the answer passed), a FIFO there hung
    the judge; a test process could write a forged report into the trainer's pipe through /proc and kill the
    child. Outputs are read as regular files only, the report comes through a socket and counts only from a child
    that ended on its own."""
    stdio = ct.parse_tests({"inputs": ["\n"], "outputs": ["5\n"]})
    assert ct.run_tests("print('--5')", stdio, time_limit_s=5) == ["fail"]
    assert ct.score([fenced("print('+-5 ²')")], [{"inputs": ["\n"], "outputs": ["5 2\n"]}], time_limit_s=5) == [0.0]
    answer = tmp_path / "answer.txt"
    answer.write_text("5\n")
    for trick in (f"os.symlink({str(answer)!r}, 'out0.txt')", "os.mkfifo('out0.txt')"):
        t0 = time.monotonic()
        code = f"import os\nprint('wrong')\nimport sys\nsys.stdout.flush()\nos.remove('out0.txt')\n{trick}"
        assert ct.run_tests(code, stdio, time_limit_s=5) == ["error"], trick
        assert time.monotonic() - t0 < 15
    # the report's channel: a socket (opening /proc/<pid>/fd/<socket> fails, where a pipe's opened for writing),
    # and a child killed by its code reports nothing. (Only the child's own descriptor is attacked here: a forge
    # that wrote to every descriptor of the scoring process, run as root, overwrote files that process had open.)
    forge = ("import os, json\nchild = os.getppid()\ntry:\n    w = os.open(f'/proc/{child}/fd/1', os.O_WRONLY)\n"
             "    os.write(w, json.dumps(['pass'] * 3).encode())\nexcept OSError as e:\n"
             "    open('opened.txt', 'w').write(str(e))\nos.kill(child, 9)")
    asserts = ct.parse_tests(["assert f(1) == 2", "assert f(2) == 3", "assert f(3) == 4"])
    assert "pass" not in ct.run_tests(forge, asserts, time_limit_s=5)
    written = ("import os, json, sys\nos.write(1, json.dumps(['pass'] * 3).encode())\n")  # (its own fd 1: a file)
    assert "pass" not in ct.run_tests(written, asserts, time_limit_s=5)


def test_a_child_that_cannot_start_is_an_error_not_zero_rewards(tmp_path, monkeypatch):
    """A Python that cannot run the child (an environment it needs) had scored every response 0 without a word."""
    broken = tmp_path / "child.py"
    broken.write_text("raise SystemExit('this Python lacks something')\n")
    monkeypatch.setattr(ct, "CHILD", str(broken))
    ct._child_starts.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="cannot run: this Python lacks something"):
            ct.score([fenced("print(1)")], [{"inputs": [""], "outputs": ["1"]}])
    finally:
        ct._child_starts.cache_clear()
    with pytest.raises(ValueError, match="time_limit_s must be > 0"):
        ct.run_tests("print(1)", ct.parse_tests({"inputs": [""], "outputs": ["1"]}), time_limit_s=0)


def test_the_code_cannot_open_the_scoring_process_through_proc():
    """The scoring process is undumpable while code runs: a process of the same (non-root) user cannot open its
    memory (the expected outputs: a sweep read them there) or its descriptors (a sweep wrote a forged report into
    its pipe). Run as nobody (setpriv), with the system Python: root passes these checks by CAP_SYS_PTRACE."""
    import shutil
    import subprocess

    python = shutil.which("python3.11", path="/usr/bin") or shutil.which("python3", path="/usr/bin")
    if os.geteuid() != 0 or not shutil.which("setpriv") or not python:
        pytest.skip("needs root (to run the check as nobody), setpriv and a system Python in /usr/bin")
    import tempfile
    from pathlib import Path

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tmp_path = Path(tempfile.mkdtemp(prefix="pacs_fast_nobody_"))  # (pytest's own tmp is root's alone)
    script = tmp_path / "check.py"
    script.write_text(
        f"import sys\nsys.path.insert(0, {root!r})\nfrom pacs_fast.reward import code_tests as ct\n"
        "code = ('import os\\nchild = os.getppid()\\n'\n"
        "        'scorer = int(open(f\"/proc/{child}/stat\").read().rsplit(\")\", 1)[1].split()[1])\\n'\n"
        "        'for what in (\"mem\", \"fd\"):\\n    try:\\n'\n"
        "        '        open(f\"/proc/{scorer}/mem\", \"rb\").close() if what == \"mem\" else '\n"
        "        'os.listdir(f\"/proc/{scorer}/fd\")\\n        print(what, \"open\")\\n'\n"
        "        '    except OSError:\\n        print(what, \"denied\")\\n')\n"
        "print(ct.run_tests(code, ct.parse_tests({'inputs': [''], 'outputs': ['mem denied\\nfd denied']}),"
        " time_limit_s=10))\n")
    os.chmod(tmp_path, 0o755)
    os.chmod(script, 0o644)
    probe = subprocess.run([python, "-c", f"import sys; sys.path.insert(0, {root!r}); "
                                          "import pacs_fast.reward.code_tests"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"the system Python cannot import pacs_fast.reward.code_tests: {probe.stderr.strip()[-200:]}")
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env", "-i",
                          "PATH=/usr/bin:/bin", f"HOME={tmp_path}", python, str(script)], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    shutil.rmtree(tmp_path, ignore_errors=True)
    if "Permission denied" in out.stderr:
        pytest.skip(f"nobody cannot read the checkout: {out.stderr.strip()[-200:]}")
    assert out.stdout.strip().splitlines()[-1:] == ["['pass']"], out.stdout + out.stderr


def test_second_sweep_hacks_and_misses():
    """A second hostile sweep (2026-12-01): one line patching builtins.exec had passed every assert, and reading the
    token from the caller's frame too; an assert of a literal value is now judged here as a call's value is.
    Deeply nested JSON from a call had raised RecursionError in the judge; a float printed for an integer passed
    when within 1e-6 of it; pickling what the code defined failed; LiveCodeBench's calls (arguments as JSON lines)
    scored 0; JSON encoded twice was read as a test program."""
    asserts = ct.parse_tests(["assert f(3) == 9", "assert f(-2) == 4", "assert 1 == f(1)"])
    assert all(judged for _, judged in asserts.cases)
    for hack in ("import builtins\nbuiltins.exec = lambda *a, **k: None\nbuiltins.eval = lambda *a, **k: 9",
                 "import sys, os\nf0 = sys._getframe(1).f_locals\nopen(f\"out{f0['k']}.txt\", 'w').write(f0['token'])\n"
                 "os._exit(0)"):
        assert "pass" not in ct.run_tests(hack, asserts, time_limit_s=5), hack
    assert ct.run_tests("def f(x):\n    return x * x", asserts, time_limit_s=5) == ["pass"] * 3
    deep = "import os\ndef add(a, b):\n    open('out0.txt', 'w').write('[' * 100000 + ']' * 100000)\n    os._exit(0)"
    assert ct.run_tests(deep, ct.parse_tests(C3), time_limit_s=5)[0] == "error"
    assert not ct.outputs_match("1000001.0\n", "1000000\n") and ct.outputs_match("2.0", "2")
    pool = ("from multiprocessing import Pool\ndef sq(x):\n    return x * x\nif __name__ == '__main__':\n"
            "    input()\n    with Pool(2) as p:\n        print(sum(p.map(sq, map(int, input().split()))))")
    assert ct.run_tests(pool, ct.parse_tests({"inputs": ["3\n1 2 3\n"], "outputs": ["14\n"]}), time_limit_s=20) == \
        ["pass"]
    lcb = ct.parse_tests({"fn_name": "twoSum", "inputs": ["[2,7,11,15]\n9"], "outputs": ["[0, 1]"]})
    assert lcb.cases == (([[2, 7, 11, 15], 9], [0, 1]),)
    two_sum = ("class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n"
               "        for i, x in enumerate(nums):\n            if target - x in seen:\n"
               "                return [seen[target - x], i]\n            seen[x] = i")
    assert ct.run_tests(two_sum, lcb, time_limit_s=5) == ["pass"]
    assert ct.parse_tests(json.dumps(json.dumps(C3))).mode == "call"
