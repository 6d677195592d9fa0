"""The compile table of every Triton kernel (kernel x arch x dtype), from ahead-of-time compilation.

Runs ``python -m pacs_fast.kernels.aot`` (no GPU needed; TRITON_INTERPRET is removed from its
environment) or reads its JSON, and prints a markdown table: launch parameters, shared memory,
registers, spills, tensor-core instruction, the softmax epilogue's FP32 instructions and ex2 per logit
(static SASS counts over the logits a thread holds; the fp32 rows include the FMA dot itself), 64-bit
row offsets. ``--update-doc docs/GPU.md``
rewrites the table between the ``compile-table`` markers of that file (so the doc is generated,
never typed by hand).

    python bench/gpu/compile_report.py                           # compile (about 1-3 min on 2 cores) and print
    python bench/gpu/compile_report.py --update-doc docs/GPU.md  # and refresh the doc
    python bench/gpu/compile_report.py --json aot.json           # table of an earlier run
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START, END = "<!-- compile-table:start -->", "<!-- compile-table:end -->"


def run_aot(out: str, archs: str | None = None, modules: str | None = None, jobs: int = 2) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "pacs_fast.kernels.aot", "--json", out, "--jobs", str(jobs)]
    if archs:
        cmd += ["--archs", archs]
    if modules:
        cmd += ["--modules", modules]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    with open(out) as f:
        return json.load(f)


def _params(c: dict) -> str:
    k = c["constexprs"]
    if c["module"] == "linear_logprobs_finish":
        tile = f"{k['BLOCK_R']} rows, S{k['BLOCK_S']}, H{k['BLOCK_H']}"
    elif c["module"] == "linear_logprobs_gluon":  # its tiles are its descriptors' blocks
        (bn, bh), (bv, _) = c["blocks"]["Hdesc"], c["blocks"]["Wdesc"]
        tile = f"{bn}x{bv}x{bh}"
    elif c["module"].startswith("linear_logprobs"):
        tile = f"{k['BLOCK_N']}x{k['BLOCK_V']}x{k['BLOCK_H']}"
    elif c["module"] == "token_logprobs":
        tile = f"V{k['BLOCK_V']}"
    elif c["fn"] == "_pacs_group_kernel":
        tile = f"G{k['BLOCK_G']}xS{k['BLOCK_S']}"
    elif c["fn"] == "_pacs_one_pass_kernel":  # a [BLOCK_G, BLOCK_T] tile of the group's rows
        tile = f"G{k['BLOCK_G']}xT{k['BLOCK_T']}"
    else:  # the PACS streaming kernels: a [ROWS, BLOCK_T] tile
        tile = f"{k['ROWS']}x{k['BLOCK_T']}"
    return f"{tile} w{c['num_warps']} s{c['num_stages']}"


def _tc(c: dict) -> str:
    if c.get("error"):
        return "-"
    if c["mma"]:
        names = sorted({m.split(".")[0] if m.startswith(("wgmma", "tcgen05")) else "mma.sync" for m in c["mma"]})
        return "/".join(names) + (" bf16" if any("bf16" in m for m in c["mma"]) else "")
    if c["has_dot"]:
        return "none (IEEE fp32 FMA)" + (" TF32!" if c["tf32"] else "")
    return "- (no tl.dot)"


def table(report: dict) -> str:
    rows = ["| kernel | variant | arch | dtype | launch (tile, warps, stages) | shared B | regs | stack B (spills) "
            "| tensor cores | FP32 instr. / ex2 per logit | 64-bit row offsets |",
            "|---|---|---|---|---|---:|---:|---:|---|---:|---|"]
    order = {"token_logprobs": 0, "linear_logprobs": 1, "linear_logprobs_fwd": 1, "linear_logprobs_tma": 1,
             "linear_logprobs_finish": 1, "pacs_loss": 2}
    cases = sorted(report["cases"], key=lambda c: (order.get(c["module"], 9), c["fn"], c["variant"], c["dtype"], c["arch"]))
    for c in cases:
        name = f"{c['module']}.{c['fn']}"
        if c.get("error"):
            rows.append(f"| {name} | {c['variant']} | sm_{c['arch']} | {c['dtype']} | {_params(c)} | "
                        f"COMPILE ERROR: {c['error'][:80]} | | | | | |")
            continue
        offs = c["offsets"]
        ok = all(not u["narrow"] and u["wide"] > 0 for u in offs.values())
        spill = f"{c['stack']}" + (f" ({c['spill_insts']} STL/LDL)" if c["spill_insts"] else "")
        per = f"{c['alu_per_logit']:g} / {c['ex2_per_logit']:g}" if "alu_per_logit" in c else "-"
        rows.append(f"| {name} | {c['variant']} | sm_{c['arch']} | {c['dtype']} | {_params(c)} | {c['shared']:,} | "
                    f"{c['regs']} | {spill} | {_tc(c)} | {per} | {(('yes' if ok else 'NO') + ': ' + ', '.join(offs)) if offs else '-'} |")
    shapes = sorted({s for c in report["cases"] for s in c["shapes"]})
    head = (f"Triton {report['triton']}, targets {', '.join('sm_%d' % a for a in report['archs'])}; "
            f"launch parameters from each kernel's `launch_config` at: {'; '.join(shapes)}.\n\n")
    return head + "\n".join(rows) + "\n"


def update_doc(path: str, text: str):
    with open(path) as f:
        doc = f.read()
    if START not in doc or END not in doc:
        raise SystemExit(f"{path}: no {START} ... {END} markers")
    a, b = doc.index(START) + len(START), doc.index(END)
    new = doc[:a] + "\n" + text + doc[b:]
    with open(path + ".tmp", "w") as f:
        f.write(new)
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="read this aot report instead of compiling")
    ap.add_argument("--save-json", help="keep the aot report here")
    ap.add_argument("--archs", default=None)
    ap.add_argument("--modules", default=None)
    ap.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--out", help="write the markdown table here")
    ap.add_argument("--update-doc", help="replace the table between the compile-table markers of this file")
    args = ap.parse_args()
    if args.json:
        with open(args.json) as f:
            report = json.load(f)
    else:
        out = args.save_json or os.path.join(tempfile.mkdtemp(), "aot.json")
        report = run_aot(out, args.archs, args.modules, args.jobs)
    text = table(report)
    print(text)
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            f.write(text)
        os.replace(args.out + ".tmp", args.out)
    if args.update_doc:
        update_doc(args.update_doc, text)
    return 1 if any(c.get("error") for c in report["cases"]) else 0


if __name__ == "__main__":
    sys.exit(main())
