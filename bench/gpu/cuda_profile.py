"""Device time per call from the CUDA profiler, for the benchmarks (bench/bench_pacs_loss.py's device-time
columns, bench/gpu/logprobs.py's ``--profile`` breakdown)."""
from __future__ import annotations

import torch


def device_events(call, calls: int) -> list[tuple[str, float]] | None:
    """``(name, microseconds per call)`` of every GPU kernel, copy and memset that ``calls`` runs of
    ``call()`` launch, after one warm-up, read from the CUDA profiler (CUPTI): what the call costs the
    GPU without the host's launch latency. None without CUDA or when the profiler fails here."""
    if not torch.cuda.is_available():
        return None
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    call()
    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                call()
            torch.cuda.synchronize()
        return [(e.name, e.time_range.elapsed_us() / calls) for e in prof.events()
                if e.device_type == DeviceType.CUDA and not e.name.startswith("Activity Buffer")]
    except Exception as e:  # noqa: BLE001 - the wall-clock timings stand without it
        print(f"device_events: the CUDA profiler failed ({type(e).__name__}: {e})", flush=True)
        return None
