"""Warp-specialised Hopper forward of ``linear_logprobs`` in Gluon (``CONFIG["FWD"] = "gluon"``).

The same per-tile partials as kernels/linear_logprobs_fwd.py and kernels/linear_logprobs_tma.py
(``(m, s, a)`` per row and vocab block, ``[n_vblocks, N]`` fp32, merged by
kernels/linear_logprobs_finish.py), computed the way the Hopper GEMMs near cuBLAS are: a persistent
grid walks the grouped tile order, and inside each program the warps are split by role
(``gl.warp_specialize``):

- a 1-warp **loader** partition issues the TMA copies of the hidden tile ``[BLOCK_N, BLOCK_H]`` and
  the weight tile ``[BLOCK_V, BLOCK_H]`` into a ``STAGES``-deep shared-memory ring (``ready`` /
  ``empty`` mbarriers per slot), running ahead across tiles: while the consumers fold one tile's
  logits, the next tile's first slots are already loading;
- the default partition (``num_warps`` = 8: two warpgroups, 64 rows each) issues the wgmma of each
  slot (``is_async``; the previous slot is released once its wgmma has retired), then runs the
  epilogue on the fp32 accumulator in registers: bias, temperature, the vocabulary tail masked to
  ``-inf``, row max, sum of exponentials and the entropy term, stored as the tile's partial.
- ``PINGPONG=1`` (the launches of kernels/linear_logprobs_launch.py's ``PINGPONG_CONFIGS``): two
  consumer partitions of ``num_warps`` = 4 (one warpgroup each) take alternate tiles of the program,
  each with its own accumulator, and take turns on the tensor cores (``turn`` mbarriers): while one
  runs its tile's epilogue, the other's wgmma run, so the epilogue no longer idles the tensor cores
  (the schedule CUTLASS calls ping-pong). The loader and the ring are the same.

Why: Triton 3.6 / 3.9 do not warp-specialise the ``tl.range`` loops of the other two forwards on
sm_90 (the flag compiles to the same code), and on one H200 (2026-11-26) the pointer tile kernel ran
at 1.25-1.3x cuBLAS's GEMM of the same shape. Gluon exposes the roles, barriers and register split
directly; Triton's own Hopper tutorial kernel of this structure (a loader warp feeding 8 wgmma
warps) measured 0.96-1.05x cuBLAS at K >= 1024 (its numbers). Hopper only (wgmma), bf16 / fp16
with 16-byte aligned rows (``gluon_usable``); the interpreter cannot run Gluon, so off a Hopper GPU
the op keeps the tiled forward. Compiled for sm_90 in tests/test_kernels_compile.py; checked against
float64 on a Hopper GPU by tests/test_linear_logprobs_gluon.py (both launches) and timed by
``bench/gpu/logprobs.py`` (method ``pacs_triton_gluon``) beside the default, the ping-pong launch by the
tuner (``--pingpong``): none of it has run yet (no GPU since it was written).
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, \
    warpgroup_mma_init, warpgroup_mma_wait

from . import LAUNCH_OPTIONS
from .linear_logprobs_launch import _cfg, descriptor_inputs, device_arch, num_sms
from .linear_logprobs_tiles import _dlogits_tile, _store_partial, _tile_stats

# the TMA global -> shared copy: ``async_load`` in Triton 3.9, ``async_copy_global_to_shared`` in 3.6 (the
# GPU image's version); the same leading arguments (descriptor, coordinates, barrier, destination)
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

LOADER_REGS = 40  # registers per thread of the loader warp (its warpgroup gives the rest to the consumers)
CONSUMER_REGS = 232  # ping-pong: the second consumer warpgroup's (2 x 128 x 232 + 128 x 40 <= 64K registers)


@gluon.constexpr_function
def _mma_layout(block_n, block_v, num_warps):
    """The wgmma accumulator layout of a ``[block_n, block_v]`` tile over ``num_warps`` warps: warps
    stacked along the rows (16 rows each, so every row's reduction stays inside one warp), one
    instruction as wide as the tile allows (n <= 256, dividing ``block_v``)."""
    if block_n < 16 * num_warps:
        raise ValueError(f"BLOCK_N={block_n} needs >= 16 rows per warp for {num_warps} warps")
    n = min(256, block_v)
    while block_v % n:
        n -= 8
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16])


@gluon.jit
def _tile_coords(t, n_blocks_n, n_blocks_v, GROUP_N: gl.constexpr):
    """(row block, vocab block) of tile ``t`` in the grouped order of the other forwards
    (``_grouped_tile``): GROUP_N row blocks sweep the vocabulary together, sharing weight tiles in L2."""
    per_group = GROUP_N * n_blocks_v
    first_n = (t // per_group) * GROUP_N
    group_size = min(n_blocks_n - first_n, GROUP_N)
    return first_n + (t % per_group) % group_size, (t % per_group) // group_size


@gluon.jit
def _schedule(N, V, n_h, BLOCK_N: gl.constexpr, BLOCK_V: gl.constexpr, BLOCK_H: gl.constexpr):
    """Row blocks, vocab blocks and K steps: both partitions walk the same (tile, K step) sequence,
    tiles ``program_id, program_id + num_programs, ...`` of the grouped order."""
    return gl.cdiv(N, BLOCK_N), gl.cdiv(V, BLOCK_V), gl.cdiv(n_h, BLOCK_H)


@gluon.jit
def _loader(Hdesc, Wdesc, h_bufs, w_bufs, ready, empty, N, V, n_h, GROUP_N: gl.constexpr):
    BLOCK_N: gl.constexpr = Hdesc.block_type.shape[0]
    BLOCK_H: gl.constexpr = Hdesc.block_type.shape[1]
    BLOCK_V: gl.constexpr = Wdesc.block_type.shape[0]
    STAGES: gl.constexpr = h_bufs.type.shape[0]
    n_blocks_n, n_blocks_v, n_k = _schedule(N, V, n_h, BLOCK_N, BLOCK_V, BLOCK_H)
    i = 0  # slot uses so far: slot i % STAGES, round i // STAGES (the consumers count the same)
    for t in range(gl.program_id(0), n_blocks_n * n_blocks_v, gl.num_programs(0)):
        pid_n, pid_v = _tile_coords(t, n_blocks_n, n_blocks_v, GROUP_N)
        for k in range(n_k):
            slot = i % STAGES
            # a fresh mbarrier counts as having completed the phase before its first: round 0 passes
            mbarrier.wait(empty.index(slot), ((i // STAGES) & 1) ^ 1)
            bar = ready.index(slot)
            mbarrier.expect(bar, Hdesc.block_type.nbytes + Wdesc.block_type.nbytes)
            _tma_load(Hdesc, [pid_n * BLOCK_N, k * BLOCK_H], bar, h_bufs.index(slot))
            _tma_load(Wdesc, [pid_v * BLOCK_V, k * BLOCK_H], bar, w_bufs.index(slot))
            i += 1


@gluon.jit
def _tile_logits(h_bufs, w_bufs, ready, empty, turn, i, q, n_k, B, c0, V, HAS_BIAS: gl.constexpr,
                 acc_layout: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_V: gl.constexpr,
                 CONSUMER: gl.constexpr, CONSUMERS: gl.constexpr):
    """A consumer's side of one tile (its ``q``-th): the wgmma of its ``n_k`` slots from slot use ``i``
    on, then the unscaled logits ``y = h @ W.T + b`` [BLOCK_N, BLOCK_V] fp32 in registers, their vocab
    ids ``c0 + 0..BLOCK_V`` and the next slot use.

    Ping-pong (``CONSUMERS`` = 2): the two consumers' mainloops take turns (``turn[c]``: consumer ``c``
    may start). Besides keeping the tensor cores on one tile at a time, this is what makes the ``ready``
    waits sound: an mbarrier wait tells phases apart by parity only, so a consumer must not wait on a
    slot use while an earlier use of that slot is still loading; once the other consumer has waited
    on every slot of the tile before, every earlier use has landed. tests/test_gluon_protocol.py
    model-checks this protocol (the loader's and the consumers' barrier operations, in this order)."""
    STAGES: gl.constexpr = h_bufs.type.shape[0]
    if CONSUMERS > 1:
        # consumer 0's q-th tile follows consumer 1's (q-1)-th (q = 0: a fresh barrier passes parity 1);
        # consumer 1's q-th follows consumer 0's q-th
        mbarrier.wait(turn.index(CONSUMER), (q & 1) ^ (1 - CONSUMER))
    acc = warpgroup_mma_init(gl.zeros((BLOCK_N, BLOCK_V), gl.float32, acc_layout))
    for k in range(n_k):
        slot = i % STAGES
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        acc = warpgroup_mma(h_bufs.index(slot), w_bufs.index(slot).permute((1, 0)), acc, use_acc=k > 0,
                            is_async=True)
        # the previous slot's wgmma has retired once at most this one is in flight: free its slot
        warpgroup_mma_wait(1, (acc, ))
        mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1, pred=k > 0)
        i += 1
    if CONSUMERS > 1:  # every wgmma of this tile is issued: the other consumer's mainloop may start
        mbarrier.arrive(turn.index(1 - CONSUMER), count=1)
    x = warpgroup_mma_wait(0, (acc, ))
    mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1)
    cols = c0 + gl.arange(0, BLOCK_V, layout=gl.SliceLayout(0, acc_layout))
    if HAS_BIAS:
        x = x + gl.load(B + cols, mask=cols < V, other=0.0).to(gl.float32)[None, :]
    return x, cols, i


@gluon.jit
def _mma_stats(h_bufs, w_bufs, ready, empty, turn, B, N, V, n_h, inv_t, M_out, S_out, A_out,
               HAS_BIAS: gl.constexpr, ENTROPY: gl.constexpr, GROUP_N: gl.constexpr, BLOCK_N: gl.constexpr,
               BLOCK_V: gl.constexpr, BLOCK_H: gl.constexpr, num_warps: gl.constexpr,
               CONSUMER: gl.constexpr, CONSUMERS: gl.constexpr):
    acc_layout: gl.constexpr = _mma_layout(BLOCK_N, BLOCK_V, num_warps)
    n_blocks_n, n_blocks_v, n_k = _schedule(N, V, n_h, BLOCK_N, BLOCK_V, BLOCK_H)
    # this consumer's tiles: every CONSUMERS-th of the program's (the loader's order), from its CONSUMER-th
    i = CONSUMER * n_k
    q = 0
    for t in range(gl.program_id(0) + CONSUMER * gl.num_programs(0), n_blocks_n * n_blocks_v,
                   CONSUMERS * gl.num_programs(0)):
        pid_n, pid_v = _tile_coords(t, n_blocks_n, n_blocks_v, GROUP_N)
        y, cols, i = _tile_logits(h_bufs, w_bufs, ready, empty, turn, i, q, n_k, B, pid_v * BLOCK_V, V,
                                  HAS_BIAS, acc_layout, BLOCK_N, BLOCK_V, CONSUMER, CONSUMERS)
        i += (CONSUMERS - 1) * n_k  # the other consumer's tile
        q += 1
        # the tile's partial: kernels/linear_logprobs_tiles.py's epilogue, on the accumulator's layout
        m, s, a = _tile_stats(y, cols < V, inv_t, ENTROPY)
        rows = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_layout))
        _store_partial(M_out, S_out, A_out, pid_v.to(gl.int64) * N + rows, rows < N, m, s, a, ENTROPY)


@gluon.jit
def _mma_dlogits(h_bufs, w_bufs, ready, empty, turn, dz_smem, DZdesc, B, N, V, n_h, inv_t, LABELS, v_offset, M,
                 LOGS, ENT, GL, GH, HAS_BIAS: gl.constexpr, ENTROPY: gl.constexpr, GROUP_N: gl.constexpr,
                 BLOCK_N: gl.constexpr, BLOCK_V: gl.constexpr, BLOCK_H: gl.constexpr, num_warps: gl.constexpr,
                 CONSUMER: gl.constexpr, CONSUMERS: gl.constexpr):
    acc_layout: gl.constexpr = _mma_layout(BLOCK_N, BLOCK_V, num_warps)
    n_blocks_n, n_blocks_v, n_k = _schedule(N, V, n_h, BLOCK_N, BLOCK_V, BLOCK_H)
    i = CONSUMER * n_k  # as _mma_stats
    q = 0
    for t in range(gl.program_id(0) + CONSUMER * gl.num_programs(0), n_blocks_n * n_blocks_v,
                   CONSUMERS * gl.num_programs(0)):
        pid_n, pid_v = _tile_coords(t, n_blocks_n, n_blocks_v, GROUP_N)
        y, cols, i = _tile_logits(h_bufs, w_bufs, ready, empty, turn, i, q, n_k, B, pid_v * BLOCK_V, V,
                                  HAS_BIAS, acc_layout, BLOCK_N, BLOCK_V, CONSUMER, CONSUMERS)
        i += (CONSUMERS - 1) * n_k
        q += 1
        # dz = dx / T of the tile: kernels/linear_logprobs_tiles.py's epilogue, on the accumulator's layout
        rows = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_layout))
        dz = _dlogits_tile(y, rows, cols, rows < N, cols < V, inv_t, LABELS, v_offset, M, LOGS, ENT, GL, GH,
                           ENTROPY)
        # rows / columns past the chunk are clipped by the TMA store; the previous tile's store must
        # have read the staging tile before it is overwritten
        tma.store_wait(0)
        dz_smem.store(dz.to(dz_smem.dtype))
        fence_async_shared()
        _tma_store(DZdesc, [pid_n * BLOCK_N, pid_v * BLOCK_V], dz_smem)
    tma.store_wait(0)


@gluon.jit
def _ring(Hdesc, Wdesc, STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
    """The operand ring: ``STAGES`` hidden and weight tiles, a ``ready`` (loaded) and an ``empty``
    (consumed) mbarrier per slot; with two consumers, their ``turn`` mbarriers (else ``ready`` stands in)."""
    h_bufs = gl.allocate_shared_memory(Hdesc.dtype, [STAGES] + Hdesc.block_type.shape, Hdesc.layout)
    w_bufs = gl.allocate_shared_memory(Wdesc.dtype, [STAGES] + Wdesc.block_type.shape, Wdesc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    turn = ready
    if CONSUMERS > 1:
        turn = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(CONSUMERS):
            mbarrier.init(turn.index(c), count=1)
    return h_bufs, w_bufs, ready, empty, turn


@gluon.jit
def _stats_gluon_kernel(Hdesc, Wdesc, B, N, V, n_h, inv_t, M_out, S_out, A_out,
                        HAS_BIAS: gl.constexpr, ENTROPY: gl.constexpr, GROUP_N: gl.constexpr,
                        STAGES: gl.constexpr, PINGPONG: gl.constexpr, LOADER_REGS: gl.constexpr,
                        CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
    BLOCK_N: gl.constexpr = Hdesc.block_type.shape[0]
    BLOCK_H: gl.constexpr = Hdesc.block_type.shape[1]
    BLOCK_V: gl.constexpr = Wdesc.block_type.shape[0]
    h_bufs, w_bufs, ready, empty, turn = _ring(Hdesc, Wdesc, STAGES, 1 + PINGPONG)
    if PINGPONG:  # two consumer warpgroups on alternate tiles: one's epilogue under the other's wgmma
        gl.warp_specialize([
            (_mma_stats, (h_bufs, w_bufs, ready, empty, turn, B, N, V, n_h, inv_t, M_out, S_out, A_out, HAS_BIAS,
                          ENTROPY, GROUP_N, BLOCK_N, BLOCK_V, BLOCK_H, num_warps, 0, 2)),
            (_mma_stats, (h_bufs, w_bufs, ready, empty, turn, B, N, V, n_h, inv_t, M_out, S_out, A_out, HAS_BIAS,
                          ENTROPY, GROUP_N, BLOCK_N, BLOCK_V, BLOCK_H, num_warps, 1, 2)),
            (_loader, (Hdesc, Wdesc, h_bufs, w_bufs, ready, empty, N, V, n_h, GROUP_N)),
        ], [num_warps, 1], [CONSUMER_REGS, LOADER_REGS])
    else:  # one consumer partition (num_warps / 4 warpgroups) on every tile
        gl.warp_specialize([
            (_mma_stats, (h_bufs, w_bufs, ready, empty, turn, B, N, V, n_h, inv_t, M_out, S_out, A_out, HAS_BIAS,
                          ENTROPY, GROUP_N, BLOCK_N, BLOCK_V, BLOCK_H, num_warps, 0, 1)),
            (_loader, (Hdesc, Wdesc, h_bufs, w_bufs, ready, empty, N, V, n_h, GROUP_N)),
        ], [1], [LOADER_REGS])


@gluon.jit
def _dlogits_gluon_kernel(Hdesc, Wdesc, DZdesc, B, N, V, n_h, inv_t, LABELS, v_offset, M, LOGS, ENT, GL, GH,
                          HAS_BIAS: gl.constexpr, ENTROPY: gl.constexpr, GROUP_N: gl.constexpr,
                          STAGES: gl.constexpr, PINGPONG: gl.constexpr, LOADER_REGS: gl.constexpr,
                          CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
    # one chunk of the chunked backward, as _dlogits_tma_kernel: the descriptors and LABELS/M/... start
    # at the chunk's first row and vocab id; DZdesc is the chunk's [N, V] dz (input dtype)
    BLOCK_N: gl.constexpr = Hdesc.block_type.shape[0]
    BLOCK_H: gl.constexpr = Hdesc.block_type.shape[1]
    BLOCK_V: gl.constexpr = Wdesc.block_type.shape[0]
    h_bufs, w_bufs, ready, empty, turn = _ring(Hdesc, Wdesc, STAGES, 1 + PINGPONG)
    dz_smem = gl.allocate_shared_memory(DZdesc.dtype, DZdesc.block_type.shape, DZdesc.layout)
    if PINGPONG:  # each consumer stages its dz tiles for the TMA store in its own buffer
        dz_smem_1 = gl.allocate_shared_memory(DZdesc.dtype, DZdesc.block_type.shape, DZdesc.layout)
        gl.warp_specialize([
            (_mma_dlogits, (h_bufs, w_bufs, ready, empty, turn, dz_smem, DZdesc, B, N, V, n_h, inv_t, LABELS,
                            v_offset, M, LOGS, ENT, GL, GH, HAS_BIAS, ENTROPY, GROUP_N, BLOCK_N, BLOCK_V, BLOCK_H,
                            num_warps, 0, 2)),
            (_mma_dlogits, (h_bufs, w_bufs, ready, empty, turn, dz_smem_1, DZdesc, B, N, V, n_h, inv_t, LABELS,
                            v_offset, M, LOGS, ENT, GL, GH, HAS_BIAS, ENTROPY, GROUP_N, BLOCK_N, BLOCK_V, BLOCK_H,
                            num_warps, 1, 2)),
            (_loader, (Hdesc, Wdesc, h_bufs, w_bufs, ready, empty, N, V, n_h, GROUP_N)),
        ], [num_warps, 1], [CONSUMER_REGS, LOADER_REGS])
    else:
        gl.warp_specialize([
            (_mma_dlogits, (h_bufs, w_bufs, ready, empty, turn, dz_smem, DZdesc, B, N, V, n_h, inv_t, LABELS,
                            v_offset, M, LOGS, ENT, GL, GH, HAS_BIAS, ENTROPY, GROUP_N, BLOCK_N, BLOCK_V, BLOCK_H,
                            num_warps, 0, 1)),
            (_loader, (Hdesc, Wdesc, h_bufs, w_bufs, ready, empty, N, V, n_h, GROUP_N)),
        ], [1], [LOADER_REGS])


def gl_dtype(dtype: torch.dtype):
    return {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[dtype]


def shared_layout(block: list[int], dtype: torch.dtype):
    """The swizzled shared layout a TMA copy and wgmma both read (the same on host and in the
    compile test's signature)."""
    return gl.NVMMASharedLayout.get_default_for(block, gl_dtype(dtype))


def gluon_usable(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """A Hopper GPU (sm_90: wgmma), bf16 / fp16 inputs of one dtype with unit stride along H and
    16-byte aligned bases and row strides (what a TMA descriptor needs: ``descriptor_inputs``). The
    dispatcher checks the same (kernels/dispatch.py ``takes``) before it imports this module."""
    return device_arch(hidden.device) == 90 and descriptor_inputs(hidden, weight)


def stats_gluon(hidden, weight, bias, inv_t: float, entropy: bool):
    """Partial ``(m, s, a)`` fp32 ``[cdiv(V, BLOCK_V), N]`` of the scaled logits (``a`` None without
    entropy), as ``linear_logprobs_fwd.stats_tiles``; the caller checks ``gluon_usable`` first."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    n, n_h = hidden.shape
    v = weight.shape[0]
    cfg = _cfg("stats_gluon", hidden, weight)
    bn, bv, bh = cfg["BLOCK_N"], cfg["BLOCK_V"], cfg["BLOCK_H"]
    m = torch.empty(triton.cdiv(v, bv), n, dtype=torch.float32, device=hidden.device)
    s = torch.empty_like(m)
    a = torch.empty_like(m) if entropy else s
    if n > 0 and v > 0:
        hdesc = TensorDescriptor(hidden, [n, n_h], [hidden.stride(0), 1], [bn, bh],
                                 shared_layout([bn, bh], hidden.dtype))
        wdesc = TensorDescriptor(weight, [v, n_h], [weight.stride(0), 1], [bv, bh],
                                 shared_layout([bv, bh], weight.dtype))
        n_tiles = triton.cdiv(n, bn) * triton.cdiv(v, bv)
        grid = (max(1, min(n_tiles, cfg["PERSISTENT"] * num_sms(hidden.device))),)
        _stats_gluon_kernel[grid](
            hdesc, wdesc, bias if bias is not None else hidden, n, v, n_h, inv_t, m, s, a,
            HAS_BIAS=bias is not None, ENTROPY=entropy, GROUP_N=cfg["GROUP_N"], STAGES=cfg["num_stages"],
            PINGPONG=bool(cfg["PINGPONG"]), LOADER_REGS=LOADER_REGS, CONSUMER_REGS=CONSUMER_REGS,
            num_warps=cfg["num_warps"], **LAUNCH_OPTIONS)
    return m, s, (a if entropy else None)


def dz_usable(dz: torch.Tensor) -> bool:
    """The chunk's ``dz`` [n_c, v_c] can be a TMA store target: unit stride along the vocabulary,
    16-byte aligned base and row stride (a last vocab chunk of odd width is not; the pointer kernel
    writes it)."""
    return dz.stride(1) == 1 and dz.data_ptr() % 16 == 0 and (dz.stride(0) * dz.element_size()) % 16 == 0


def dlogits_gluon(h_c, w_c, b_c, inv_t, labels, v_offset, m, log_s, ent, gl_, gh, dz, entropy: bool):
    """``dz`` [n_c, v_c] (input dtype) of one chunk of the chunked backward, as
    ``linear_logprobs_tma.dlogits_tma``; the caller checks ``gluon_usable(h_c, w_c)`` and
    ``dz_usable(dz)`` first."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    n, n_h = h_c.shape
    v = w_c.shape[0]
    cfg = _cfg("dlogits_gluon", h_c, w_c)
    bn, bv, bh = cfg["BLOCK_N"], cfg["BLOCK_V"], cfg["BLOCK_H"]
    hdesc = TensorDescriptor(h_c, [n, n_h], [h_c.stride(0), 1], [bn, bh], shared_layout([bn, bh], h_c.dtype))
    wdesc = TensorDescriptor(w_c, [v, n_h], [w_c.stride(0), 1], [bv, bh], shared_layout([bv, bh], w_c.dtype))
    dzdesc = TensorDescriptor(dz, [n, v], [dz.stride(0), 1], [bn, bv], shared_layout([bn, bv], dz.dtype))
    n_tiles = triton.cdiv(n, bn) * triton.cdiv(v, bv)
    grid = (max(1, min(n_tiles, cfg["PERSISTENT"] * num_sms(h_c.device))),)
    _dlogits_gluon_kernel[grid](
        hdesc, wdesc, dzdesc, b_c if b_c is not None else h_c, n, v, n_h, inv_t, labels, v_offset, m, log_s,
        ent if entropy else m, gl_, gh if entropy else gl_,
        HAS_BIAS=b_c is not None, ENTROPY=entropy, GROUP_N=cfg["GROUP_N"], STAGES=cfg["num_stages"],
        PINGPONG=bool(cfg["PINGPONG"]), LOADER_REGS=LOADER_REGS, CONSUMER_REGS=CONSUMER_REGS,
        num_warps=cfg["num_warps"], **LAUNCH_OPTIONS)
