"""keep_freed_memory: after it, reallocating freed multi-MB tensors no longer page-faults (glibc)."""
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import resource, sys, torch
if sys.argv[1] == "1":
    from pacs_fast.trainer.allocator import keep_freed_memory
    assert keep_freed_memory()
def churn():                           # a training step in miniature: many buffers live at once, then all freed
    for _ in range(3):
        live = [torch.ones(2_000_000) + i for i in range(12)]   # 12 x 8 MB, plus temporaries
        del live
churn()                                # warm-up: the heap grows once
counts = []
for _ in range(3):                     # the fewest faults of three churns: faults the host causes on its own
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt   # schedule (e.g. NUMA balancing) miss one of them
    churn()
    counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(min(counts))
"""


def faults(apply: bool) -> int:
    # glibc's default thresholds adapt to the process's history, so whether plain churn faults varies
    # from run to run; pinning them low (mmap every 8 MB buffer, trim every free) makes the baseline
    # fault for sure, and keep_freed_memory must override them.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
    out = subprocess.run([sys.executable, "-c", SCRIPT, "1" if apply else "0"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_freed_memory_is_reused_without_page_faults():
    plain, kept = faults(False), faults(True)
    assert plain > 1000      # every buffer is a fresh mmap, faulted in page by page
    # reused, not faulted in again: on an idle machine kept is a few hundred faults against >100,000.
    # Fresh-clone CI runs on a busy machine measured 11,719 and 19,531 against 140,688 (12x, 7.2x) for a
    # single churn: faults the host adds on its own schedule; the fewest of three churns (SCRIPT) is the
    # allocator's own count, and the bound stays 8x
    assert kept < plain / 8


def test_returns_false_without_glibc(monkeypatch):
    from pacs_fast.trainer import allocator
    monkeypatch.setattr(allocator.sys, "platform", "darwin")
    assert allocator.keep_freed_memory() is False
