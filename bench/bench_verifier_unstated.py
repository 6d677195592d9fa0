"""How often the verifier pays a response that never states its answer, per extraction.

Each shipped training problem's reference solution is cut at ``--frac`` of the text before its answer (the
last ``\\boxed`` of a MATH solution, gsm8k's ``####``) and scored against the gold answer, under
``extraction="reference"`` (PACS's reward: math-verify's last-number fallback) and ``"boxed"``. A perfect
reward gives 0 (an unfinished solution states no answer); what remains under ``boxed`` are solutions that box
an intermediate result.

    python bench/bench_verifier_unstated.py --limit 1500
"""
from __future__ import annotations

import argparse

from pacs_fast.data.datasets import load_benchmark
from pacs_fast.reward import EXTRACTIONS, math_reward


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", default="gsm8k_train,math_train")
    p.add_argument("--limit", type=int, default=1500, help="problems per set (the first ones)")
    p.add_argument("--frac", type=float, default=0.8, help="share of the text before the answer kept")
    args = p.parse_args()
    print(f"| set | solutions | " + " | ".join(f"paid, {e}" for e in EXTRACTIONS) + " |")
    print("|---|---:|" + "---:|" * len(EXTRACTIONS))
    for name in args.sets.split(","):
        paid, n = dict.fromkeys(EXTRACTIONS, 0.0), 0
        for prob in load_benchmark(name)[:args.limit]:
            sol = (prob.meta or {}).get("solution") or ""
            cut = sol.rfind("\\boxed") if "\\boxed" in sol else sol.rfind("####")
            if cut <= 0:
                continue
            n += 1
            for e in EXTRACTIONS:
                paid[e] += math_reward(sol[:int(cut * args.frac)], prob.answer, extraction=e)
        print(f"| {name} | {n} | " + " | ".join(f"{100 * paid[e] / max(n, 1):.1f}%" for e in EXTRACTIONS) + " |")


if __name__ == "__main__":
    main()
