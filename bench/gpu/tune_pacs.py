"""The PACS loss part of bench/gpu/tune.py: tunes the launch POLICY of kernels/pacs_loss_launch.py.

The loss's launch parameters are shape-adaptive (``launch_config`` derives ROWS, BLOCK_T, N_SPLIT
and BLOCK_S from B and T), so what is measured and stored is not a tile but the shape-independent
policy the tiles are derived from (``pacs_loss_launch.BUILTIN_POLICY``): for the streaming kernels
(``fwd_sums`` = pass A, ``bwd``) the bytes per program (STREAM_BYTES), the largest tile (MAX_TILE),
the programs per SM the grid aims at (PROGRAMS_PER_SM), the warps below / from 4096-element tiles
(num_warps / num_warps_large) and num_stages; for pass B (``fwd``) its elements per step
(GROUP_ELEMS) and num_warps. A candidate policy is timed at the real shapes (``SHAPES``: B=1024,
T=4096 and B=8192, T=1024, G=8, fp32 log-probs by default, bool mask, padded) through the real
launchers ``pacs_loss_fwd`` / ``pacs_loss_bwd`` with the candidate set as ``pacs_loss_launch.POLICY`` (the
explicit override), and scored by the time summed over the shapes. Pass A and pass B are timed
together as the forward (pass B reads pass A's partials; pass A's N_SPLIT sizes pass B's steps),
one kernel's policy swept at a time with the other's fixed: pass A (stage 1: the knobs above but
num_stages; stage 2: num_stages around the stage-1 winner), then pass B; the backward alone.

Candidates are deduplicated by the launch configurations they give at the real shapes (two
policies that launch the same kernels are one candidate; a knob that changes nothing at these
shapes, e.g. GROUP_ELEMS at N_SPLIT <= 2, stays built-in), ordered by how many knobs differ from the
current policy (a local search: the budget may end a stage early), and compile-filtered ahead of
time with every check tests/test_kernels_compile.py makes on the PACS cases (kernels/aot.py
``pacs_cases``: the compile test's own shapes, groups and packed variant, at SM_COUNT and at this
GPU's SM count): compiles, no spills, shared memory within the limit, no tensor-core instruction,
64-bit row offsets, 16-byte loads and stores on padded rows (``aot.pacs_access_problems``).
Survivors are checked against the built-in policy's outputs (loss, proxies, coefficients, dlogp) and
timed as CUDA-graph replays of 20 rounds over both shapes (no launch overhead: the kernels take
tens of microseconds; the two shapes' data together exceed an H100's 50 MB L2), median of ``iters``
replays. The current policy is timed first, and a winner must beat it by more than 1 % in a
second, interleaved timing of both, so a winner is never slower than the built-in policy.
"""
from __future__ import annotations

import itertools
import json
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict

import torch

from pacs_fast.kernels import aot, pacs_loss as KP, pacs_loss_launch as KPL, tuning

SHAPES = aot.PACS_SHAPES  # (B, T): (1024, 4096), (8192, 1024)
G = 8
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
STREAM_SWEEP = dict(STREAM_BYTES=(8192, 16384, 32768, 65536), MAX_TILE=(4096, 8192), PROGRAMS_PER_SM=(2, 4, 8, 16),
                    num_warps=(2, 4, 8), num_warps_large=(4, 8, 16))
STAGES_SWEEP = dict(num_stages=(1, 2, 3, 4))
GROUP_SWEEP = dict(GROUP_ELEMS=(512, 1024, 2048, 4096), num_warps=(1, 2, 4, 8))
# per kernel: its sweep stages and the share of the kernel's budget each may use (of what is left)
STAGES = {"fwd_sums": ((STREAM_SWEEP, 0.7), (STAGES_SWEEP, 1.0)), "fwd": ((GROUP_SWEEP, 1.0),),
          "bwd": ((STREAM_SWEEP, 0.7), (STAGES_SWEEP, 1.0))}
MARGIN = 0.01  # a winner must beat the current policy by more than this in the confirming timing
REPS = 20  # rounds over the shapes per CUDA graph


class override:
    """Sets ``policies`` ({kernel: full policy}) as ``pacs_loss_launch.POLICY`` (the built-in policy for the
    kernels not named; None: no policy override at all, the measured table applies) with no
    ``CONFIG`` tile override, and the forward as pass A + pass B (``CONFIG["ONE_PASS"] = 0``; the real shapes
    would otherwise take the one-launch forward, which this does not tune); restores both on exit."""

    def __init__(self, policies):
        self.policies = policies

    def __enter__(self):
        self.saved = ({k: dict(v) for k, v in KPL.POLICY.items()}, dict(KPL.CONFIG))
        for k in KPL.KERNELS:
            KPL.POLICY[k] = {} if self.policies is None else dict(self.policies.get(k, KPL.BUILTIN_POLICY[k]))
        KPL.CONFIG.update({k: None for k in KPL.CONFIG})
        KPL.CONFIG["ONE_PASS"] = 0  # the two-pass forward, whose policy this tunes (the one-pass kernel's is built-in)
        return self

    def __exit__(self, *exc):
        KPL.POLICY.clear()
        KPL.POLICY.update(self.saved[0])
        KPL.CONFIG.update(self.saved[1])


def configs(kernel, policies, dt, arch, sm):
    """``kernel``'s launch configurations at ``SHAPES`` (G=8) under ``policies``."""
    with override(policies):
        return [KPL.launch_config(kernel, B=b, T=t, G=G, dtype=DTYPES[dt], arch=arch, sm_count=sm) for b, t in SHAPES]


def candidates(kernel, sweep, chosen, dt, arch, sm):
    """``chosen[kernel]`` first, then the policies ``sweep`` spans around it that launch something
    else at ``SHAPES`` (one per distinct launch), fewest knobs changed first."""
    cur = chosen[kernel]
    pols = [dict(cur, **dict(zip(sweep, vals))) for vals in itertools.product(*sweep.values())]
    pols.sort(key=lambda p: sum(p[k] != cur[k] for k in cur))  # stable: the sweep's order among equals
    seen, out = set(), []
    for p in [cur] + pols:
        sig = json.dumps(configs(kernel, dict(chosen, **{kernel: p}), dt, arch, sm), sort_keys=True)
        if sig not in seen:
            seen.add(sig)
            out.append(p)
    return out


def _ok(r):
    return (r["error"] is None and r["stack"] == 0 and r["spill_insts"] == 0 and r["local"] == 0
            and r["shared"] <= r["smem_limit"] and not r["mma"] and aot.pacs_access_problems(r) is None
            and all(not u["narrow"] and u["wide"] > 0 for u in r["offsets"].values()))


def compile_filter(kernel, cands, chosen, dt, arch, sm, jobs):
    """``[(policy, ok, why, cases)]``; ok: every compile case of the compile test (``aot.pacs_cases``)
    the policy gives, at SM_COUNT and at ``sm``, compiles clean (``_ok``); identical cases compile once."""
    keys, todo = [], {}
    for p in cands:
        with override(dict(chosen, **{kernel: p})):
            cases = [c for s in {None, sm} for c in aot.pacs_cases(
                arch, (dt,), (kernel,), lambda k, **kw: KPL.launch_config(k, arch=arch, sm_count=s, **kw))]
        keys.append([aot.compile_key(c) for c in cases])
        todo.update({aot.compile_key(c): asdict(c) for c in cases})
    names = list(todo)
    if jobs > 1 and len(names) > 1:
        with ProcessPoolExecutor(min(jobs, len(names))) as ex:
            rows = dict(zip(names, ex.map(aot._compile_worker, [todo[k] for k in names])))
    else:
        rows = {k: aot._compile_worker(todo[k]) for k in names}
    out = []
    for p, ks in zip(cands, keys):
        bad = [rows[k] for k in ks if not _ok(rows[k])]
        why = "" if not bad else f"{bad[0]['label']}: " + (bad[0]["error"] or f"regs {bad[0]['regs']} stack "
                                                           f"{bad[0]['stack']} {aot.pacs_access_problems(bad[0]) or ''}")
        out.append((p, not bad, why[:300], len(ks)))
    return out


# ---- timing on the GPU --------------------------------------------------------------------------

class Bench:
    """The real shapes' inputs and the runs of the forward (pass A + pass B) and the backward."""

    def __init__(self, dt, iters, log):
        self.iters, self.log, self.graphs = iters, log, True
        self.xs = []
        for i, (b, t) in enumerate(SHAPES):
            g = torch.Generator().manual_seed(i)
            logp = -5 * torch.rand(b, t, generator=g)
            lengths = torch.randint(t // 2, t + 1, (b,), generator=g)
            self.xs.append(dict(logp=logp.to("cuda", DTYPES[dt]),
                                ref=(logp + 0.01 * torch.randn(b, t, generator=g)).to("cuda", DTYPES[dt]),
                                mask=(torch.arange(t) < lengths[:, None]).cuda(),
                                rewards=torch.randint(0, 2, (b,), generator=g).float().cuda()))
        self.grad = torch.ones((), device="cuda")
        with override({}):  # the built-in policy's outputs: the reference of every candidate
            self.ref = {"fwd": self.outputs("fwd")}
            for x, out in zip(self.xs, self.ref["fwd"]):
                x["coef"] = out[2]
            self.ref["bwd"] = self.outputs("bwd")

    def fwd(self, x):
        out = KP.pacs_loss_fwd(x["logp"], x["ref"], x["mask"], x["rewards"], None, group_size=G, beta=1.0,
                               score="rloo", weight_mode="question", proxy="logratio")
        return out[0], out[1][0], out[2]  # loss, proxies, coefficients

    def bwd(self, x):
        return (KP.pacs_loss_bwd(self.grad, x["coef"], x["mask"], None, x["logp"].shape, x["logp"].dtype),)

    def outputs(self, which):
        return [getattr(self, which)(x) for x in self.xs]

    def time_ms(self, which):
        """Median ms of one round over ``SHAPES``, from CUDA-graph replays of REPS rounds (host
        launches timed in a loop if graph capture fails on the first timing)."""
        fns = [lambda x=x: getattr(self, which)(x) for x in self.xs]
        for f in fns:
            f()  # compile + warm-up
        torch.cuda.synchronize()

        def rounds():
            for _ in range(REPS):
                for f in fns:
                    f()
        run, graph = rounds, None
        if self.graphs:
            try:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    fns[0]()
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    rounds()
                run = graph.replay
            except Exception as e:  # noqa: BLE001
                if getattr(self, "timed_once", False):
                    raise
                self.log(f"  CUDA graph capture failed ({type(e).__name__}: {str(e)[:200]}): timing host launches")
                self.graphs, run = False, rounds
        self.timed_once = True
        run()
        torch.cuda.synchronize()
        ts = []
        for _ in range(self.iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b) / REPS)
        del graph
        return statistics.median(ts)


def _rel(outs, refs):
    return max(float((o.float() - r.float()).abs().max() / (r.float().abs().max() + 1e-6))
               for out, ref in zip(outs, refs) for o, r in zip(out, ref))


def sweep(bench, which, kernel, cands, chosen, deadline, tol, log):
    """Times ``cands`` (policies of ``kernel``, the current one first) until ``deadline``; returns
    ``[(policy, ms, err)]`` (err: against the built-in policy's outputs)."""
    out = []
    for p in cands:
        if time.time() > deadline and out:
            break
        try:
            with override(dict(chosen, **{kernel: p})):
                err = _rel(bench.outputs(which), bench.ref[which])
                ms = bench.time_ms(which) if err <= tol else float("inf")
        except Exception as e:  # noqa: BLE001 - a candidate that cannot launch is skipped
            log(f"  pacs_loss.{kernel} {_short(p)}: {type(e).__name__}: {str(e)[:200]}")
            if not out:
                raise
            continue
        out.append((p, ms, err))
        log(f"  pacs_loss.{kernel} {_short(p)}: {ms * 1e3:.1f} us (rel err {err:.1e})")
    return out


def confirm(bench, which, kernel, cur, best, chosen, log):
    """``best`` if it beats ``cur`` by more than MARGIN in a second, interleaved timing, else ``cur``."""
    if best == cur:
        return cur
    ts = {0: [], 1: []}
    for _ in range(3):
        for i, p in enumerate((cur, best)):
            with override(dict(chosen, **{kernel: p})):
                ts[i].append(bench.time_ms(which))
    a, b = statistics.median(ts[0]), statistics.median(ts[1])
    log(f"  pacs_loss.{kernel} confirm: current {a * 1e3:.1f} us, best {b * 1e3:.1f} us")
    return best if b < a * (1 - MARGIN) else cur


def _short(p):
    return " ".join(f"{k}={v}" for k, v in p.items())


# ---- the driver (called by bench/gpu/tune.py) -----------------------------------------------------

def tune(kernels, *, arch, dt, budget_s, shares, iters, jobs, dry_run, subset, log):
    """Tunes ``kernels`` (of ``fwd_sums``, ``fwd``, ``bwd``) within ``budget_s`` (split by ``shares``);
    returns ``{"pacs_loss.<kernel>.<width>": record}``: ``config`` the policy (the part
    ``launch_config`` reads), ``configs`` the launch configurations it gives at ``SHAPES`` on this GPU,
    times in ms of one forward / backward summed over the shapes. ``dry_run``: nothing is timed; the
    first ``subset`` candidates are compiled and the first other one that compiles clean is written."""
    sm = None if dry_run else KPL._sm_count(torch.device("cuda"))
    width = "32" if dt == "fp32" else "16"
    chosen = {k: dict(KPL.BUILTIN_POLICY[k]) for k in KPL.KERNELS}
    bench = None if dry_run else Bench(dt, iters, log)
    tol = 1e-3  # vs the current policy's outputs: fp32 summation order only
    shape = ", ".join(f"B{b} T{t}" for b, t in SHAPES) + f"; G{G}; padded, bool mask"
    results = {}
    for kernel in [k for k in KPL.KERNELS if k in kernels]:  # pass A before pass B (its N_SPLIT)
        which = "bwd" if kernel == "bwd" else "fwd"
        end = time.time() + budget_s * shares[kernel] / sum(shares[k] for k in kernels)
        stages = [candidates(kernel, sw, chosen, dt, arch, sm) for sw, _ in STAGES[kernel][:1]]
        n_more = sum(len(candidates(kernel, sw, chosen, dt, arch, sm)) - 1 for sw, _ in STAGES[kernel][1:])
        log(f"pacs_loss.{kernel}: {len(stages[0])} stage-1 candidates (distinct launches at the real shapes), "
            f"{n_more} in later stages; built-in policy {_short(chosen[kernel])}")
        rec = dict(enumerated=len(stages[0]) + n_more, shape=shape, dtype=dt, sm_count=sm or KPL.SM_COUNT,
                   builtin=dict(KPL.BUILTIN_POLICY[kernel]),
                   timed_as="forward (pass A + pass B)" if which == "fwd" else "backward")
        if dry_run:
            checked = compile_filter(kernel, stages[0][:max(1, subset)], chosen, dt, arch, sm, jobs)
            for p, ok, why, n in checked:
                log(f"  {'ok  ' if ok else 'DROP'} {_short(p)} ({n} cases) {why}"[:300])
            winner = next((p for p, ok, _, _ in checked if ok and p != chosen[kernel]), chosen[kernel])
            chosen[kernel] = winner  # as in a timed run: pass B's candidates follow pass A's policy
            rec.update(config=winner, ms=None, builtin_ms=None, compiled=len(checked),
                       compile_rejected=sum(not ok for _, ok, _, _ in checked), timed=0)
        else:
            compiled = rejected = timed = 0
            builtin_ms = None
            for i, (sw, frac) in enumerate(STAGES[kernel]):
                cur = chosen[kernel]
                cands = stages[0] if i == 0 else candidates(kernel, sw, chosen, dt, arch, sm)
                checked = compile_filter(kernel, cands, chosen, dt, arch, sm, jobs)
                for p, ok, why, _ in checked:
                    if not ok:
                        log(f"  DROP {_short(p)}: {why}")
                ok = [p for p, good, _, _ in checked if good and p != cur]
                compiled, rejected = compiled + len(checked), rejected + sum(not g for _, g, _, _ in checked)
                t = sweep(bench, which, kernel, [cur] + ok, chosen, time.time() + frac * (end - time.time()), tol,
                          log)
                timed += len(t)
                builtin_ms = t[0][1] if builtin_ms is None else builtin_ms
                best = confirm(bench, which, kernel, cur, min(t, key=lambda r: r[1])[0], chosen, log)
                chosen[kernel] = best
            with override(chosen):
                ms = bench.time_ms(which)
                err = _rel(bench.outputs(which), bench.ref[which])
            rec.update(config=chosen[kernel], ms=ms, builtin_ms=builtin_ms, speedup=builtin_ms / ms, rel_err=err,
                       compiled=compiled, compile_rejected=rejected, timed=timed)
            log(f"pacs_loss.{kernel}: policy {_short(chosen[kernel])} {ms * 1e3:.1f} us (built-in "
                f"{builtin_ms * 1e3:.1f} us, {which} summed over the shapes)")
        rec["configs"] = configs(kernel, dict(chosen, **{kernel: rec["config"]}), dt, arch, sm)
        results[tuning.entry_key("pacs_loss", kernel, width)] = rec
    return results


def check_read_back(path, arch, results):
    """``launch_policy`` and ``launch_config`` (no POLICY override) now give what they gave with the
    table's policies (of every PACS kernel in it: pass B's tiles follow pass A's) set as the override."""
    with open(path) as f:
        table = json.load(f)["kernels"]
    saved = tuning.TUNED_DIR
    try:
        for key, rec in results.items():
            _, kernel, width = key.split(".")
            dt = "fp32" if width == "32" else "bf16"
            pols = {k: table[tuning.entry_key("pacs_loss", k, width)]["config"] for k in KPL.KERNELS
                    if tuning.entry_key("pacs_loss", k, width) in table}
            tuning.TUNED_DIR = os.devnull
            want = configs(kernel, pols, dt, arch, None)
            tuning.TUNED_DIR = os.path.dirname(path)
            with override(None):
                got_policy = KPL.launch_policy(kernel, DTYPES[dt], arch)
                got = [KPL.launch_config(kernel, B=b, T=t, G=G, dtype=DTYPES[dt], arch=arch) for b, t in SHAPES]
            if got_policy != rec["config"] or got != want:
                raise SystemExit(f"{key}: launch_policy gives {got_policy} ({got}), the table holds {rec['config']}")
    finally:
        tuning.TUNED_DIR = saved
