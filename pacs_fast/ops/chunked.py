"""The chunked pure-PyTorch engine behind ``backend="torch"`` (fp32 compute, any device).

Both ops see the logits as tiles ``[n, v]`` (rows ``n0:n1``, vocab columns ``v0:v1``) produced on
demand by a ``fill(n0, n1, v0, v1, out)`` callback: a slice of the given logits, or a GEMM
``hidden @ weight.T`` for the linear op. Only two tile buffers of at most ``chunk_bytes`` in
total exist at a time, so the workspace is O(chunk_bytes + N), never O(N * V).

Forward (one pass over V per row block): per tile ``m = max x``, ``e = exp(x - m)``,
``s = sum e``, ``a = sum e (x - m)``; tiles merge exactly (``vocab_parallel.merge``).

Backward (recomputes each tile): with ``lse`` and entropy ``H`` of the row, ``p = exp(x - lse)``,
upstream grads ``gl`` (of logp) and ``gh`` (of entropy), and ``S = sum p x = lse - H``:

    d logp / d x_j = onehot_j - p_j
    d H    / d x_j = -p_j (x_j - S) = -p_j ((x_j - lse) + H)
    dx_j = gl onehot_j - p_j (gh (x_j - lse) + gl + gh H)

and ``d/d(raw logits) = dx / temperature``. The one-hot term is added by the caller (a scatter
for the token op, an ``index_add`` on dW / dh for the linear op). Tile element ops are in place.

Under ``torch.compile`` the ops call these loops through ``torch.library`` custom ops (defined beside
each op), which dynamo keeps opaque: traced, a loop over ``ceil(N / rows per tile)`` tiles pins the
token count ``N`` and every new count compiles again.
"""
from __future__ import annotations

import math
import numbers

import torch

from .vocab_parallel import NEG_INF, merge

DEFAULT_CHUNK_BYTES = 64 << 20
# x - m (or x - lse) is clamped from below so that -inf logits give p = 0 and p * (x - m) = 0
# instead of 0 * inf = NaN; exp(-1e4) is exactly 0 in fp32, so nothing else changes.
_CLAMP_LO = -1e4


def plan_chunks(n_rows: int, n_cols: int, chunk_bytes, prefer_rows: bool = False,
                n_buffers: int = 2) -> tuple[int, int]:
    """Tile shape ``(n, v)`` so that ``n_buffers`` fp32 tiles fit in ``chunk_bytes``.

    ``chunk_bytes``: an int budget (None: 64 MiB), or an explicit ``(rows, cols)`` tile shape.
    Default (logits given): whole rows when at least 8 fit, else vocab chunks.
    ``prefer_rows`` (tiles made by a GEMM): up to 2048 rows and >= 1024 vocab columns per tile,
    so that each tile is one efficient GEMM ``[n, H] @ [H, v]``.
    """
    n_rows, n_cols = max(n_rows, 1), max(n_cols, 1)
    if isinstance(chunk_bytes, (tuple, list)):
        n, v = (int(c) for c in chunk_bytes)
        if n <= 0 or v <= 0:
            raise ValueError(f"chunk_bytes as a tile shape must be positive, got {chunk_bytes}")
        return min(n, n_rows), min(v, n_cols)
    budget = DEFAULT_CHUNK_BYTES if chunk_bytes is None else int(chunk_bytes)
    if budget <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    elems = max(1, budget // (4 * n_buffers))
    if prefer_rows:
        n = max(1, min(n_rows, 2048, elems // min(1024, n_cols)))
        return n, max(1, min(n_cols, elems // n))
    if elems // n_cols >= min(8, n_rows):
        return min(n_rows, elems // n_cols), n_cols
    v = min(n_cols, max(16, elems // 8))
    return max(1, min(n_rows, elems // v)), v


class TileBuffers:
    """Two reusable fp32 scratch buffers, viewed as contiguous ``[n, v]`` tiles."""

    def __init__(self, n: int, v: int, device, dtype=torch.float32):
        self.a = torch.empty(n * v, dtype=dtype, device=device)
        self.b = torch.empty(n * v, dtype=dtype, device=device)

    def tiles(self, n: int, v: int):
        return self.a[: n * v].view(n, v), self.b[: n * v].view(n, v)


def tile_stats(x: torch.Tensor, xb: torch.Tensor, eb: torch.Tensor, entropy: bool,
               clamp: bool = True):
    """Partial ``(m, s, a)`` of a tile. ``x`` may be a read-only view (any float dtype) or ``xb``
    itself; ``xb``/``eb`` are fp32 scratch tiles of the same shape (overwritten). ``clamp=False``
    is allowed when the tile cannot hold -inf (then -inf would give a NaN entropy)."""
    m = x.amax(1).to(xb.dtype)
    ref = torch.where(m == NEG_INF, torch.zeros_like(m), m)
    torch.sub(x, ref.unsqueeze(1), out=xb)
    if not entropy:
        return m, xb.exp_().sum(1), None
    if clamp:
        xb.clamp_(min=_CLAMP_LO)
    torch.exp(xb, out=eb)
    s = eb.sum(1)
    return m, s, xb.mul_(eb).sum(1)  # in place: no [n, v] temporary


def forward_stats(n_rows, n_cols, tile, fill, entropy: bool, device, v_outer: bool = False,
                  clamp: bool = True, dtype=torch.float32):
    """Loops over tiles; returns merged per-row ``(m, s, a)`` fp32 ``[n_rows]`` (a None without
    entropy). ``fill(n0, n1, v0, v1, out) -> x`` returns the tile's scaled logits (``out`` or a view)."""
    nc, vc = tile
    bufs = TileBuffers(nc, vc, device, dtype)
    m = torch.full((n_rows,), NEG_INF, dtype=dtype, device=device)
    s = torch.zeros(n_rows, dtype=dtype, device=device)
    a = torch.zeros(n_rows, dtype=dtype, device=device) if entropy else None
    for n0, n1, v0, v1 in _tiles(n_rows, n_cols, nc, vc, v_outer):
        xb, eb = bufs.tiles(n1 - n0, v1 - v0)
        x = fill(n0, n1, v0, v1, xb)
        mt, st, at = tile_stats(x, xb, eb, entropy, clamp)
        if v0 == 0 and v1 == n_cols:  # whole rows: nothing to merge
            m[n0:n1], s[n0:n1] = mt, st
            if entropy:
                a[n0:n1] = at
            continue
        mm, ss, aa = merge(m[n0:n1], s[n0:n1], None if a is None else a[n0:n1], mt, st, at)
        m[n0:n1], s[n0:n1] = mm, ss
        if entropy:
            a[n0:n1] = aa
    return m, s, a


def tile_grad(xr, pb, coef_x, coef_c, clamp: bool = True):
    """Gradient tile (without the one-hot term) from ``xr = x - lse`` (fp32 scratch, overwritten);
    ``pb`` is a second scratch tile. ``dx = -p * (coef_x * xr + coef_c)``, ``p = exp(xr)``;
    ``coef_x`` = gh (None without an entropy gradient), ``coef_c`` = gl + gh H, both ``[n]`` and
    possibly pre-multiplied by 1/T. Returns the tile that holds ``dx`` (``xr`` or ``pb``)."""
    if coef_x is None:
        return xr.exp_().mul_(coef_c.neg().unsqueeze(1))
    if clamp:
        xr.clamp_(min=_CLAMP_LO)
    torch.exp(xr, out=pb)
    # xr <- -(coef_c + coef_x * xr) in one pass (elementwise, so out= may alias an input)
    torch.addcmul(coef_c.neg().unsqueeze(1), xr, coef_x.neg().unsqueeze(1), out=xr)
    return xr.mul_(pb)


def fold_two_part_lse(gl, gh, ent, log_s, scale=1.0):
    """Per-row ``(coef_x, coef_c)`` for ``tile_grad`` on tiles holding ``x - m`` (not ``x - lse``).

    With ``lse = m + log s`` kept in two parts, ``p = exp(x - m) / s`` and
    ``dx = -p (gh (x - lse) + gl + gh H) = -exp(x - m) (gh/s (x - m) + (gl + gh (H - log s))/s)``,
    so ``tile_grad`` is unchanged and no fp32 ``lse`` (rounded to ulp(m)) is ever formed.
    ``gh``/``ent`` None without an entropy gradient; both coefficients are multiplied by ``scale``
    (the 1/temperature of the raw logits). ``coef_x`` is None without an entropy gradient."""
    inv_s = torch.exp(-log_s)
    if gh is None:
        return None, gl * inv_s * scale
    return gh * inv_s * scale, (gl + gh * (ent - log_s)) * inv_s * scale


def backward_tiles(n_rows, n_cols, tile, fill_rel, coef_x, coef_c, consume, device,
                   v_outer: bool = False, out_tile=None, clamp: bool = True):
    """Recomputes every tile and hands ``consume(n0, n1, v0, v1, dx)`` the gradient tile.

    ``fill_rel(n0, n1, v0, v1, out)`` writes ``x - lse`` (fp32) into ``out`` and returns it.
    ``out_tile(n0, n1, v0, v1)`` may return an fp32 contiguous destination to use as that
    scratch tile (the gradient is then produced in place there, saving a copy)."""
    nc, vc = tile
    bufs = TileBuffers(nc, vc, device, coef_c.dtype)
    for n0, n1, v0, v1 in _tiles(n_rows, n_cols, nc, vc, v_outer):
        xb, pb = bufs.tiles(n1 - n0, v1 - v0)
        if out_tile is not None:
            dst = out_tile(n0, n1, v0, v1)
            if dst is not None:
                xb = dst
        xr = fill_rel(n0, n1, v0, v1, xb)
        cx = None if coef_x is None else coef_x[n0:n1]
        consume(n0, n1, v0, v1, tile_grad(xr, pb, cx, coef_c[n0:n1], clamp))


def row_cache(weight: torch.Tensor, dtype: torch.dtype):
    """``rows(v0, v1)``: ``weight[v0:v1]`` cast to ``dtype``, the last chunk kept (a vocabulary chunk's tiles
    follow one another with ``v_outer``: one cast per chunk, one chunk alive)."""
    cache = {}

    def rows(v0, v1):
        w = cache.get(v0)
        if w is None:
            cache.clear()
            w = cache[v0] = weight[v0:v1].to(dtype)
        return w
    return rows


def _spans(total, step):
    """``[(a, min(a + step, total)), ...]`` covering ``[0, total)``. One span without ``range`` when it
    fits: under ``torch.compile`` a ``range`` over the (symbolic) token count pins it, so every new
    count recompiled (the recompile limit then left the op eager)."""
    if total == 0:
        return []
    if step >= total:
        return [(0, total)]
    return [(a, min(a + step, total)) for a in range(0, total, step)]


def _tiles(n_rows, n_cols, nc, vc, v_outer):
    rows, cols = _spans(n_rows, nc), _spans(n_cols, vc)
    if v_outer:
        return [(n0, n1, v0, v1) for v0, v1 in cols for n0, n1 in rows]
    return [(n0, n1, v0, v1) for n0, n1 in rows for v0, v1 in cols]


def encode_chunk(chunk_bytes) -> list[int]:
    """``chunk_bytes`` (None, a byte budget or a ``(rows, cols)`` tile shape) as a list of ints, the form a
    ``torch.library`` custom op takes: ``[]``, ``[budget]`` or ``[rows, cols]``."""
    if chunk_bytes is None:
        return []
    if isinstance(chunk_bytes, (tuple, list)):
        return [int(c) for c in chunk_bytes]
    return [int(chunk_bytes)]


def decode_chunk(chunk: list[int]):
    """The inverse of ``encode_chunk``."""
    return None if not chunk else chunk[0] if len(chunk) == 1 else tuple(chunk)


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """fp32 for fp32/bf16/fp16 inputs; float64 inputs are computed (and returned) in float64."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def check_temperature(temperature, fn: str) -> float:
    real = not isinstance(temperature, bool) and isinstance(temperature, numbers.Real)
    if not real or not math.isfinite(float(temperature)) or float(temperature) <= 0:
        raise ValueError(f"{fn}: temperature must be a finite positive number, got {temperature!r}")
    return float(temperature)


def check_ignore_index(ignore_index, fn: str) -> int:
    """The label id that marks rows to skip, as an int (numpy integers too; never a bool or a float; within
    int64, the labels' dtype inside the ops)."""
    if (isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral)
            or not -2**63 <= int(ignore_index) < 2**63):
        raise ValueError(f"{fn}: ignore_index must be an integer label id within int64 (HF's -100), "
                         f"got {ignore_index!r}")
    return int(ignore_index)


def check_chunk_bytes(chunk_bytes, fn: str):
    """``chunk_bytes`` as the ops take it: None, a positive byte budget (an int, or a finite real number
    rounded down) or a ``(rows, cols)`` tile shape of positive ints; a ValueError naming it otherwise."""
    def count(x) -> bool:
        return not isinstance(x, bool) and isinstance(x, numbers.Real) and math.isfinite(x) and int(x) >= 1
    if chunk_bytes is None:
        return None
    if isinstance(chunk_bytes, (tuple, list)):
        if len(chunk_bytes) == 2 and all(count(c) and isinstance(c, numbers.Integral) for c in chunk_bytes):
            return tuple(int(c) for c in chunk_bytes)
    elif count(chunk_bytes):
        return int(chunk_bytes)
    raise ValueError(f"{fn}: chunk_bytes must be a positive byte budget (int) or a (rows, cols) tile shape of "
                     f"positive ints, got {chunk_bytes!r}")
