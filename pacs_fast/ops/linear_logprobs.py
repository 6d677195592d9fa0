"""Token log-probs (and entropy) straight from hidden states: the LM head fused with
``token_logprobs`` so that the ``[N, V]`` logits never exist in memory.

    x = (hidden @ weight.T + bias) / temperature,  logp[i] = x[i, y_i] - logsumexp_j x[i, j]

``softcap=c`` soft-caps the logits before the temperature, ``x = c * tanh((hidden @ weight.T + bias) / c) / T``
(Gemma 2's ``final_logit_softcapping``), forward and backward (through the cap's slope ``1 / cosh(z / c)^2``), also
under ``tp_group``: in the torch path (pacs_fast/ops/logit_softcap.py; its backward holds one more scratch tile,
``z / c``) and in the tiled Triton kernels (kernels/linear_logprobs_tiles.py ``_softcap``; the TMA and Gluon kernels
have no cap, so a capped call runs the tiled ones).

Backends (same results, see ``token_logprobs`` for the non-finite semantics):

- ``"triton"``: kernels/linear_logprobs.py; forward (kernels/linear_logprobs_fwd.py): one
  GEMM-shaped program per (row block, vocab block) tile in grouped order, each writing per-row
  partials (max, sum-exp, entropy sum) to an fp32 ``[vocab blocks, N]`` workspace; one more kernel
  (kernels/linear_logprobs_finish.py) merges them (the tensor-parallel merge) and gathers the
  target logits. Backward (``triton_backward``): ``"chunked"`` (default) recomputes the logits per
  vocabulary chunk in a Triton kernel that writes ``dz`` (input dtype), then two cuBLAS GEMMs per
  chunk (``dhidden += dz @ W_chunk``, ``dW_chunk = dz.T @ hidden``); ``"atomic"`` recomputes each
  logits tile and accumulates ``dhidden`` / ``dweight`` with fp32 atomic adds in one kernel.

Every backward gets the row's log-sum-exp in two parts (max ``m`` and ``log s``): one fp32
``lse = m + log s`` is rounded to ulp(m), 3e-5 for logits ~300, and ``p`` with it.
- ``"torch"`` (CPU default; fp32 compute): tiles ``[n, v]`` sized from ``chunk_bytes`` (rows
  and vocabulary both chunked, online log-sum-exp across vocab chunks). Forward: one GEMM per
  tile; backward: recompute GEMM + ``dhidden += dz @ W_v`` + ``dW_v += dz.T @ h`` (the 4-GEMM
  floor of an op whose upstream gradient arrives after the forward), written / accumulated in
  place (``mm(out=)`` then ``addmm_``) into one fp32 ``[V, H]`` buffer and one ``[N, H]``
  buffer. The target logit and its one-hot gradient are O(N*H) gathers, outside the tiles.

Which Triton kernels run, and the fallback when one cannot (kernels/dispatch.py): the forward takes the
Gluon, TMA or tiled kernel its table / ``CONFIG`` names, each checked before it is chosen and replaced by
the next (Gluon -> TMA -> tiled) on any import, compile or launch error; an error of the tiled kernels
(forward or backward) gives this module's torch path, with the same results. One warning line per
failing family and reason; a failed kernel is not tried again in the process. ``PACS_FAST_KERNELS=safe``
runs the tiled Triton kernels only, ``PACS_FAST_KERNELS=torch`` the torch path (docs/GPU.md).

No device-to-host sync in the forward or backward (a step can be captured in a CUDA graph): rows whose
label is ``ignore_index`` are computed with their hidden row zeroed and their results and gradients
masked to 0, not dropped (dropping needs their count on the host); a label outside ``[0, V)`` gives NaN
``logp`` / entropy for its row and no gradient (``PACS_FAST_DEBUG_CHECKS=1``: a ValueError naming it,
one sync); every bias gets the torch path's -inf guard (checking for -inf would read the bias).
Callers that select their rows first (the learners) pay nothing for the ignored ones.

Workspace (torch backend): ``chunk_bytes`` (two tiles) + O(N*H) (the scaled fp32 copy of the
hidden rows) + O(N); plus an fp32 ``[V, H]`` accumulator when ``weight`` is not fp32; with ``softcap`` the
backward's tiles are three (``chunk_bytes`` * 1.5). The Triton
backend: the kernels' own, plus one copy of ``hidden`` with the ignored rows zeroed.

The LM head in fp32 (``upcast=True``, the learner's ``model.lm_head_fp32``): logits and their
gradient computed from fp32 copies of bf16/fp16 ``hidden`` / ``weight``; gradients come back in
the inputs' dtypes. Neither backend ever rounds the logits to the input dtype (the torch backend
computes in fp32, the Triton kernels accumulate ``tl.dot`` in fp32, and products of bf16/fp16
values are exact in fp32), so the *values* are those of an fp32 head either way. What the option
changes: the Triton backward, which otherwise rounds ``dz`` to the input dtype before its two
GEMMs, keeps it in fp32 (and runs IEEE fp32 dots); it costs an fp32 copy of ``weight`` from the
forward to the backward. The torch backend computes exactly this already: no copy is made there.
"""
from __future__ import annotations

import torch

from pacs_fast.kernels import dispatch

from . import chunked, vocab_parallel as vp
from .backend import apply_op, refuse_double_backward
from .logit_softcap import cap_, capped_backward, capped_fill, check_softcap
from .token_logprobs import _integer, _resolve


TRITON_BACKWARDS = ("chunked", "atomic")


def linear_logprobs(hidden, weight, labels, *, bias=None, temperature=1.0, ignore_index=-100,
                    return_entropy=False, tp_group=None, backend="auto", chunk_bytes=None,
                    triton_backward="chunked", upcast=False, softcap=None):
    """logp (fp32 ``[...]``; float64 for float64 inputs) of ``labels`` under
    ``softmax(s(hidden @ weight.T + bias) / temperature)``, ``s`` the identity or the soft-cap ``softcap``.

    Args:
        hidden: ``[..., H]`` fp32/bf16/fp16.
        weight: ``[V, H]`` LM-head weight (with ``tp_group``: this rank's contiguous vocab shard,
            shards in rank order, as a Megatron column-parallel output layer holds it).
        labels: ``[...]`` integer global vocabulary ids; ``ignore_index`` rows give 0, no gradient;
            an id outside ``[0, V)`` gives NaN for its row (not checked on the host: with
            ``PACS_FAST_DEBUG_CHECKS=1`` it raises a ValueError naming the row).
        bias: optional ``[V]`` (the shard's slice under ``tp_group``).
        temperature: positive float folded into the logits.
        return_entropy: also return the differentiable entropy of each row's distribution.
        tp_group: process group over which the vocabulary is sharded. Values equal the unsharded
            computation on every rank; ``hidden``'s gradient is all-reduced over the group (the
            full gradient on every rank), ``weight``'s/``bias``' gradients are the local shards'.
        backend: ``"auto"`` | ``"triton"`` | ``"torch"``. The environment variable
            ``PACS_FAST_KERNELS`` overrides the kernels: ``safe`` runs the portable tiled Triton
            kernels only (no Gluon / TMA), ``torch`` the chunked PyTorch path (for ``"auto"`` and
            ``"triton"`` alike); unset or ``auto``: the measured / built-in choice, with the checked
            fallback Gluon -> TMA -> tiled Triton -> PyTorch on any kernel error (one warning).
        chunk_bytes: scratch budget in bytes: the torch backend's logits tiles (default 64 MiB),
            the Triton ``chunked`` backward's ``dz`` buffer (default 512 MiB).
        triton_backward: Triton backend only: ``"chunked"`` (default: a Triton kernel forms a
            ``dz`` chunk, cuBLAS does ``dhidden += dz @ W`` and ``dW = dz.T @ hidden``;
            deterministic) or ``"atomic"`` (one pass, fp32 atomic adds, no ``dz`` buffer).
        upcast: the LM head in fp32: bf16/fp16 ``hidden`` / ``weight`` enter the Triton kernels
            as fp32 copies (the backward's ``dz`` stays fp32); gradients are returned in the
            inputs' dtypes. The torch backend computes in fp32 regardless (see the module docstring).
        softcap: None / 0 (default: no cap, the computation above) or a finite positive ``c``: the logits are
            ``c * tanh((hidden @ weight.T + bias) / c) / temperature`` (Gemma 2's ``final_logit_softcapping``;
            values and gradients through the tanh), in both backends (the tiled Triton kernels: a capped call never
            runs the TMA / Gluon ones) and under ``tp_group`` (the cap is elementwise, applied to each shard's tiles).

    Returns:
        ``logp``, or ``(logp, entropy)`` with ``return_entropy``; fp32 (float64 for float64 ``hidden``
        and ``weight``) with ``labels``' shape. Differentiable once (a ``create_graph=True`` backward: a
        RuntimeError saying so), by ``backward`` / ``torch.autograd.grad``: not under ``torch.func`` transforms
        (``grad``, ``vmap``), whose autograd.Function needs a ``setup_context`` this op does not have.
    """
    for name, t in (("hidden", hidden), ("weight", weight)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise ValueError(f"linear_logprobs: {name} must be a floating-point tensor")
    if hidden.dim() < 1 or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"linear_logprobs: weight must be [V, H] with H = hidden.shape[-1]; got hidden "
                         f"{tuple(hidden.shape)}, weight {tuple(weight.shape)}")
    if not isinstance(labels, torch.Tensor) or not _integer(labels):
        raise ValueError("linear_logprobs: labels must be an integer tensor")
    if labels.shape != hidden.shape[:-1]:
        raise ValueError(f"linear_logprobs: labels shape {tuple(labels.shape)} must equal hidden.shape[:-1] "
                         f"{tuple(hidden.shape[:-1])}")
    if hidden.shape[-1] == 0:
        raise ValueError(f"linear_logprobs: hidden has an empty hidden dimension (H = hidden.shape[-1] = 0, hidden "
                         f"{tuple(hidden.shape)}, weight {tuple(weight.shape)}): no logits to compute")
    if weight.shape[0] == 0:
        raise ValueError(f"linear_logprobs: weight has an empty vocabulary dimension (V = weight.shape[0] = 0, weight "
                         f"{tuple(weight.shape)}): there is no distribution to take log-probs from")
    if triton_backward not in TRITON_BACKWARDS:
        raise ValueError(f"linear_logprobs: triton_backward must be one of {TRITON_BACKWARDS}, got {triton_backward!r}")
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != (weight.shape[0],)):
        raise ValueError(f"linear_logprobs: bias must be a tensor of shape [{weight.shape[0]}]")
    if bias is not None and not bias.is_floating_point():  # (an integer bias had been taken, and summed as one)
        raise ValueError(f"linear_logprobs: bias must be a floating-point tensor, got {bias.dtype}")
    t = chunked.check_temperature(temperature, "linear_logprobs")
    ignore_index = chunked.check_ignore_index(ignore_index, "linear_logprobs")
    chunk_bytes = chunked.check_chunk_bytes(chunk_bytes, "linear_logprobs")
    vp.check_tp_group(tp_group, "linear_logprobs")
    cap = check_softcap(softcap, "linear_logprobs")
    if bias is not None and not bias.is_contiguous():  # the kernels read it with unit stride
        bias = bias.contiguous()
    tensors = [hidden, weight, labels] + ([bias] if bias is not None else [])
    if len({x.device for x in tensors}) != 1:
        raise ValueError("linear_logprobs: hidden, weight, labels (and bias) must be on one device")
    resolved = _resolve(backend, *[x for x in tensors if x.is_floating_point()] + [labels])
    if upcast and resolved == "triton":  # autograd casts the gradients back to the inputs' dtypes
        hidden, weight = hidden.float(), weight.float()
    if resolved == "triton" and hidden.dtype != weight.dtype:
        raise ValueError(f"backend='triton' needs hidden and weight of one dtype; got "
                         f"hidden {hidden.dtype}, weight {weight.dtype}")
    lead = labels.shape
    h2 = hidden.reshape(-1, hidden.shape[-1])
    logp, ent = apply_op(_LinearLogprobs.apply, h2, weight, bias, labels.reshape(-1).long().contiguous(), 1.0 / t,
                         ignore_index, bool(return_entropy), tp_group, (resolved, triton_backward), chunk_bytes,
                         cap, triton=resolved == "triton")
    logp = logp.view(lead)
    return (logp, ent.view(lead)) if return_entropy else logp


FWD_KERNEL = "forward (stats_tiles + finish)"  # kernels/dispatch.py names of the tiled kernels' jobs
BWD_KERNEL = {"chunked": "dlogits (chunked backward)", "atomic": "grad_bwd (atomic backward)"}


def _prepare(hidden, keep, inv_t, torch_path: bool):
    """Hidden rows with the rows that do not count zeroed (their NaN / Inf never reach a gradient: their
    ``dz`` is 0 only for finite logits), contiguous; a new tensor (selecting the rows instead would need
    their count on the host). The torch backend gets them in fp32 and already scaled by 1/T (so each tile
    is one GEMM); the Triton kernels scale in fp32 inside the tile."""
    if not torch_path:
        return torch.where(keep.unsqueeze(1), hidden, hidden.new_zeros(())).contiguous()
    h = hidden.to(chunked.compute_dtype(hidden)).contiguous()
    if h is hidden:
        h = h.clone()
    h.masked_fill_(~keep.unsqueeze(1), 0.0)
    if inv_t != 1.0:
        h.mul_(inv_t)
    return h


def _torch_stats(h, weight, bias, labels, v_off, inv_t, entropy, chunk_bytes, cap=0.0):
    """Per-row ``(m, s, a or None, target)`` of the torch backend (``h`` from ``_prepare(torch_path=True)``,
    not scaled by 1/T with a ``cap``)."""
    n, v_local, cd = h.shape[0], weight.shape[0], h.dtype
    if cap:  # (0 where another rank owns the label: tanh(0) = 0)
        target = cap_(_target_logit(h, weight, bias, labels, v_off, 1.0, h_scaled=True).to(cd), cap, inv_t)
    else:
        target = _target_logit(h, weight, bias, labels, v_off, inv_t, h_scaled=True).to(cd)
    if v_local == 0 or n == 0:
        m = torch.full((n,), float("-inf"), dtype=cd, device=h.device)
        s = torch.zeros(n, dtype=cd, device=h.device)
        return m, s, (s.clone() if entropy else None), target
    if torch.compiler.is_compiling():  # the tile loop as one opaque op (see _tile_stats_op)
        m, s, a = _tile_stats_op(h, weight, bias, inv_t, entropy, chunked.encode_chunk(chunk_bytes), cap)
        return m, s, (a if entropy else None), target
    return (*_tile_stats(h, weight, bias, inv_t, entropy, chunk_bytes, cap), target)


def _tile_stats(h, weight, bias, inv_t, entropy, chunk_bytes, cap=0.0):
    """Per-row ``(m, s, a or None)`` of the logits ``h @ weight.T + bias / T`` over GEMM tiles (with a ``cap``:
    ``cap * tanh((h @ weight.T + bias) / cap) / T``, ``h`` not scaled)."""
    n, v_local = h.shape[0], weight.shape[0]
    tile = chunked.plan_chunks(n, v_local, chunk_bytes, prefer_rows=True)
    fill = capped_fill(_gemm_fill(h, weight, bias, 1.0), inv_t, cap) if cap else _gemm_fill(h, weight, bias, inv_t)
    return chunked.forward_stats(n, v_local, tile, fill, entropy, h.device, v_outer=True,
                                 clamp=_may_have_neg_inf(bias, inv_t), dtype=h.dtype)


class _LinearLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, inv_t, ignore_index, entropy, group, backends,
                chunk_bytes, cap):
        backend, triton_backward = backends
        n, v_local = hidden.shape[0], weight.shape[0]
        v_off, v_glob = vp.shard_offset(v_local, group)
        keep, bad = vp.label_masks(labels, ignore_index, v_glob)  # no host sync (rows are masked, not dropped)
        stats = None
        if backend == "triton" and dispatch.broken("tiles", FWD_KERNEL):
            backend = "torch"  # the tiled kernels failed earlier in this process (warned then)
        if backend == "triton" and n > 0 and v_local > 0:
            try:  # the tiles' partials (Gluon / TMA / tiled: kernels/dispatch.py), then the finish kernel
                from pacs_fast.kernels import linear_logprobs as K
                from pacs_fast.kernels.linear_logprobs_finish import finish
                h, w = _prepare(hidden, keep, inv_t, False), weight.contiguous()
                stats = finish(*K.stats_fwd(h, w, bias, inv_t, entropy, cap), h, w, bias, labels, v_off, inv_t, cap)
            except Exception as e:  # any import / compile / launch error: the torch path (one warning)
                dispatch.failed("tiles", FWD_KERNEL, e)
                backend = "torch"
            h = None
        if stats is None:  # (with a cap the rows are not scaled: 1/T comes after the tanh)
            stats = _torch_stats(_prepare(hidden, keep, 1.0 if cap else inv_t, True), weight, bias, labels, v_off,
                                 inv_t, entropy, chunk_bytes, cap)
        m, s, a, target = vp.allreduce_stats(*stats, group)
        lse, logp, ent_k = vp.finalize(m, s, a, target, keep)  # rows that do not count: 0
        nan = torch.full((), float("nan"), dtype=logp.dtype, device=logp.device)
        logp = torch.where(bad, nan, logp)  # a label out of range: NaN (PACS_FAST_DEBUG_CHECKS=1 raises)
        ent = torch.where(bad, nan, ent_k) if entropy else torch.zeros_like(logp)
        # the backward gets lse in two parts (m, log s): one fp32 lse rounds to ulp(m)
        ctx.save_for_backward(hidden, weight, bias, labels, m, torch.log(s), ent_k if entropy else m)
        ctx.cfg = (inv_t, ignore_index, entropy, group, backend, triton_backward, chunk_bytes, v_off, v_glob, cap)
        ctx.set_materialize_grads(False)
        if not entropy:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        refuse_double_backward("linear_logprobs", "use torch.log_softmax of hidden @ weight.T for those")
        hidden, weight, bias, labels, m, log_s, ent = ctx.saved_tensors
        inv_t, ignore_index, entropy, group, backend, triton_backward, chunk_bytes, v_off, v_glob, cap = ctx.cfg
        keep = vp.label_masks(labels, ignore_index, v_glob, check=False)[0]
        cd = m.dtype
        zeros = torch.zeros((), dtype=cd, device=hidden.device)
        # rows that do not count get no gradient (dense: upstream grads may be expanded views)
        gl = torch.zeros_like(m) if g_logp is None else torch.where(keep, g_logp.to(cd), zeros)
        gh = torch.where(keep, g_ent.to(cd), zeros) if (entropy and g_ent is not None) else None
        need_w = ctx.needs_input_grad[1]  # frozen LM head: skip dW (one GEMM of four)
        need_b = bias is not None and ctx.needs_input_grad[2]
        grads = None
        if backend == "triton" and dispatch.broken("tiles", BWD_KERNEL[triton_backward]):
            backend = "torch"
        if backend == "triton" and hidden.shape[0] > 0 and weight.shape[0] > 0:
            try:
                from pacs_fast.kernels import linear_logprobs as K, linear_logprobs_bwd as KB
                h = _prepare(hidden, keep, inv_t, False)
                run = K.grad_bwd if triton_backward == "atomic" else KB.grad_bwd_chunked
                extra = {} if triton_backward == "atomic" else dict(chunk_bytes=chunk_bytes)
                grads = run(h, weight.contiguous(), bias, inv_t, labels, v_off, m, log_s, ent, gl, gh,
                            need_weight_grad=need_w, need_bias_grad=need_b, softcap=cap, **extra)
            except Exception as e:  # any import / compile / launch error: the torch path (one warning)
                dispatch.failed("tiles", BWD_KERNEL[triton_backward], e)
            h = None
        h_scale = 1.0 if cap else inv_t
        if grads is None and torch.compiler.is_compiling():  # the tile loops as one opaque op
            dh, dw, db = _torch_backward_op(_prepare(hidden, keep, h_scale, True), weight, bias, labels, v_off, inv_t,
                                            m, log_s, ent, gl, gh, need_w, need_b, chunked.encode_chunk(chunk_bytes),
                                            cap)
            grads = dh, (dw if need_w else None), (db if need_b else None)
        if grads is None:
            grads = _torch_backward(_prepare(hidden, keep, h_scale, True), weight, bias, labels, v_off, inv_t,
                                    m, log_s, ent, gl, gh, need_w, need_b, chunk_bytes, cap)
        dh, dw, db = grads
        vp.allreduce_sum_(dh, group)
        dhidden = dh.to(hidden.dtype)
        dweight = dw.to(weight.dtype) if dw is not None else None
        dbias = db.to(bias.dtype) if db is not None else None
        return dhidden, dweight, dbias, None, None, None, None, None, None, None, None


def _torch_backward(h, weight, bias, labels, v_off, inv_t, m, log_s, ent, gl, gh, need_w, need_b, chunk_bytes,
                    cap=0.0):
    """``(dh, dW or None, db or None)`` in the compute dtype by the torch backend (``h``: fp32 rows scaled
    by 1/T, from ``_prepare(torch_path=True)``, not scaled with a ``cap``; rows that do not count have
    ``gl = gh = 0``)."""
    if cap:
        z_t = _target_logit(h, weight, bias, labels, v_off, 1.0, h_scaled=True)
        return capped_backward(h, weight, bias, labels, v_off, inv_t, cap, z_t, m, log_s, ent, gl, gh, need_w,
                               need_b, chunk_bytes, clamp=_may_have_neg_inf(bias, inv_t),
                               gemm=_gemm_fill(h, weight, bias, 1.0))
    n, n_h = h.shape
    v_local, cd = weight.shape[0], m.dtype
    local = labels - v_off
    owned = (local >= 0) & (local < v_local)
    safe = torch.where(owned, local, torch.zeros_like(local))
    # every row of dh / dW is first *written* by the tile at v0 == 0 / n0 == 0 (a GEMM
    # with beta = 0), then accumulated into: no zero fill, no read of a zero buffer
    alloc = torch.empty if (n and v_local) else torch.zeros
    dh = alloc(n, n_h, dtype=cd, device=h.device)
    dw = alloc(v_local, n_h, dtype=cd, device=h.device) if need_w else None
    db = torch.zeros(v_local, dtype=cd, device=h.device) if need_b else None
    if n and v_local:
        # tiles give dx (w.r.t. the scaled logits): dW = dx^T (h/T), dh = dx W / T
        # tiles hold x - m; 1/s and -gh log s folded into the row coefficients
        gh, coef_c = chunked.fold_two_part_lse(gl, gh, ent, log_s)
        tile = chunked.plan_chunks(n, v_local, chunk_bytes, prefer_rows=True)
        fill_rel = _gemm_fill(h, weight, bias, inv_t, m)
        w_rows = chunked.row_cache(weight, cd)

        def consume(n0, n1, v0, v1, dx):
            w_c = w_rows(v0, v1)
            if v0 == 0:
                torch.mm(dx, w_c, out=dh[n0:n1])
            else:
                dh[n0:n1].addmm_(dx, w_c)
            if dw is not None:
                if n0 == 0:
                    torch.mm(dx.t(), h[n0:n1], out=dw[v0:v1])
                else:
                    dw[v0:v1].addmm_(dx.t(), h[n0:n1])
            if db is not None:
                db[v0:v1] += dx.sum(0)

        chunked.backward_tiles(n, v_local, tile, fill_rel, gh, coef_c, consume,
                               h.device, v_outer=True, clamp=_may_have_neg_inf(bias, inv_t))
        # one-hot term: dx[i, y_i] += gl_i (on the rank that owns y_i)
        g_t = torch.where(owned, gl, torch.zeros_like(gl))
        dh.addcmul_(weight.index_select(0, safe).to(cd), g_t.unsqueeze(1))
        if dw is not None:
            dw.index_add_(0, safe, h * g_t.unsqueeze(1))
        if db is not None:
            db.index_add_(0, safe, g_t)
            db.mul_(inv_t)
    dh.mul_(inv_t)
    return dh, dw, db


# Under torch.compile the tile loops run as torch.library custom ops, opaque to dynamo: a loop over
# ceil(N / rows per tile) tiles traced by dynamo pins the token count N (every new count compiled again
# until dynamo's recompile limit left the op eager). Eager calls never go through them (an op's first
# eager call imports torch._dynamo, ~1 s). Schemas written out as in token_logprobs.py (torch 2.5 cannot infer them).
@torch.library.custom_op("pacs_fast::linear_tile_stats", mutates_args=(),
                         schema="(Tensor h, Tensor weight, Tensor? bias, float inv_t, bool entropy, SymInt[] chunk, "
                                "float cap) -> (Tensor, Tensor, Tensor)")
def _tile_stats_op(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, inv_t: float, entropy: bool,
                   chunk: list[int], cap: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, s, a = _tile_stats(h, weight, bias, inv_t, entropy, chunked.decode_chunk(chunk), cap)
    return m, s, (a if a is not None else m.new_empty(0))


@_tile_stats_op.register_fake
def _(h, weight, bias, inv_t, entropy, chunk, cap):
    n = h.shape[0]
    return h.new_empty(n), h.new_empty(n), h.new_empty(n if entropy else 0)


@torch.library.custom_op("pacs_fast::linear_tile_grad", mutates_args=(),
                         schema="(Tensor h, Tensor weight, Tensor? bias, Tensor labels, SymInt v_off, float inv_t, "
                                "Tensor m, Tensor log_s, Tensor ent, Tensor gl, Tensor? gh, bool need_w, bool need_b, "
                                "SymInt[] chunk, float cap) -> (Tensor, Tensor, Tensor)")
def _torch_backward_op(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
                       v_off: int, inv_t: float, m: torch.Tensor, log_s: torch.Tensor, ent: torch.Tensor,
                       gl: torch.Tensor, gh: torch.Tensor | None, need_w: bool, need_b: bool,
                       chunk: list[int], cap: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dh, dw, db = _torch_backward(h, weight, bias, labels, v_off, inv_t, m, log_s, ent, gl, gh, need_w, need_b,
                                 chunked.decode_chunk(chunk), cap)
    return dh, (dw if dw is not None else h.new_empty(0)), (db if db is not None else h.new_empty(0))


@_torch_backward_op.register_fake
def _(h, weight, bias, labels, v_off, inv_t, m, log_s, ent, gl, gh, need_w, need_b, chunk, cap):
    return (h.new_empty(h.shape), h.new_empty(weight.shape) if need_w else h.new_empty(0),
            h.new_empty(weight.shape[0]) if need_b else h.new_empty(0))


def _target_logit(h, weight, bias, lab, v_off, inv_t, h_scaled):
    """x[i, y_i] (scaled) as an O(N*H) gather-dot of the rows ``lab - v_off`` of this shard's
    ``weight``; 0 for rows whose target is on another rank."""
    if h.shape[0] == 0 or weight.shape[0] == 0:
        return torch.zeros(h.shape[0], dtype=torch.float32, device=h.device)
    local = lab - v_off
    owned = (local >= 0) & (local < weight.shape[0])
    safe = torch.where(owned, local, torch.zeros_like(local))
    cd = chunked.compute_dtype(h)
    w_rows = weight.index_select(0, safe).to(cd)
    t = (h.to(cd) * w_rows).sum(1)
    if bias is not None:
        b = bias.index_select(0, safe).to(cd)
        t = t + b * inv_t if h_scaled else t + b
    if not h_scaled:
        t = t * inv_t
    return torch.where(owned, t, torch.zeros_like(t))


def _gemm_fill(h, weight, bias, inv_t, lse=None):
    """Tile producer for the torch backend (``h`` fp32, already / T): ``out = h[n] @ W[v].T +
    b[v] / T``, minus ``lse[n]`` when given (the backward's ``x - lse``: the offset is written
    first, then the GEMM accumulates onto it, which saves a pass over the tile)."""
    w_rows = chunked.row_cache(weight, h.dtype)

    def fill(n0, n1, v0, v1, out):
        w_c = w_rows(v0, v1)
        if bias is None and lse is None:
            return torch.mm(h[n0:n1], w_c.t(), out=out)
        if lse is None:
            out.copy_((bias[v0:v1].to(h.dtype) * inv_t).unsqueeze(0).expand_as(out))
        elif bias is None:
            out.copy_(lse[n0:n1].neg().unsqueeze(1).expand_as(out))
        else:
            torch.sub((bias[v0:v1].to(h.dtype) * inv_t).unsqueeze(0), lse[n0:n1].unsqueeze(1), out=out)
        return out.addmm_(h[n0:n1], w_c.t())
    return fill


def _may_have_neg_inf(bias, inv_t: float) -> bool:
    """GEMM tiles hold -inf only through the bias (overflow of the GEMM itself makes the row NaN
    anyway): a -inf entry, or a finite mask value such as finfo.min that ``1 / temperature`` > 1
    scales past the fp32 range; then the -inf guard (one clamp pass per tile) is needed. Whether the
    bias holds one is a device value (a host sync to read): every bias gets the guard."""
    return bias is not None
