"""Time of the code reward (pacs_fast/reward/code_tests.py): one response's child process and each test in it, per
test layout, and a batch scored by 1 and by all CPUs.

    python bench/bench_code_reward.py [--repeats 5] [--batch 32]

Prints a table: per layout, the median wall time of one response with 1 and with 20 tests (the difference / 19 is
a test's cost, the rest the child's start), and a batch of ``--batch`` responses with 1 worker and with every CPU.
"""
from __future__ import annotations

import argparse
import statistics
import time

from pacs_fast.reward import code_tests as ct
from pacs_fast.reward.batch import usable_cpus

PROGRAMS = {
    "stdio": ("a, b = map(int, input().split())\nprint(a + b)",
              lambda n: {"inputs": [f"{i} {i}\n" for i in range(n)], "outputs": [f"{2 * i}\n" for i in range(n)]}),
    "call": ("def f(a, b):\n    return a + b",
             lambda n: {"inputs": [[i, i] for i in range(n)], "outputs": [2 * i for i in range(n)], "fn_name": "f"}),
    "asserts": ("def f(a, b):\n    return a + b", lambda n: [f"assert f({i}, {i}) == {2 * i}" for i in range(n)]),
}


def median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    a = p.parse_args()
    cpus = usable_cpus()
    print(f"| layout | 1 test (ms) | 20 tests (ms) | per test (ms) | batch of {a.batch} x 5 tests, 1 worker (s) | "
          f"{cpus} workers (s) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (code, tests) in PROGRAMS.items():
        one, twenty = ct.parse_tests(tests(1)), ct.parse_tests(tests(20))
        t1 = median_s(lambda: ct.run_tests(code, one), a.repeats)
        t20 = median_s(lambda: ct.run_tests(code, twenty), a.repeats)
        response, five = f"```python\n{code}\n```", tests(5)
        b1 = median_s(lambda: ct.score([response] * a.batch, [five] * a.batch, workers=1), max(1, a.repeats // 2))
        bn = median_s(lambda: ct.score([response] * a.batch, [five] * a.batch, workers=cpus), max(1, a.repeats // 2))
        print(f"| {name} | {t1 * 1e3:.0f} | {t20 * 1e3:.0f} | {(t20 - t1) / 19 * 1e3:.1f} | {b1:.2f} | {bn:.2f} |")


if __name__ == "__main__":
    main()
