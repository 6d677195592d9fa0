import json, sys
from pathlib import Path
O = Path(sys.argv[1]) / "runs"
keys = ["learner/loss", "learner/grad_norm", "rollout/kept_frac", "rollout/gen_rounds", "rollout/trained_groups",
        "reward/overlong_frac", "reward/mean", "rollout/staleness", "correction/fused", "correction/is_weight_mean",
        "rollout/generating_ranks", "learner/truncated_frac", "response/length"]
for run in sorted(O.iterdir()):
    p = run / "metrics.jsonl"
    if not p.is_file():
        continue
    recs = [json.loads(l) for l in open(p) if l.strip()]
    tr = [r for r in recs if r.get("kind") == "train"]
    ev = [r for r in recs if r.get("kind") == "eval"]
    print(run.name, "train steps", [r["step"] for r in tr], "evals", [(r["step"], r.get("eval/acc")) for r in ev])
    for r in tr:
        print("  ", {k: (round(r[k], 4) if isinstance(r.get(k), float) else r.get(k)) for k in keys if k in r})
    print("   files:", sorted(x.name for x in run.iterdir()))
