"""Per-hidden-size entries of bench/gpu/tune.py (``--also-h 896,...``): the main sweep's finalists timed
again at other hidden sizes.

The tuner sweeps at one shape (N=8192, H=4096, V=151,936). A launch that wins there need not win at
every hidden size: a tile's K loop is H / BLOCK_H steps, so at H=896 (Qwen2.5-0.5B) it is 4.6x shorter
and the softmax epilogue, the pipeline's fill and drain and the last wave weigh more (the H200 ran the
tiled forward at 1.64x its GEMM at H=896 against 1.35x at H=4096, with the launch chosen at H=4096).
So for each extra hidden size ``h`` and each log-prob kernel swept, the finalists (the ``FINALISTS``
fastest distinct configurations of the main sweep, the built-in one, and the built-in ping-pong launch
when it was swept), then the main sweep's other configurations, fastest first, until the budget ends
(a launch that lost at H=4096, e.g. smaller tiles with two programs resident per SM, may win at
H=896), are timed again at N x h x V. No compile: H is a runtime argument of every kernel
(both sizes are multiples of 16, Triton's only specialisation of it), so they are the kernels already
compiled. Each is checked against the default path's output at that shape, as in the main sweep, and
the fastest becomes ``by_h[h]`` of the kernel's entry; then the kinds doing the same job are timed in
alternation at ``h`` with their ``h`` winners (bench/gpu/tune.py ``choose``) for ``by_h[h]`` of the
choice entry. kernels/tuning.py gives a launch the measurement at the hidden size nearest its own
(ratio distance: H=1536 takes H=896's, H=2048 H=4096's).

A dry run times nothing and writes the built-in configuration and the default kind as the ``h``
entries (plumbing only; they differ from the dry run's main "winners", so a read-back can tell them apart).
"""
from __future__ import annotations

import math
import time

FINALISTS = 4


def finalists(timed, base, pingpong_base=None, k=FINALISTS):
    """The order in which the main sweep's configurations are timed again at another shape, from its
    ``timed`` ``[(cfg, ms, err)]``: the ``k`` fastest distinct ones that matched the reference (finite
    ms), the built-in ``base`` (always: every record's comparison), ``pingpong_base`` if it was timed and
    matched, then every other configuration that matched, fastest first (the budget may end the list:
    all of them ran in the main sweep, so none compiles again)."""
    ok = sorted((r for r in timed if math.isfinite(r[1])), key=lambda r: r[1])
    ranked = []
    for cfg, _, _ in ok:
        if cfg not in ranked:
            ranked.append(cfg)
    head = ranked[:k] + [base] + ([pingpong_base] if pingpong_base in ranked else [])
    out = []
    for cfg in head + ranked[k:]:
        if cfg not in out:
            out.append(cfg)
    return out


def tune_at(g, h, names, timed_by, results, *, n, v, dt, width, iters, tol, budget_s, dry_run, log):
    """Times ``names`` (log-prob kernels swept at the main shape; ``timed_by[name]`` their timings,
    ``results`` the table entries being written, keyed ``<name>.<width>``) at hidden size ``h`` and
    adds ``by_h[str(h)]`` to their entries and to the choice entries ``results`` holds. ``g``: the
    bench/gpu/tune.py module (its runners, timer, override and ``choose``). Returns the records added."""
    shape = f"N{n} H{h} V{v}"
    end = time.time() + budget_s
    runners = None if dry_run else g.make_runners(n, h, v, g.DTYPES[dt], "cuda")
    at_h, added = {}, {}
    for i, name in enumerate(names):
        deadline = time.time() + max(0.0, end - time.time()) / (len(names) - i)  # an equal share of what is left
        rec = results[f"{name}.{width}"]
        base = rec["builtin"]
        pp = dict(base, **g.PINGPONG_CONFIGS[name.split(".")[1]]) \
            if any(c.get("PINGPONG") for c, _, _ in timed_by.get(name, ())) else None
        cands = finalists(timed_by.get(name, []), base, pp)
        if dry_run:
            sub = dict(config=base, ms=None, builtin_ms=None, h=h, shape=shape, timed=0, candidates=len(cands))
        else:
            ref = runners[name][0]()
            head = FINALISTS + 2  # the finalists, the built-in and ping-pong launches: always; the rest while time is left
            timed = g.sweep_head_first(name, runners[name], cands, head, ref, deadline, iters, tol, log)
            cfg, ms, err = min(timed, key=lambda r: r[1]) if timed else (None, math.inf, None)
            if not math.isfinite(ms):  # none launched, or none matched the reference here: the main entry serves
                log(f"{name} at H={h}: no finalist ran and matched; no entry")
                continue
            base_ms = next((t for c, t, _ in timed if c == base), None)
            sub = dict(config=cfg, ms=ms, builtin_ms=base_ms, rel_err=err, h=h, shape=shape, timed=len(timed),
                       candidates=len(cands), main_config_ms=next((t for c, t, _ in timed if c == rec["config"]),
                                                                  None))
            log(f"{name} at H={h}: {g._short(cfg)} {ms:.3f} ms (built-in {base_ms} ms, {len(timed)} timed)")
        rec.setdefault("by_h", {})[str(h)] = sub
        at_h[f"{name}.{width}"] = sub
        added[f"{name}.{width}"] = sub
    for job, kinds in g.CHOICES.items():
        key = f"linear_logprobs.{job}.{width}"
        if key not in results:
            continue
        if dry_run:  # plumbing: the default kind, so that it differs from the main dry-run choice
            sub = dict(choice="tiles" if job == "forward" else "pointer", ms=None, rounds=0, h=h, shape=shape,
                       configs={kinds[nm]: at_h[f"{nm}.{width}"]["config"] for nm in kinds if f"{nm}.{width}" in at_h})
        else:
            sub = g.choose(job, kinds, at_h, runners, width, iters, dict(n=n, h=h, v=v, dt=dt), False, log)
            if sub is None:
                continue
            sub["h"] = h
        results[key].setdefault("by_h", {})[str(h)] = sub
        added[key] = sub
    return added
