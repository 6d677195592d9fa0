"""Where a synchronised call of the fused PACS loss spends its wall time on a GPU (issue 39, item 3).

    python bench/gpu/pacs_loss_host_profile.py          # on a CUDA machine; prints, writes nothing

At B=1024, T=4096 and B=8192, T=1024 (fp32, groups of 8): the median wall time of one synchronised forward +
backward, the per-call time of 50 calls back to back (no sync between them: if it equals the synchronised one,
the host, not the GPU, sets the pace), a synchronised same-bytes copy for scale, then cProfile of 100 calls
(the host's functions by their own time). bench/bench_pacs_loss_host.py measures the same host path on any
machine, kernels stubbed.
"""
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import torch  # noqa: E402


def main() -> int:
    from pacs_fast.ops.pacs_loss import fused_pacs_loss

    if not torch.cuda.is_available():
        print("bench/gpu/pacs_loss_host_profile.py: no CUDA device", file=sys.stderr)
        return 2
    for B, T in ((1024, 4096), (8192, 1024)):
        g = torch.Generator(device="cuda").manual_seed(0)
        logp = (-torch.rand(B, T, device="cuda", generator=g)).requires_grad_()
        ref = -torch.rand(B, T, device="cuda", generator=g)
        mask = (torch.rand(B, T, device="cuda", generator=g) > 0.2).float()
        r = (torch.rand(B, device="cuda", generator=g) > 0.5).float()

        def call():
            loss = fused_pacs_loss(logp, ref, mask, r, group_size=8)
            loss = loss[0] if isinstance(loss, tuple) else loss
            loss.backward()
            logp.grad = None

        def synced(fn, n=50):
            out = []
            for _ in range(n):
                t = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                out.append(time.perf_counter() - t)
            return statistics.median(out)

        for _ in range(20):
            call()
        torch.cuda.synchronize()
        one = synced(call)
        back_to_back = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(50):
                call()
            torch.cuda.synchronize()
            back_to_back.append((time.perf_counter() - t) / 50)
        c = torch.empty_like(logp)
        copy = synced(lambda: c.copy_(logp))
        print(f"B={B} T={T}: synced call median {one * 1e3:.3f} ms, back-to-back {min(back_to_back) * 1e3:.3f} "
              f"ms/call, synced copy {copy * 1e3:.3f} ms")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(100):
            call()
        torch.cuda.synchronize()
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(22)
        print(text.getvalue()[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
