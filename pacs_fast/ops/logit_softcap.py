"""The torch path of ``linear_logprobs(..., softcap=c)``: logits soft-capped before the temperature,

    z = hidden @ weight.T + bias,  x = c * tanh(z / c) / T,  logp[i] = x[i, y_i] - logsumexp_j x[i, j]

(Gemma 2's ``final_logit_softcapping``, as transformers computes it: ``logits = c * tanh(logits / c)``).
The tiles are those of the uncapped torch path (pacs_fast/ops/linear_logprobs.py) with the hidden rows *not*
scaled by 1/T (the cap comes between the GEMM and the temperature): the forward maps each GEMM tile ``z`` to
``x`` in place; the backward recomputes ``z``, keeps ``u = z / c`` in a third scratch tile (so its
scratch is 1.5x the uncapped backward's two tiles) and turns the softmax gradient ``dL/dx`` into
``dL/dz = dL/dx * (1 - tanh(u)^2) / T`` before the same GEMMs (``dh += dz @ W_v``, ``dW_v += dz.T @ h``,
``db_v += sum_n dz``). ``1 - tanh(u)^2`` is computed as ``cosh(u)^-2``: the same value, without the
cancellation of ``1 - t^2`` where tanh saturates (``t`` within ulp(1) of +-1 made ``1 - t^2`` 0 or wrong by ~1e-7
absolute, a large relative error for ``|z| >~ 3c``; cosh overflows to inf past ``|u| ~ 89``, giving the exact 0
of fp32). All in the compute dtype (fp32; float64 for float64 inputs). The Triton twin: kernels/linear_logprobs_tiles.py
(``_softcap``, ``_capped_dlogits``).
"""
from __future__ import annotations

import math
import numbers

import torch

from . import chunked


def check_softcap(softcap, fn: str) -> float:
    """``softcap`` as a float: 0.0 for None / 0 (no cap), else a finite positive number; a ValueError naming it
    otherwise (a bool, a negative, NaN or infinite value, a non-number)."""
    if softcap is None:
        return 0.0
    real = not isinstance(softcap, bool) and isinstance(softcap, numbers.Real)
    if not real or not math.isfinite(float(softcap)) or float(softcap) < 0:
        raise ValueError(f"{fn}: softcap must be None / 0 (no soft-capping) or a finite positive number "
                         f"(Gemma 2's final_logit_softcapping), got {softcap!r}")
    return float(softcap)


def cap_(z: torch.Tensor, cap: float, inv_t: float) -> torch.Tensor:
    """``z <- cap * tanh(z / cap) * inv_t`` in place (``z`` fp32/float64); returns ``z``."""
    return z.div_(cap).tanh_().mul_(cap * inv_t)


def capped_fill(gemm, inv_t: float, cap: float, m=None, u_tile=None):
    """Tile producer: ``out = x = cap * tanh(z / cap) / T`` for the tile ``z = h[n] @ W[v].T + b[v]`` that
    ``gemm(n0, n1, v0, v1, out)`` writes (the uncapped torch path's producer at ``1 / T = 1``: rows *not* scaled),
    minus ``m[n]`` when given (the backward's ``x - m``). With ``u_tile`` (``(n, v) -> [n, v]`` scratch view),
    ``u = z / cap`` is also written there."""
    def fill(n0, n1, v0, v1, out):
        gemm(n0, n1, v0, v1, out)
        if u_tile is None:
            cap_(out, cap, inv_t)
        else:
            u = torch.div(out, cap, out=u_tile(n1 - n0, v1 - v0))
            torch.tanh(u, out=out).mul_(cap * inv_t)
        if m is not None:
            out.sub_(m[n0:n1].unsqueeze(1))
        return out
    return fill


def capped_backward(h, weight, bias, labels, v_off: int, inv_t: float, cap: float, z_t, m, log_s, ent, gl, gh,
                    need_w: bool, need_b: bool, chunk_bytes, clamp: bool, gemm):
    """``(dh [N, H], dW [V, H] or None, db [V] or None)`` in the compute dtype; ``gemm``: the producer of the
    uncapped tiles ``z`` (as :func:`capped_fill` takes it).

    ``h``: the kept rows (others zeroed), fp32, not scaled; ``z_t`` ``[N]``: the uncapped target logit
    ``h . W[y] + b[y]`` (any value where this shard does not own ``y``); ``m`` / ``log_s`` / ``ent``: the
    forward's per-row max, log sum-exp and entropy of ``x``; ``gl`` / ``gh``: upstream gradients of logp /
    entropy (0 for rows that do not count; ``gh`` None without an entropy gradient)."""
    n, n_h = h.shape
    v_local, cd, dev = weight.shape[0], m.dtype, h.device
    local = labels - v_off
    owned = (local >= 0) & (local < v_local)
    safe = torch.where(owned, local, torch.zeros_like(local))
    dh = torch.zeros(n, n_h, dtype=cd, device=dev)
    dw = torch.zeros(v_local, n_h, dtype=cd, device=dev) if need_w else None
    db = torch.zeros(v_local, dtype=cd, device=dev) if need_b else None
    if not (n and v_local):
        return dh, dw, db
    # coefficients scaled by 1/T: the tiles' dx is dL/dx / T, so dz = dx * (1 - tanh(u)^2) = dx / cosh(u)^2
    coef_x, coef_c = chunked.fold_two_part_lse(gl, gh, ent, log_s, scale=inv_t)
    tile = chunked.plan_chunks(n, v_local, chunk_bytes, prefer_rows=True)
    u_buf = torch.empty(tile[0] * tile[1], dtype=cd, device=dev)

    def u_tile(rows, cols):
        return u_buf[: rows * cols].view(rows, cols)

    fill_rel = capped_fill(gemm, inv_t, cap, m, u_tile)
    w_rows = chunked.row_cache(weight, cd)

    def consume(n0, n1, v0, v1, dx):
        dz = u_tile(n1 - n0, v1 - v0).cosh_().pow_(-2).mul_(dx)  # u = z / cap of this tile, from its fill
        dh[n0:n1].addmm_(dz, w_rows(v0, v1))
        if dw is not None:
            dw[v0:v1].addmm_(dz.t(), h[n0:n1])
        if db is not None:
            db[v0:v1] += dz.sum(0)

    chunked.backward_tiles(n, v_local, tile, fill_rel, coef_x, coef_c, consume, dev, v_outer=True, clamp=clamp)
    # one-hot term: dz[i, y_i] += gl_i / T / cosh(z_t / cap)^2 (on the rank that owns y_i)
    g_t = torch.where(owned, gl * inv_t * torch.cosh(z_t.to(cd) / cap).pow(-2), torch.zeros_like(gl))
    dh.addcmul_(weight.index_select(0, safe).to(cd), g_t.unsqueeze(1))
    if dw is not None:
        dw.index_add_(0, safe, h * g_t.unsqueeze(1))
    if db is not None:
        db.index_add_(0, safe, g_t)
    return dh, dw, db
