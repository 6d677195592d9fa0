"""Device-time shares of one learner update for bench/gpu/learner.py (torch.profiler): attention, LM head + loss,
optimiser and the rest, each kernel by the op that launched it (or its own name), and the longest kernels."""
from __future__ import annotations

import torch

ATTENTION = ("flash", "fmha", "attention", "attn", "varlen", "sdpa", "scaled_dot_product")
LOGPROB = ("linearlogprobs", "linear_logprobs", "bench.lm_head_loss", "dlogits", "_stats_", "_finish_kernel",
           "_grad_bwd", "_pacs_", "fusedpacsloss")
OPTIMIZER = ("optimizer.step", "optimizer.zero_grad", "adamw", "clip_grad")


def profile_shares(step) -> dict | None:
    """Device-time shares of one ``step()``: attention, lm_head+loss, optimizer, other (torch.profiler;
    each kernel by the op that launched it and its parents, else by its name)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        events = prof.events()
    except Exception as e:  # noqa: BLE001 - the timings stand without it
        print(f"profiler failed: {type(e).__name__}: {e}", flush=True)
        return None
    return shares_of(events, DeviceType.CPU, DeviceType.CUDA)


def shares_of(events, cpu, cuda) -> dict:
    """:func:`profile_shares` of a profiler's ``events`` (``cpu`` / ``cuda``: its device types): the four
    shares, ``device_s`` (all kernels' time) and ``top_kernels`` (the 12 longest by name, seconds)."""
    def kind(name):
        n = name.lower()
        for cat, keys in (("optimizer", OPTIMIZER), ("lm_head+loss", LOGPROB), ("attention", ATTENTION)):
            if any(k in n for k in keys):
                return cat
        return None

    sums = dict.fromkeys(("attention", "lm_head+loss", "optimizer", "other"), 0.0)
    claimed: dict[str, float] = {}  # device time of the kernels an op launched, by kernel name
    for e in events:
        if e.device_type != cpu or not getattr(e, "kernels", None):
            continue
        cat, p = None, e
        while p is not None and cat is None:
            cat, p = kind(p.name), p.cpu_parent
        for k in e.kernels:
            sums[cat or kind(k.name) or "other"] += k.duration
            claimed[k.name] = claimed.get(k.name, 0.0) + k.duration
    # every kernel's time by name: the total (against the step's wall time: how busy the host keeps the GPU) and
    # the kernels that take most of it (what a share does not say: the first H200 run found packed varlen rows
    # 7-37% slower than padded SDPA at equal lengths)
    per_kernel: dict[str, float] = {}
    for e in events:
        if e.device_type == cuda and not e.name.startswith("Activity Buffer"):
            per_kernel[e.name] = per_kernel.get(e.name, 0.0) + e.time_range.elapsed_us()
    total = sum(per_kernel.values())
    # kernels no op claimed (launched through the driver API, e.g. cuDNN's attention graphs) go by their own name: the
    # first H200 run counted them as "other", which put padded SDPA's attention at 32k at an impossible ~950 TFLOP/s
    for name, us in per_kernel.items():
        sums[kind(name) or "other"] += max(us - claimed.get(name, 0.0), 0.0)
    out = {k: v / max(sum(sums.values()), 1e-9) for k, v in sums.items()}
    out["device_s"] = total / 1e6
    out["top_kernels"] = [[name[:120], round(us / 1e6, 5)] for name, us in
                          sorted(per_kernel.items(), key=lambda kv: -kv[1])[:12]]
    return out
