"""Issues 38's and 39's targets, read off the files a GPU lease returned: met, not met or not measured.

    python bench/gpu/targets.py PATH [PATH ...] [--json OUT]

PATH: a folder (searched recursively), a ``.json`` / ``.xml`` file, or a lease archive (``lease.tgz``: read in
place). Each file is recognised by its content (the benchmarks' own JSON, pytest's JUnit XML); a file written by a
CPU dry run or under the Triton interpreter is never evidence (counted, listed, ignored). Every measurement that
bears on a target is printed with its file, so a verdict can be checked by hand. A target "always" (the PACS
loss, the log-prob shapes, the memory curve) is **met** only when at least one measurement bears on it and every one
does (pass the folders of one code version: an older run's rows count like the new ones); a "best of" target (the
learner's MFU, the mix's ratios) rests on the best measurement, the others listed beside it; **not measured** when
none bears on it. Verdicts, never a figure that was not in a file.

Targets (the issues' own numbers; thresholds in :data:`LIMITS`):
  39 item 3  the fused PACS loss's synchronised call (eager, and a CUDA graph's replay) <= 2x the copy's wall time at
             B=1024 x T=4096 and B=8192 x T=1024 (bench/bench_pacs_loss.py --device cuda)
  39 item 4  the default log-prob path (method ``pacs_triton``) <= 1.10x its floors, forward and forward +
             backward, at every shape of the lease plan (bench/gpu/logprobs.py: each floor timed beside it)
  39 item 5  float64 errors of logp, entropy, dh and dW at the main shape; raw samples and SM clocks; fp32 inputs and
             ``model.lm_head_fp32`` (``pacs_triton_upcast``) timed; a table from an H100
  39 items 1-2  the CUDA-graph gpu tests and the learner-on-the-kernels gpu test passed (JUnit XML)
  38         the best learner at the Qwen2.5-1.5B shape, 4k rows: MFU >= 40%; a 32k response trains there with
             recompute; on the long-tailed mix, in one run, packed >= 1.6x padded tokens/s and the best learner
             >= 1.5x torch padded + SDPA; peak memory linear in tokens per micro-batch (>= 3 budgets, R^2 >= 0.99);
             the Qwen2.5-0.5B rows; flex_attention timed (bench/gpu/learner.py, bench/gpu/attention.py)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tarfile
import xml.etree.ElementTree as ET

LIMITS = {"pacs_loss_vs_copy": 2.0, "logprobs_vs_floor": 1.10, "mfu_4k": 0.40, "mix_packed_vs_padded": 1.6,
          "mix_best_vs_sdpa": 1.5, "curve_r2": 0.99}
PACS_SHAPES = ((1024, 4096), (8192, 1024))  # issue 39 item 3's (B, T)
LOGPROB_SHAPES = ("8192x4096x151936", "8192x896x151936", "8192x3584x151936", "8192x4096x32000", "8192x8192x128256",
                  "8192x4096x128256", "2048x4096x151936", "32768x4096x151936", "65536x4096x151936")  # lease plan's
MAIN_SHAPE = LOGPROB_SHAPES[0]
ERRORS = ("logp", "entropy", "dh", "dW")
GRAPH_TESTS = "tests.test_cuda_graph"
LEARNER_ON_KERNELS = "test_the_learner_on_the_gpu_kernels_equals_the_torch_paths_cuda"


def read_sources(paths) -> list[tuple[str, str, bytes]]:
    """``(name, kind, data)`` for every ``.json`` / ``.xml`` under ``paths`` (folders recursively, archives
    member by member); kind ``json`` or ``xml``. A path that does not exist raises FileNotFoundError."""
    out = []

    def add(name, data):
        kind = name.rsplit(".", 1)[-1].lower()
        if kind in ("json", "xml"):
            out.append((name, kind, data))

    for path in paths:
        if not os.path.exists(path):
            raise FileNotFoundError(f"bench/gpu/targets.py: no such file or folder: {path}")
        if os.path.isdir(path):
            for root, dirs, files in os.walk(path):
                dirs.sort()
                for f in sorted(files):
                    full = os.path.join(root, f)
                    if f.endswith((".tgz", ".tar.gz")):
                        out.extend(read_sources([full]))
                    elif f.endswith((".json", ".xml")):
                        with open(full, "rb") as fh:
                            add(full, fh.read())
        elif path.endswith((".tgz", ".tar.gz")):
            with tarfile.open(path) as tar:
                for m in sorted(tar.getmembers(), key=lambda m: m.name):
                    if m.isfile() and m.name.endswith((".json", ".xml")):
                        add(f"{path}:{m.name.removeprefix('./')}", tar.extractfile(m).read())
        else:
            with open(path, "rb") as fh:
                add(path, fh.read())
    return out


def _cpu(device) -> bool:
    return not isinstance(device, str) or device.strip().lower().startswith("cpu") or device.strip() == ""


def classify(name: str, kind: str, data: bytes) -> tuple[str, object, str | None]:
    """``(kind, content, why_ignored)``: kind one of pacs_loss, logprobs, learner, attention, host, junit, other."""
    if kind == "xml":
        try:
            root = ET.fromstring(data)
        except ET.ParseError as e:
            return "other", None, f"not XML ({e})"
        cases = [{"classname": c.get("classname", ""), "name": c.get("name", ""),
                  "outcome": next((x.tag for x in c if x.tag in ("failure", "error", "skipped")), "passed")}
                 for c in root.iter("testcase")]
        return ("junit", cases, None) if cases else ("other", None, "no test cases")
    try:
        doc = json.loads(data)
    except ValueError as e:
        return "other", None, f"not JSON ({e})"
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        return "other", None, None
    meta = doc.get("meta") if isinstance(doc.get("meta"), dict) else {}
    first = next((r for r in rows if isinstance(r, dict)), {})
    if "triton_launcher_ms" in first:  # (before the PACS loss's: a ladder row has a copy_ms too)
        return "host", doc, "a CPU run" if first.get("device") != "cuda" else None
    if "copy_ms" in first or ("fused_interpreted" in meta and "B" in first):
        why = ("a CPU run" if meta.get("device") != "cuda" else
               "the Triton interpreter" if meta.get("fused_interpreted") else None)
        return "pacs_loss", doc, why
    if "floors" in doc:
        return "logprobs", doc, "a CPU run" if _cpu(doc.get("device")) else None
    if "formula" in doc and "learner" in first:
        return "learner", doc, "a CPU dry run" if _cpu(doc.get("device")) else None
    if "layout" in first:
        return "attention", doc, "a CPU dry run" if _cpu(meta.get("device")) else None
    return "other", None, None


class Target:
    def __init__(self, issue: str, what: str):
        self.issue, self.what, self.evidence, self.ok = issue, what, [], []

    def add(self, ok: bool, text: str, source: str):
        """A measurement the verdict rests on."""
        self.ok.append(bool(ok))
        self.evidence.append(f"{'ok ' if ok else 'NOT'} {text}  [{source}]")

    def note(self, text: str, source: str):
        """A measurement shown beside the one the verdict rests on (a "best of" target's others)."""
        self.evidence.append(f"    {text}  [{source}]")

    def best_of(self, cands, ok):
        """A "best of" target: ``cands`` ``(score, text, source)``; the verdict rests on the highest score."""
        if cands:
            top = max(cands, key=lambda c: c[0])
            self.add(ok(top[0]), top[1], top[2])
            for c in cands:
                if c is not top:
                    self.note(c[1], c[2])

    @property
    def verdict(self) -> str:
        return "not measured" if not self.ok else "met" if all(self.ok) else "not met"

    def as_dict(self) -> dict:
        return {"issue": self.issue, "target": self.what, "verdict": self.verdict, "evidence": self.evidence}


def _numbers(x) -> list:
    """The numbers in a nested dict / list (``{"fwd": [1980, None]}`` -> ``[1980]``)."""
    if isinstance(x, dict):
        return [n for v in x.values() for n in _numbers(v)]
    if isinstance(x, (list, tuple)):
        return [n for v in x for n in _numbers(v)]
    return [x] if isinstance(x, (int, float)) and not isinstance(x, bool) else []


def _shape(r) -> str:
    return f"{r.get('N')}x{r.get('H')}x{r.get('V')}"


def _pacs_targets(docs, ladders=()) -> list[Target]:
    """The PACS loss's wall-time targets; ``ladders`` (bench/gpu/pacs_loss_host_profile.py's files) add where an
    eager call's time went, beside the eager target (shown, not judged)."""
    out = []
    for B, T in PACS_SHAPES:
        eager = Target("39", f"PACS loss B={B} T={T}: synchronised eager call <= {LIMITS['pacs_loss_vs_copy']}x a copy")
        graph = Target("39", f"PACS loss B={B} T={T}: CUDA-graph replay <= {LIMITS['pacs_loss_vs_copy']}x a copy")
        for src, doc in docs:
            for r in doc["rows"]:
                if r.get("B") != B or r.get("T") != T or "copy_ms" not in r:
                    continue
                tag = f"G={r.get('G')}: "
                if "fused_vs_copy" in r:
                    eager.add(r["fused_vs_copy"] <= LIMITS["pacs_loss_vs_copy"],
                              f"{tag}{r['fused_ms']:.3f} / {r['copy_ms']:.3f} ms = {r['fused_vs_copy']:.1f}x"
                              + (f" (device {r['fused_gpu_us']:.1f} us)" if "fused_gpu_us" in r else ""), src)
                if "graph_vs_copy" in r:
                    graph.add(r["graph_vs_copy"] <= LIMITS["pacs_loss_vs_copy"],
                              f"{tag}{r['fused_graph_ms']:.3f} / {r['copy_ms']:.3f} ms = {r['graph_vs_copy']:.2f}x "
                              f"(replay vs eager: {r.get('graph_err', float('nan')):.1e})", src)
        for src, doc in ladders:
            for r in doc["rows"]:
                if r.get("B") == B and r.get("T") == T and "triton_launcher_ms" in r:
                    eager.note(f"ladder: copy {r['copy_ms']:.3f}, x.sum() autograd {r['torch_autograd_ms']:.3f}, ours "
                               f"without launches {r['fused_no_launch_ms']:.3f}, with empty kernels "
                               f"{r['fused_empty_ms']:.3f}, fused {r['fused_ms']:.3f} ms: Triton's launcher "
                               f"{r['triton_launcher_ms']:.3f}, device on the path {r['device_on_path_ms']:.3f}, ours "
                               f"beyond autograd {r['ours_over_autograd_ms']:.3f} ms", src)
        out += [eager, graph]
    return out


def _logprob_targets(docs) -> list[Target]:
    rows = [(src, doc, r) for src, doc in docs for r in doc["rows"] if "unavailable" not in r and "fwd_ms" in r]
    default = [(s, d, r) for s, d, r in rows if r.get("method") == "pacs_triton"]
    shapes = list(LOGPROB_SHAPES) + sorted({_shape(r) for _, _, r in default} - set(LOGPROB_SHAPES))
    out = []
    for shape in shapes:
        t = Target("39", f"log-probs {shape} (N x H x V), default path: fwd and fwd+bwd <= "
                         f"{LIMITS['logprobs_vs_floor']:.2f}x their floors")
        for src, doc, r in default:
            if _shape(r) == shape:
                f, fb = r["fwd_vs_gemm"], r["fwd_bwd_vs_4gemm"]
                t.add(max(f, fb) <= LIMITS["logprobs_vs_floor"],
                      f"{r.get('dtype')} on {doc.get('device')}: fwd {f:.3f}x, fwd+bwd {fb:.3f}x "
                      f"({r.get('fwd_tflops', 0):.0f} TFLOP/s fwd, workspace {r.get('workspace_gb', 0):.3f} GB)", src)
        out.append(t)
    errs = Target("39", f"float64 errors of {', '.join(ERRORS)} of the default path at the main shape")
    trust = Target("39", "raw samples and SM clocks beside each default-path time")
    for src, doc, r in default:
        have = [k for k in ERRORS if isinstance((r.get("max_err") or {}).get(k), (int, float))]
        if _shape(r) == MAIN_SHAPE:
            errs.add(len(have) == len(ERRORS), f"{r.get('dtype')}: " + ", ".join(
                f"{k} {r['max_err'][k]:.2g}" for k in have) + (f"; missing {sorted(set(ERRORS) - set(have))}"
                                                               if len(have) < len(ERRORS) else ""), src)
        clocks = _numbers(r.get("sm_clock_mhz"))  # (None where neither NVML nor nvidia-smi answered)
        trust.add(bool(r.get("samples_ms")) and bool(clocks),
                  f"{_shape(r)}: samples {'yes' if r.get('samples_ms') else 'no'}, SM clocks "
                  f"{f'{min(clocks)}-{max(clocks)} MHz' if clocks else 'none read'}", src)
    fp32 = Target("39", "fp32 inputs timed (default path)")
    upcast = Target("39", "model.lm_head_fp32 timed (pacs_triton_upcast)")
    h100 = Target("39", "a log-prob table measured on an H100")
    for src, doc, r in rows:
        if r.get("method") == "pacs_triton" and r.get("dtype") == "float32":
            fp32.add(True, f"{_shape(r)}: fwd {r['fwd_vs_gemm']:.2f}x, fwd+bwd {r['fwd_bwd_vs_4gemm']:.2f}x", src)
        if r.get("method") == "pacs_triton_upcast":
            upcast.add(True, f"{_shape(r)} {r.get('dtype')}: fwd {r['fwd_ms']:.2f} ms ({r['fwd_vs_gemm']:.2f}x), "
                             f"fwd+bwd {r['fwd_bwd_ms']:.2f} ms ({r['fwd_bwd_vs_4gemm']:.2f}x)", src)
    for src, doc in docs:
        if "H100" in str(doc.get("device")) and any("fwd_ms" in r for r in doc["rows"]):
            h100.add(True, f"{doc['device']}: {sum('fwd_ms' in r for r in doc['rows'])} rows", src)
    return out + [errs, trust, fp32, upcast, h100]


def _junit_targets(docs) -> list[Target]:
    graph = Target("39", "CUDA-graph capture and replay equal (tests/test_cuda_graph.py on a GPU)")
    learner = Target("39", "the learner on the GPU kernels equals the torch paths (gpu test)")
    for src, cases in docs:
        ran = [c for c in cases if c["classname"].endswith(GRAPH_TESTS.split(".")[-1]) and c["outcome"] != "skipped"]
        if ran:
            bad = [c["name"] for c in ran if c["outcome"] != "passed"]
            graph.add(not bad, f"{len(ran) - len(bad)} of {len(ran)} passed" + (f"; failed {bad}" if bad else ""), src)
        for c in cases:
            if c["name"] == LEARNER_ON_KERNELS and c["outcome"] != "skipped":
                learner.add(c["outcome"] == "passed", c["outcome"], src)
    return [graph, learner]


def _measured(r) -> bool:
    return isinstance(r.get("tokens_per_s"), (int, float)) and not r.get("not_run")


def _fit_r2(xs, ys) -> float:
    """R^2 of the least-squares line through the points (``xs`` distinct): 1 for peaks that do not move."""
    if len(set(ys)) == 1:
        return 1.0
    return statistics.correlation(xs, ys) ** 2


def _learner_targets(docs, attention) -> list[Target]:
    mfu = Target("38", f"best learner, Qwen2.5-1.5B shape, 4k rows: MFU >= {LIMITS['mfu_4k']:.0%}")
    long = Target("38", "a 32k-token response trains at the Qwen2.5-1.5B shape with recompute")
    packed = Target("38", f"long-tailed mix, one run: packed >= {LIMITS['mix_packed_vs_padded']}x padded tokens/s")
    best = Target("38", f"long-tailed mix, one run: best learner >= {LIMITS['mix_best_vs_sdpa']}x torch padded + SDPA")
    curve = Target("38", f"peak memory linear in tokens per micro-batch (>= 3 budgets, R^2 >= {LIMITS['curve_r2']})")
    small = Target("38", "Qwen2.5-0.5B-shape learner rows")
    flex = Target("38", "flex_attention with a document mask timed on the GPU")
    best_mfu, best_packed, best_sdpa = [], [], []  # "best of" targets: (score, text, file)
    for src, doc in docs:
        rows = [r for r in doc["rows"] if isinstance(r, dict) and _measured(r)]
        for r in rows:
            speed = f"{r['tokens_per_s']:,.0f} tok/s, peak {r.get('peak_gb', 0):.1f} GB"
            if r.get("shape") == "qwen2.5-1.5b" and r.get("spec") == "4k" and isinstance(r.get("mfu"), float):
                best_mfu.append((r["mfu"], f"{r['learner']}: {r['mfu']:.1%} ({speed}, budget {r.get('token_budget')} "
                                           f"tokens)", src))
            if r.get("shape") == "qwen2.5-1.5b" and r.get("spec") == "32k" and r.get("recompute"):
                long.add(True, f"{r['learner']}: {speed}", src)
            if r.get("shape") == "qwen2.5-0.5b":
                small.add(True, f"{r['learner']} {r.get('spec')}: {r['tokens_per_s']:,.0f} tok/s, MFU "
                                f"{r.get('mfu', 0):.1%}", src)
        for shape in sorted({r.get("shape") for r in rows}):
            mix = [r for r in rows if r.get("shape") == shape and r.get("spec") == "mix"]
            pk = [r for r in mix if "packed" in r["learner"] and "dense" not in r["learner"]]
            pd = [r for r in mix if "padded" in r["learner"]]
            sdpa = [r for r in mix if r["learner"] == "torch padded + SDPA"]
            tps = lambda rs: max(rs, key=lambda r: r["tokens_per_s"])  # noqa: E731
            if pk and pd:
                a, b = tps(pk), tps(pd)
                ratio = a["tokens_per_s"] / b["tokens_per_s"]
                best_packed.append((ratio, f"{shape}: {a['learner']} {a['tokens_per_s']:,.0f} / {b['learner']} "
                                           f"{b['tokens_per_s']:,.0f} = {ratio:.2f}x", src))
            if sdpa and len(mix) > 1:
                a, b = tps(mix), tps(sdpa)
                ratio = a["tokens_per_s"] / b["tokens_per_s"]
                best_sdpa.append((ratio, f"{shape}: {a['learner']} {a['tokens_per_s']:,.0f} / torch padded + SDPA "
                                         f"{b['tokens_per_s']:,.0f} = {ratio:.2f}x", src))
        groups: dict = {}
        for r in rows:
            if isinstance(r.get("token_budget"), (int, float)) and isinstance(r.get("peak_gb"), (int, float)):
                key = (r["learner"], r.get("shape"), r.get("spec"), str(r.get("recompute")))
                groups.setdefault(key, {})[r["token_budget"]] = r["peak_gb"]
        for key, points in groups.items():
            if len(points) >= 3:
                xs = sorted(points)
                r2 = _fit_r2(xs, [points[x] for x in xs])
                curve.add(r2 >= LIMITS["curve_r2"], f"{key[0]} {key[1]} {key[2]}: " + ", ".join(
                    f"{x:,} tok -> {points[x]:.1f} GB" for x in xs) + f"; R^2 {r2:.4f}", src)
    mfu.best_of(best_mfu, lambda v: v >= LIMITS["mfu_4k"])
    packed.best_of(best_packed, lambda v: v >= LIMITS["mix_packed_vs_padded"])
    best.best_of(best_sdpa, lambda v: v >= LIMITS["mix_best_vs_sdpa"])
    for src, doc in attention:
        for r in doc["rows"]:
            if "flex" in str(r.get("method")) and "error" in r:
                flex.add(False, f"{r.get('layout')} {r['method']}: failed ({r['error'][:160]})", src)
            elif "flex" in str(r.get("method")):  # (a flex row that fell back to another kernel timed that kernel)
                ran = sorted(r.get("kernels") or {})
                flex.add(any("flex" in k for k in ran), f"{r.get('layout')} {r['method']}: {r['ms']:.3f} ms "
                         f"({r.get('vs_varlen', 0):.2f}x varlen; kernels {', '.join(ran) or 'none recorded'}"
                         + (f"; first call {r['first_call_s']:.1f} s" if "first_call_s" in r else "") + ")", src)
    return [mfu, long, packed, best, curve, small, flex]


def evaluate(paths) -> dict:
    """``{"targets": [Target.as_dict()...], "ignored": [(file, why)...], "read": {kind: count}}``."""
    by_kind: dict = {}
    ignored, read = [], {}
    for name, kind, data in read_sources(paths):
        k, content, why = classify(name, kind, data)
        if why:
            ignored.append((name, why))
            continue
        if k != "other":
            by_kind.setdefault(k, []).append((name, content))
            read[k] = read.get(k, 0) + 1
    targets = (_pacs_targets(by_kind.get("pacs_loss", []), by_kind.get("host", []))
               + _logprob_targets(by_kind.get("logprobs", []))
               + _junit_targets(by_kind.get("junit", []))
               + _learner_targets(by_kind.get("learner", []), by_kind.get("attention", [])))
    return {"targets": [t.as_dict() for t in targets], "ignored": ignored, "read": read}


def report(result: dict) -> str:
    lines = ["| issue | target | verdict |", "|---|---|---|"]
    lines += [f"| {t['issue']} | {t['target']} | {t['verdict']} |" for t in result["targets"]]
    lines += ["", "Files read: " + (", ".join(f"{n} {k}" for k, n in sorted(result["read"].items())) or "none")]
    for name, why in result["ignored"]:
        lines.append(f"Ignored: {name} ({why})")
    for t in result["targets"]:
        if t["evidence"]:
            lines += ["", f"{t['issue']}: {t['target']}: {t['verdict']}"] + [f"  {e}" for e in t["evidence"]]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", help="folders, .json / .xml files or lease.tgz archives")
    ap.add_argument("--json", default=None, help="also write the verdicts and their evidence here")
    args = ap.parse_args(argv)
    try:
        result = evaluate(args.paths)
    except (FileNotFoundError, tarfile.TarError) as e:
        print(f"bench/gpu/targets.py: {e}", file=sys.stderr)
        return 2
    print(report(result))
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(args.json + ".tmp", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
