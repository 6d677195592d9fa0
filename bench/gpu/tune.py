"""Measured launch tables: sweep the launch configurations of the log-prob kernels and the PACS loss
at the real shapes on one GPU (~8 minutes on an H100) and write the winners to
``kernels/tuned/sm_<arch>.json``, which every ``launch_config`` of those kernel files then reads
(kernels/tuning.py: an explicit ``CONFIG`` override wins over the measured table, which wins over the
built-in compile-model table).

    python bench/gpu/tune.py                          # on the GPU: writes kernels/tuned/sm_90.json on an H100
    python bench/gpu/tune.py --kernels linear_logprobs.stats_tiles --budget-s 200
    python bench/gpu/tune.py --dry-run                # CPU: enumerate, AOT-filter a subset, write to a temp dir

Kernels (N=8192, H=4096, V=151,936, bf16 by default; ``--dtype fp32`` tunes the fp32 entries):
``linear_logprobs.stats_tiles`` (the default forward, timed with the merge of its partials, which
depends on BLOCK_V and V_TILES), ``linear_logprobs.stats_tma`` (the selectable persistent TMA forward,
the same way; stage 2 adds PERSISTENT and FLATTEN), ``linear_logprobs.stats_gluon`` (the selectable
warp-specialised Gluon forward, sm_90 only, the same way; stage 2 sweeps GROUP_N), ``linear_logprobs.dlogits_gluon``
(the chunked backward with the Gluon dz kernel, likewise), ``linear_logprobs.dlogits_tma`` (the chunked backward
with the TMA dz kernel, likewise), ``linear_logprobs.dlogits`` (timed as the whole chunked backward:
the Triton dz chunks plus the cuBLAS GEMMs), ``linear_logprobs.grad_bwd`` (the atomic backward),
``token_logprobs.stats_fwd`` and ``token_logprobs.grad_bwd`` (logits [N, V]). The PACS loss kernels
``pacs_loss.fwd_sums`` (pass A), ``pacs_loss.fwd`` (pass B; both timed as the forward) and
``pacs_loss.bwd`` (B=1024, T=4096 and B=8192, T=1024, G=8, ``--pacs-dtype`` fp32 log-probs) are
shape-adaptive: their entries hold the launch policy the tiles are derived from (bytes per program,
programs per SM, warps, stages), not tiles; bench/gpu/tune_pacs.py sweeps and times them (~20 % of
the budget) with the same kind of compile filter (plus the compile test's PACS access checks),
override hook (``pacs_loss_launch.POLICY``) and "never slower" rule as below.

Per kernel: stage 1 sweeps tiles / warps / stages (pre-filtered by a register and shared-memory
estimate; ``--pingpong linear_logprobs.stats_gluon,...``: those Gluon kernels' ping-pong launches too,
PINGPONG=1 with 4-warp consumers, the built-in one timed second, whatever the budget), stage 2 sweeps
GROUP_N (and PERSISTENT, V_TILES for the forward) around the stage-1 winner. Every candidate is first
compiled ahead of time (kernels/aot.py, the compile test's own checks: no spills, shared memory within
the arch's limit, tensor cores for bf16) and dropped if it fails, in batches of COMPILE_BATCH per
compile process, each batch timed before the next is compiled (so a short share is spent on the
nearest candidates, compiled and timed, not on compiling ones never timed); survivors are run
through the real launcher with the candidate set in the kernel file's ``CONFIG`` (the override hook,
bench/gpu/tune_table.py), checked against the built-in configuration's output, and timed
(median of CUDA-event times). A kernel's budget share ends its sweep early (the JSON says how many
candidates were timed out of how many enumerated). The built-in configuration is always timed
first, so a winner is never slower than it in the same run.

Kernels that do the same job (the forwards ``stats_tiles`` / ``stats_tma`` / ``stats_gluon``, the dz
kernels ``dlogits`` / ``dlogits_tma`` / ``dlogits_gluon``): when a run sweeps two or more of them, each
with its winning configuration is timed again in alternation, and the fastest median becomes the
table's measured choice (``linear_logprobs.forward.16`` / ``linear_logprobs.dz.16``), which
``forward_kind`` / ``dz_kind`` of kernels/linear_logprobs.py then follow when ``CONFIG`` names none:
the fastest kernel becomes the default on that architecture, with the timings in the JSON.

``--also-h 896`` (bench/gpu/tune_shapes.py): each log-prob kernel's finalists (the fastest few of its
sweep, the built-in launch, the ping-pong one; then its other timed launches while the budget lasts)
timed again at those hidden sizes, N and V unchanged, and
the kinds chosen again there: ``by_h`` parts of the entries, which a launch at the nearest hidden size
takes (kernels/tuning.py). ALSO_H_SHARE of the budget per hidden size, taken from the sweeps'.

``--dry-run`` (no GPU): the same enumeration; only the built-in configuration and the first other
candidate of each kernel are compiled; nothing is timed; the first other candidate that compiles
clean is written as the "winner" (``"dry_run": true``, ``ms`` null) to a temporary folder, to test
the plumbing (tests/test_gpu_tune.py). It refuses to write into kernels/tuned/.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict

os.environ.pop("TRITON_INTERPRET", None)  # compiled kernels (and AOT compiles) only, never the interpreter

import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from pacs_fast.kernels import aot, linear_logprobs as KL, linear_logprobs_bwd as KLB, token_logprobs as KT, \
    tuning  # noqa: E402
from pacs_fast.kernels.linear_logprobs_launch import PINGPONG_CONFIGS  # noqa: E402
from pacs_fast.ops import vocab_parallel as vp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tune_pacs  # noqa: E402
from tune_candidates import stage1, stage2  # noqa: E402
import tune_shapes  # noqa: E402
from tune_table import (DTYPES, MODULES, check_choices_read_back, check_read_back, override,  # noqa: E402,F401
                        write_table)

SPECS = ("linear_logprobs.stats_tiles", "linear_logprobs.stats_tma", "linear_logprobs.stats_gluon",
         "linear_logprobs.dlogits", "linear_logprobs.dlogits_gluon",
         "linear_logprobs.dlogits_tma", "linear_logprobs.grad_bwd", "token_logprobs.stats_fwd",
         "token_logprobs.grad_bwd", "pacs_loss.fwd_sums", "pacs_loss.fwd", "pacs_loss.bwd")
BUDGET_SHARE = {"linear_logprobs.stats_tiles": 0.28, "linear_logprobs.stats_tma": 0.2,
                "linear_logprobs.stats_gluon": 0.2, "linear_logprobs.dlogits_gluon": 0.15,
                "linear_logprobs.dlogits": 0.2, "linear_logprobs.dlogits_tma": 0.15,
                "linear_logprobs.grad_bwd": 0.12, "token_logprobs.stats_fwd": 0.08, "token_logprobs.grad_bwd": 0.12,
                "pacs_loss.fwd_sums": 0.09, "pacs_loss.fwd": 0.04, "pacs_loss.bwd": 0.07}
COMPILE_BATCH = 2  # candidates per compile process in each batch of compile_and_sweep
ALSO_H_SHARE = 0.08  # of --budget-s per extra hidden size (launches timed in the sweep: no compiles)


# ---- candidates ---------------------------------------------------------------------------------

def base_config(name, n, h, v, dt, arch):
    """The built-in configuration (no CONFIG override, no measured table)."""
    mod, kernel = name.split(".")
    saved = tuning.TUNED_DIR
    tuning.TUNED_DIR = os.devnull  # no sm_<arch>.json can exist under it: no measured table
    try:
        with override(name, {}):
            extra = {} if mod == "token_logprobs" else dict(H=h)
            return MODULES[mod].launch_config(kernel, N=n, V=v, dtype=DTYPES[dt], arch=arch, **extra)
    finally:
        tuning.TUNED_DIR = saved


# ---- the compile filter (the override hook: tune_table.py) --------------------------------------

def _compile_worker(case_dict):
    r = aot.compile_case(aot.Case(**case_dict))
    return {k: r.get(k) for k in ("error", "regs", "stack", "local", "spill_insts", "shared", "smem_limit",
                                  "mma", "has_dot", "dtype")}


def compile_filter(name, cands, dt, arch, jobs, pool=None):
    """``[(cfg, report)]``; ``report["ok"]``: compiles, no spills, shared memory within the limit,
    bf16 ``tl.dot`` on tensor cores (the checks of tests/test_kernels_compile.py). ``pool``: an
    executor to compile in (else one of ``jobs`` processes, or this process)."""
    cases = [asdict(aot.logprob_case(name, arch, dt, c)) for c in cands]
    if pool is not None:
        reports = list(pool.map(_compile_worker, cases))
    elif jobs > 1 and len(cases) > 1:
        with ProcessPoolExecutor(jobs) as ex:
            reports = list(ex.map(_compile_worker, cases))
    else:
        reports = [_compile_worker(c) for c in cases]
    for r in reports:
        r["ok"] = (r["error"] is None and r["stack"] == 0 and r["spill_insts"] == 0 and r["local"] == 0
                   and r["shared"] <= r["smem_limit"] and (not r["has_dot"] or dt == "fp32" or bool(r["mma"])))
    return list(zip(cands, reports))


# ---- timing on the GPU --------------------------------------------------------------------------

def make_runners(n, h, v, dtype, dev):
    """``name -> (fn, compare)``: ``fn()`` runs the kernel through its launcher at the real shape and
    returns its outputs; ``compare(out, ref)`` the largest relative difference."""
    g = torch.Generator(device="cpu").manual_seed(0)
    hid = torch.randn(n, h, generator=g).to(dev, dtype)
    w = (torch.randn(v, h, generator=g) * (2 / h ** 0.5)).to(dev, dtype)
    labels = torch.randint(0, v, (n,), generator=g).to(dev)
    gl, gh = torch.randn(n, generator=g).to(dev), torch.randn(n, generator=g).to(dev)
    with override("linear_logprobs.stats_tiles", {}):
        m, s, a = vp.merge_splits(*KL.stats_fwd(hid, w, None, 1.0, True))
    log_s, ent = torch.log(s), torch.log(s) - a / s
    logits = hid @ w.T
    dlogits = torch.empty_like(logits)

    def rel(outs, refs):
        return max(float((o.float() - r.float()).abs().max() / (r.float().abs().max() + 1e-6))
                   for o, r in zip(outs, refs) if o is not None)

    def stats(out):  # lse in two parts and the entropy
        return (out[0], out[0] + torch.log(out[1]), torch.log(out[1]) - out[2] / out[1])
    return {
        "linear_logprobs.stats_tiles": (lambda: stats(vp.merge_splits(*KL.stats_fwd(hid, w, None, 1.0, True))), rel),
        # stats_fwd under override("linear_logprobs.stats_tma", ...) runs the TMA forward (FWD="tma")
        "linear_logprobs.stats_tma": (lambda: stats(vp.merge_splits(*KL.stats_fwd(hid, w, None, 1.0, True))), rel),
        "linear_logprobs.stats_gluon": (lambda: stats(vp.merge_splits(*KL.stats_fwd(hid, w, None, 1.0, True))),
                                        rel),
        "linear_logprobs.dlogits": (lambda: KLB.grad_bwd_chunked(hid, w, None, 1.0, labels, 0, m, log_s, ent, gl, gh), rel),
        # the chunked backward with the TMA dz kernel (override(...dlogits_tma) sets DLOGITS="tma")
        "linear_logprobs.dlogits_tma": (lambda: KLB.grad_bwd_chunked(hid, w, None, 1.0, labels, 0, m, log_s, ent, gl, gh),
                                        rel),
        "linear_logprobs.dlogits_gluon": (lambda: KLB.grad_bwd_chunked(hid, w, None, 1.0, labels, 0, m, log_s, ent, gl,
                                                                      gh), rel),
        "linear_logprobs.grad_bwd": (lambda: KL.grad_bwd(hid, w, None, 1.0, labels, 0, m, log_s, ent, gl, gh), rel),
        "token_logprobs.stats_fwd": (lambda: stats(vp.merge_splits(*KT.stats_fwd(logits, 1.0, True))), rel),
        "token_logprobs.grad_bwd": (lambda: (KT.grad_bwd(logits, dlogits, 1.0, labels, 0, -100, m, log_s, ent,
                                                         gl, gh),), rel),
    }


def time_ms(fn, iters):
    fn()  # compile + warm-up
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def sweep(name, runner, cands, ref, deadline, iters, tol, log):
    """Times the candidates in order until ``deadline``; returns ``[(cfg, ms, err)]``."""
    fn, compare = runner
    out = []
    for cfg in cands:
        if time.time() > deadline and out:
            break
        with override(name, cfg):
            try:
                res = fn()
                err = compare(res, ref) if ref is not None else 0.0
                ms = time_ms(fn, iters) if err <= tol else float("inf")
            except Exception as e:  # noqa: BLE001 - a candidate that cannot launch is skipped
                log(f"  {name} {cfg}: {type(e).__name__}: {str(e)[:200]}")
                continue
        out.append((cfg, ms, err))
        log(f"  {name} {_short(cfg)}: {ms:.3f} ms (rel err {err:.1e})")
    return out


def compile_and_sweep(name, runner, cands, head, ref, deadline, dt, arch, jobs, iters, tol, log, always=None):
    """Compile-filters ``cands`` in batches (``COMPILE_BATCH`` per compile process), timing each batch's
    survivors before compiling the next, until ``deadline``: a short budget goes to the nearest
    candidates compiled *and* timed, not to compiling candidates that are never timed. The first
    ``head`` candidates are timed whatever the deadline; ``always`` (the built-in launch) is timed even
    if its compile report fails (it runs today). Returns ``(checked, timed)``: ``[(cfg, report)]`` and
    ``[(cfg, ms, err)]``."""
    checked, timed = [], []
    size = max(head, COMPILE_BATCH * max(1, jobs))
    with ProcessPoolExecutor(jobs) if jobs > 1 else contextlib.nullcontext() as pool:
        for i in range(0, len(cands), size):
            if i and time.time() > deadline:
                break
            batch = compile_filter(name, cands[i:i + size], dt, arch, 1, pool)
            checked += batch
            ok = [c for c, r in batch if r["ok"] or c == always]
            timed += sweep_head_first(name, runner, ok, max(0, head - i), ref, deadline, iters, tol, log) if ok else []
    return checked, timed


def sweep_head_first(name, runner, cands, head, ref, deadline, iters, tol, log):
    """``sweep``, with the first ``head`` candidates timed whatever the deadline."""
    return sweep(name, runner, cands[:head], ref, float("inf"), iters, tol, log) + \
        sweep(name, runner, cands[head:], ref, deadline, iters, tol, log)


# ---- the measured kernel choice ------------------------------------------------------------------

# kernels doing the same job (tuner name -> the forward_kind / dz_kind value that selects it)
CHOICES = {"forward": {"linear_logprobs.stats_tiles": "tiles", "linear_logprobs.stats_tma": "tma",
                       "linear_logprobs.stats_gluon": "gluon"},
           "dz": {"linear_logprobs.dlogits": "pointer", "linear_logprobs.dlogits_tma": "tma",
                  "linear_logprobs.dlogits_gluon": "gluon"}}
CHOICE_ROUNDS = 3


def choose(job, kinds, results, runners, width, iters, shape, dry_run, log):
    """The table entry ``linear_logprobs.<job>.<width>`` (read by ``forward_kind`` / ``dz_kind``): the
    fastest of the ``kinds`` swept in this run (at least two), each with its winning configuration,
    timed in alternation CHOICE_ROUNDS times (medians), since a clock that drifts through the run
    (the H200's fell from 1980 to ~1550 MHz under load) would favour whichever was timed first; a
    kind whose every candidate disagreed with the built-in output (ms inf) is not a candidate. A dry
    run names the first swept kind other than the default, untimed (plumbing only)."""
    swept = {name: results[f"{name}.{width}"]["config"] for name in kinds if f"{name}.{width}" in results
             and (dry_run or results[f"{name}.{width}"]["ms"] not in (None, float("inf")))}
    if len(swept) < 2:
        return None
    rec = dict(configs={kinds[name]: cfg for name, cfg in swept.items()},
               shape=f"N{shape['n']} H{shape['h']} V{shape['v']}", h=shape["h"], dtype=shape["dt"],
               rounds=CHOICE_ROUNDS,
               rule="fastest median of alternating timings, each kind with its tuned configuration")
    if dry_run:
        default = "tiles" if job == "forward" else "pointer"
        return dict(rec, choice=next(kinds[name] for name in swept if kinds[name] != default), ms=None, rounds=0)
    times = {name: [] for name in swept}
    for _ in range(CHOICE_ROUNDS):
        for name, cfg in swept.items():
            with override(name, cfg):
                try:
                    times[name].append(time_ms(runners[name][0], iters))
                except Exception as e:  # noqa: BLE001 - it ran in its sweep; if not now, it is not chosen
                    log(f"  {name}: {type(e).__name__}: {str(e)[:200]}")
                    times[name].append(float("inf"))
    ms = {kinds[name]: statistics.median(t) for name, t in times.items()}
    picked = min(ms, key=ms.get)
    log(f"linear_logprobs.{job}: {picked} " + ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items()))
    return dict(rec, choice=picked, ms=ms)


def _short(cfg):
    return " ".join(f"{k}={v}" for k, v in cfg.items())


# ---- main -----------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernels", default=",".join(SPECS))
    ap.add_argument("--shape", default="8192x4096x151936", help="N x H x V")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="of the log-prob kernels")
    ap.add_argument("--pacs-dtype", default="fp32", choices=sorted(DTYPES), help="of the PACS loss's log-probs")
    ap.add_argument("--budget-s", type=float, default=480.0, help="whole sweep, compiles included")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--out-dir", default=None, help="default kernels/tuned/ (a temporary folder with --dry-run)")
    ap.add_argument("--arch", type=int, default=None, help="dry run: the architecture to enumerate for (90)")
    ap.add_argument("--pingpong", default="",
                    help="comma-separated Gluon kernels (linear_logprobs.stats_gluon, linear_logprobs.dlogits_gluon) "
                         "whose ping-pong launches join the sweep; only those whose GPU check passed on this machine "
                         "(a wrong mbarrier protocol hangs)")
    ap.add_argument("--also-h", default="", help="comma-separated hidden sizes at which the log-prob kernels' "
                    "finalists are timed again (per-hidden-size entries), e.g. 896")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--dry-run-subset", type=int, default=2, help="candidates compiled per kernel in a dry run")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    t0 = time.time()
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    names = args.kernels.split(",")
    bad = [k for k in names if k not in SPECS]
    if bad:
        raise SystemExit(f"unknown kernels {bad}; choose from {SPECS}")
    pingpong = [k for k in args.pingpong.split(",") if k]
    bad = [k for k in pingpong if k not in names or k.split(".")[1] not in PINGPONG_CONFIGS]
    if bad:
        raise SystemExit(f"--pingpong {bad}: only Gluon kernels swept in this run (--kernels) have a ping-pong "
                         f"launch: {[f'linear_logprobs.{k}' for k in PINGPONG_CONFIGS]}")
    n, h, v = (int(x) for x in args.shape.lower().split("x"))
    try:
        also_h = [int(x) for x in args.also_h.split(",") if x]
    except ValueError:
        raise SystemExit(f"--also-h {args.also_h!r}: comma-separated hidden sizes, e.g. 896,3584") from None
    if any(x <= 0 or x % 16 or x == h for x in also_h):
        raise SystemExit(f"--also-h {args.also_h!r}: positive multiples of 16 other than the main shape's H={h}")
    budget_s = args.budget_s * (1 - ALSO_H_SHARE * len(also_h))
    if budget_s <= 0:
        raise SystemExit(f"--also-h: {len(also_h)} hidden sizes leave no budget for the sweeps")
    dt = args.dtype
    default_dir = os.path.join(ROOT, "kernels", "tuned")
    if args.dry_run:
        arch = args.arch or 90
        out_dir = args.out_dir or tempfile.mkdtemp(prefix="gpu_tune_dry_")
        if os.path.realpath(out_dir) == os.path.realpath(default_dir):
            raise SystemExit("--dry-run writes untimed 'winners': not into kernels/tuned/")
        device = "dry run (no GPU)"
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: use --dry-run to check the sweep without one")
        arch = KL.device_arch(torch.device("cuda"))
        if args.arch not in (None, arch):
            raise SystemExit(f"--arch {args.arch} but this GPU is sm_{arch}")
        out_dir = args.out_dir or default_dir
        device = torch.cuda.get_device_name()
    width = "32" if dt == "fp32" else "16"
    pacs = [k for k in names if k.startswith("pacs_loss.")]
    lp_names = [k for k in names if k not in pacs]
    runners = None if args.dry_run or not lp_names else make_runners(n, h, v, DTYPES[dt], "cuda")
    tol = 1e-3 if dt == "fp32" else 2e-2  # vs the built-in config's output: summation order only
    results, timed_by = {}, {}
    for name in [k for k in lp_names if k.endswith("_gluon") and arch != 90]:  # wgmma: Hopper only
        log(f"{name}: skipped (a Hopper kernel; this is sm_{arch})")
        lp_names.remove(name)
    for name in lp_names:
        share_end = time.time() + budget_s * BUDGET_SHARE[name] / sum(BUDGET_SHARE[k] for k in names)
        base = base_config(name, n, h, v, dt, arch)
        s1 = stage1(name, base, dt, arch, name in pingpong)
        s2_count = len(stage2(name, base))
        log(f"{name}: {len(s1)} stage-1 candidates, {s2_count} stage-2 around the stage-1 winner; built-in "
            f"{_short(base)}")
        rec = dict(enumerated=len(s1) + s2_count, shape=f"N{n} H{h} V{v}", dtype=dt, builtin=base,
                   **({"h": h} if name.startswith("linear_logprobs.") else {}))  # token_logprobs: no H
        if args.dry_run:
            todo = s1[:max(1, args.dry_run_subset)]
            checked = compile_filter(name, todo, dt, arch, min(args.jobs, len(todo)))
            ok = [c for c, r in checked if r["ok"]]
            for c, r in checked:
                log(f"  {'ok  ' if r['ok'] else 'DROP'} {_short(c)}: regs {r['regs']} stack {r['stack']} "
                    f"smem {r['shared']} {r['error'] or ''}"[:300])
            winner = next((c for c in ok if c != base), base)
            rec.update(config=winner, ms=None, builtin_ms=None, compiled=len(checked), compile_rejected=len(checked)
                       - len(ok), timed=0)
        else:
            ref = runners[name][0]()
            torch.cuda.synchronize()
            # the built-in launch (and the built-in ping-pong one, second) whatever the budget: they are
            # what the kind choice compares
            checked, t1 = compile_and_sweep(name, runners[name], s1, 2 if name in pingpong else 1, ref,
                                            time.time() + 0.7 * (share_end - time.time()), dt, arch, args.jobs,
                                            args.iters, tol, log, always=base)
            best = min(t1, key=lambda r: r[1])[0]
            checked2, t2 = compile_and_sweep(name, runners[name], [c for c in stage2(name, best) if c != best], 0,
                                             ref, share_end, dt, arch, args.jobs, args.iters, tol, log)
            timed = timed_by[name] = t1 + t2
            win_cfg, win_ms, win_err = min(timed, key=lambda r: r[1])
            base_ms = next(ms for c, ms, _ in timed if c == base)
            rec.update(config=win_cfg, ms=win_ms, builtin_ms=base_ms, speedup=base_ms / win_ms, rel_err=win_err,
                       compiled=len(checked) + len(checked2),
                       compile_rejected=sum(not r["ok"] for _, r in checked + checked2), timed=len(timed))
            log(f"{name}: winner {_short(win_cfg)} {win_ms:.3f} ms (built-in {base_ms:.3f} ms)")
        results[tuning.entry_key(*name.split("."), width)] = rec
        # written after every kernel (atomically): a later candidate that hangs until the caller's timeout
        # kills the run (a Gluon launch never run on this GPU) loses only the kernels not yet measured
        write_table(out_dir, arch, device, results, args.dry_run)
    lp_results = dict(results)
    for job, kinds in CHOICES.items():
        rec = choose(job, kinds, lp_results, runners, width, args.iters, dict(n=n, h=h, v=v, dt=dt), args.dry_run, log)
        if rec is not None:
            results[tuning.entry_key("linear_logprobs", job, width)] = rec
    for h2 in also_h if lp_names else ():
        tune_shapes.tune_at(sys.modules[__name__], h2, [k for k in lp_names if k.startswith("linear_logprobs.")],
                                timed_by, results, n=n, v=v, dt=dt, width=width,
                                iters=args.iters, tol=tol, budget_s=args.budget_s * ALSO_H_SHARE,
                                dry_run=args.dry_run, log=log)
    if pacs:
        del runners  # the log-prob runners' GPU memory
        budget = budget_s * sum(BUDGET_SHARE[k] for k in pacs) / sum(BUDGET_SHARE[k] for k in names)
        results.update(tune_pacs.tune([k.split(".")[1] for k in pacs], arch=arch, dt=args.pacs_dtype,
                                          budget_s=budget, shares={k.split(".")[1]: BUDGET_SHARE[k] for k in pacs},
                                          iters=args.iters, jobs=args.jobs, dry_run=args.dry_run,
                                          subset=args.dry_run_subset, log=log))
    path = write_table(out_dir, arch, device, results, args.dry_run)
    check_read_back(path, arch, lp_results, n, h, v, dt)
    check_choices_read_back(path, arch, results, width)
    tune_pacs.check_read_back(path, arch, {k: r for k, r in results.items() if k.startswith("pacs_loss.")})
    log(f"wrote {path} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
