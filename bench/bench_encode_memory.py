"""Memory of tokenising a large training set (``encode_prompts``): a chunk at a time against one call.

    python bench/bench_encode_memory.py --tokenizer /path/to/qwen2.5     # 100,000 GSM8K-like prompts
    python bench/bench_encode_memory.py --rows 20000                     # the built-in character tokenizer

Each variant runs in a fresh process (peak memory is per process): it builds ``--rows`` prompts from the
shipped gsm8k_train problems (cycled, each made distinct by its row number), then encodes them with
``pacs_fast.data.prompts.encode_prompts``: ``chunked`` (``ENCODE_CHUNK`` prompts per tokenizer call, ids kept
as lists), ``one call`` with the whole set in one call (as at first); ``trainer`` is what a run keeps: the
trainer's ``encode`` (``pacs_fast.trainer.problems``: chunked, each prompt's ids an ``array('i')``). Printed:
the growth of the resident set and of its peak (``VmHWM``) over the encode (the ids kept alive), in MiB, the
tokens per prompt and the seconds.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

PROBE = r"""
import json, sys, time
from pacs_fast.data import prompts
from pacs_fast.data.datasets import load_dataset

def status(key):
    return next(int(l.split()[1]) // 1024 for l in open("/proc/self/status") if l.startswith(key))

rows, tokenizer, chunk = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
if tokenizer:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tokenizer)
else:
    from pacs_fast.data.tiny import build_char_tokenizer
    tok = build_char_tokenizer()
base = [p.problem for p in load_dataset("gsm8k_train")]
problems = [f"[{i}] {base[i % len(base)]}" for i in range(rows)]
if chunk > 0:
    prompts.ENCODE_CHUNK = chunk
if chunk < 0:  # the trainer's encode (its problem dicts are made before the measure starts)
    from pacs_fast.config import load_config
    from pacs_fast.trainer.problems import encode
    cfg = load_config(None, ["data.max_prompt_tokens=100000"])
    rows = [{"problem": p} for p in problems]
rss0, peak0, t0 = status("VmRSS"), status("VmHWM"), time.perf_counter()
if chunk < 0:
    ids = [p["prompt_ids"] for p in encode(cfg, tok, rows, "bench", print)[0]]
else:
    ids = prompts.encode_prompts(tok, problems)
print(json.dumps({"rss": status("VmRSS") - rss0, "peak": status("VmHWM") - peak0, "s": time.perf_counter() - t0,
                  "tokens": sum(map(len, ids)) / len(ids)}))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--tokenizer", default="", help="a tokenizer folder (default: the built-in character tokenizer)")
    a = p.parse_args()
    print(f"{'variant':<10} {'RSS MiB':>8} {'peak MiB':>9} {'s':>6} {'tokens/prompt':>14}   ({a.rows} prompts)")
    for name, chunk in (("trainer", -1), ("chunked", 0), ("one call", a.rows)):
        out = subprocess.run([sys.executable, "-c", PROBE, str(a.rows), a.tokenizer, str(chunk)],
                             capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(out.stderr[-3000:])
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{name:<10} {r['rss']:8d} {r['peak']:9d} {r['s']:6.1f} {r['tokens']:14.1f}")


if __name__ == "__main__":
    main()
