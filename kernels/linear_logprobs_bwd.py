"""The chunked GEMM backward of ``linear_logprobs`` (the default backward on GPU): per vocabulary chunk
a Triton kernel recomputes the logits tiles and writes ``dz`` (the input dtype) into one buffer, then
two cuBLAS GEMMs take it: ``dhidden += dz @ W[chunk]`` (fp32 accumulator) and ``dW[chunk] = dz.T @
hidden`` (written once when the chunk holds every row). The kernels and their launch helpers are
kernels/linear_logprobs.py's (``_dlogits_kernel``) or, by ``dz_kind``, the TMA / Gluon ones; they are
looked up on that module at call time, so its ``CONFIG`` and the tests' replacements apply.

Shapes as in kernels/linear_logprobs.py: hidden ``[N, H]``, weight ``[V, H]``, per-row fp32 ``[N]``.
"""
from __future__ import annotations

import functools

import torch
import triton

from . import LAUNCH_OPTIONS, dispatch, linear_logprobs as KL, tuning

DZ_FAMILY = {"gluon": "gluon", "tma": "tma", "pointer": "tiles"}  # dz_kind -> kernels/dispatch.py family
DZ_KERNEL = {"gluon": "dlogits_gluon", "tma": "dlogits_tma"}  # family -> its dz launcher (and launch_config)


def plan_bwd_chunks(n: int, v: int, itemsize: int, budget: int) -> tuple[int, int]:
    """``(rows, vocab)`` of the chunked backward's ``dz`` buffer (``itemsize`` bytes each) within
    ``budget`` bytes: every row when at least 1024 vocab columns fit (then each ``dW`` chunk is
    one GEMM written once), else 1024 columns and as many rows as fit; vocab chunks are multiples
    of 128 (whole tiles)."""
    if budget <= 0:
        raise ValueError(f"the backward chunk budget must be positive, got {budget}")
    n, v = max(n, 1), max(v, 1)
    cols = budget // (itemsize * n)
    if cols >= min(v, 1024):
        return n, min(v, max(128, cols // 128 * 128))
    v_c = min(v, 1024)
    return max(1, min(n, budget // (itemsize * v_c))), v_c


@functools.lru_cache(maxsize=None)
def fp32_out_gemm(device) -> bool:
    """Whether cuBLAS on ``device`` writes, and accumulates into, an fp32 matrix from bf16 inputs
    (``torch.mm`` / ``torch.addmm`` with ``out_dtype=torch.float32``; accumulating into an fp32
    ``self`` came with a later torch than ``mm``'s): tried once per device on a small product and
    checked against fp32 arithmetic. False off-GPU (the CPU has neither overload)."""
    try:
        g = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(64, 40, device=device, generator=g).to(torch.bfloat16)
        b = torch.randn(40, 48, device=device, generator=g).to(torch.bfloat16)
        c = torch.randn(64, 48, device=device, generator=g)
        ref = a.float() @ b.float()
        acc = c + ref
        torch.addmm(c, a, b, out_dtype=torch.float32, out=c)
        d = torch.empty(64, 48, device=device)
        torch.mm(a, b, out_dtype=torch.float32, out=d)
        return bool(torch.allclose(c, acc, rtol=1e-5, atol=1e-4) and torch.allclose(d, ref, rtol=1e-5, atol=1e-4))
    except (RuntimeError, TypeError, NotImplementedError):
        return False


def _gemm_f32_(out, a, b, accumulate: bool):
    """``out = a @ b`` (or ``out += a @ b``) into the fp32 ``out`` with fp32 accumulation. bf16 / fp16
    inputs on a GPU whose torch supports it (``fp32_out_gemm``): cuBLAS writes (beta = 0) or
    accumulates (beta = 1) fp32 directly, with no fp32 temporary of the product; else the product
    is formed in fp32 first (same values: fp32 products of exact bf16 values, fp32 sums): on a GPU
    by ``torch.mm(..., out_dtype=torch.float32)``, on the CPU from fp32 copies of the inputs."""
    if a.dtype != torch.float32 and a.is_cuda:
        if fp32_out_gemm(a.device):
            if accumulate:
                return torch.addmm(out, a, b, out_dtype=torch.float32, out=out)
            return torch.mm(a, b, out_dtype=torch.float32, out=out)
        prod = torch.mm(a, b, out_dtype=torch.float32)  # an fp32 product, no fp32 copy of the inputs
        return out.add_(prod) if accumulate else out.copy_(prod)
    if a.dtype != torch.float32:  # CPU (tests): the same values from fp32 copies
        a, b = a.float(), b.float()
    return out.addmm_(a, b) if accumulate else torch.mm(a, b, out=out)


def grad_bwd_chunked(hidden, weight, bias, inv_t, labels, v_offset, m, log_s, ent, gl, gh,
                     need_weight_grad=True, need_bias_grad=True, chunk_bytes=None, softcap: float = 0.0):
    """Chunked GEMM backward (the contract of kernels/linear_logprobs.py's ``grad_bwd``, but ``dweight``
    comes back in the weight's dtype when one row chunk holds every row). ``chunk_bytes``: the ``dz`` budget
    (None: ``CONFIG["BWD_CHUNK_BYTES"]``) or an explicit ``(rows, vocab)`` chunk shape. Per vocab chunk
    ``[v0, v1)`` (and row chunk):
    ``_dlogits_kernel`` writes ``dz`` (input dtype) into the chunk buffer, then
    ``dh[rows] += dz @ W[v0:v1]`` (fp32) and ``dW[v0:v1] (+)= dz.T @ hidden[rows]``. ``softcap`` > 0: the
    logits soft-capped (``dz`` through the cap's slope), by the pointer kernel (the TMA / Gluon ones have no cap)."""
    n, n_h = hidden.shape
    v = weight.shape[0]
    dev = hidden.device
    if isinstance(chunk_bytes, (tuple, list)):  # an explicit (rows, vocab) chunk (tests)
        n_c, v_c = (max(1, int(c)) for c in chunk_bytes)
    else:
        budget = (tuning.override("BWD_CHUNK_BYTES", KL.CONFIG["BWD_CHUNK_BYTES"]) if chunk_bytes is None
                  else int(chunk_bytes))
        n_c, v_c = plan_bwd_chunks(n, v, hidden.element_size(), budget)
    one_pass_dw = n_c >= n
    # the first vocab chunk writes each row of dh, the first row chunk each row of dW (no zero fill)
    alloc = torch.empty if (n > 0 and v > 0) else torch.zeros
    dh = alloc(n, n_h, dtype=torch.float32, device=dev)
    dw = None
    if need_weight_grad:
        dw = alloc(v, n_h, dtype=weight.dtype if one_pass_dw else torch.float32, device=dev)
    db = torch.zeros(v, dtype=torch.float32, device=dev) if bias is not None and need_bias_grad else None
    if n == 0 or v == 0:
        return dh, dw, db
    cfg = KL._cfg("dlogits", hidden, weight, softcap)
    bn, bv = cfg["BLOCK_N"], cfg["BLOCK_V"]
    entropy = gh is not None
    kind = KL.dz_kind(KL.device_arch(dev), KL._width(hidden.dtype), hidden.shape[1])
    # the TMA or Gluon dz kernel where it takes these inputs and is usable here (kernels/dispatch.py), and
    # which chunks' dz it can write (the Gluon one's TMA store needs 16-byte rows); the pointer kernel for
    # everything else, and for the chunk (and the rest) when it fails (Gluon -> TMA -> pointer, one warning)
    family, mod = dispatch.choose("tiles" if softcap else DZ_FAMILY[kind], DZ_KERNEL, hidden, weight)
    buf = torch.empty(n_c * v_c, dtype=hidden.dtype, device=dev)
    for n0 in range(0, n, n_c):
        n1 = min(n, n0 + n_c)
        h_c = hidden[n0:n1]
        for v0 in range(0, v, v_c):
            v1 = min(v, v0 + v_c)
            dz = buf[: (n1 - n0) * (v1 - v0)].view(n1 - n0, v1 - v0)
            done = False
            while family != "tiles" and (family != "gluon" or mod.dz_usable(dz)):
                try:
                    getattr(mod, DZ_KERNEL[family])(
                        h_c, weight[v0:v1], bias[v0:] if bias is not None else None, inv_t, labels[n0:],
                        v_offset + v0, m[n0:], log_s[n0:], ent[n0:] if entropy else None, gl[n0:],
                        gh[n0:] if entropy else None, dz, entropy)
                    done = True
                    break
                except Exception as e:  # compile or launch error: this chunk (and the rest) by the next family
                    family, mod = dispatch.choose(dispatch.failed(family, DZ_KERNEL[family], e), DZ_KERNEL,
                                                  hidden, weight)
            if not done:
                grid = (triton.cdiv(n1 - n0, bn) * triton.cdiv(v1 - v0, bv),)
                KL._dlogits_kernel[grid](
                    h_c, hidden.stride(0), weight[v0:], weight.stride(0),
                    bias[v0:] if bias is not None else hidden, n1 - n0, v1 - v0, n_h, inv_t,
                    labels[n0:], v_offset + v0, m[n0:], log_s[n0:], (ent if entropy else m)[n0:], gl[n0:],
                    (gh if entropy else gl)[n0:], dz, dz.stride(0),
                    HAS_BIAS=bias is not None, ENTROPY=entropy, DOT_PREC=KL._prec(hidden), UPCAST=KL._upcast(hidden),
                    BLOCK_N=bn, BLOCK_V=bv, BLOCK_H=cfg["BLOCK_H"], GROUP_N=cfg["GROUP_N"],
                    SOFTCAP=float(softcap), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                    **LAUNCH_OPTIONS)
            _gemm_f32_(dh[n0:n1], dz, weight[v0:v1], accumulate=v0 > 0)  # the first vocab chunk writes
            if dw is not None:
                if one_pass_dw:  # every row in this chunk: dW[v0:v1] final, written once
                    torch.mm(dz.t(), h_c, out=dw[v0:v1])
                else:
                    _gemm_f32_(dw[v0:v1], dz.t(), h_c, accumulate=n0 > 0)
            if db is not None:
                db[v0:v1] += dz.sum(0, dtype=torch.float32)
    return dh, dw, db
