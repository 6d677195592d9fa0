"""Log-probabilities (and entropy) of target tokens from logits, without materialising softmax.

    logp[i]    = x[i, y_i] - logsumexp_j x[i, j]          x = logits / temperature
    entropy[i] = -sum_j p[i, j] log p[i, j]               p = softmax(x[i])

Both in fp32 from one pass over the vocabulary (online max / sum-exp); both differentiable (the
backward recomputes ``p`` block by block). Backends: ``"triton"`` (kernels/token_logprobs.py),
``"torch"`` (row/vocab tiles under a memory budget, pacs_fast/ops/chunked.py), ``"auto"``.

Non-finite logits (documented, tested): ``-inf`` entries are allowed (probability 0, no NaN in
the entropy or gradients; a ``-inf`` target gives ``logp = -inf``); a row with any NaN or
``+inf`` logit, or with all logits ``-inf``, gives NaN ``logp``/``entropy`` and NaN gradient for
that row. Rows whose label is ``ignore_index`` give 0 and a zero gradient whatever their logits; a
label neither that nor in ``[0, V)`` gives NaN ``logp``/``entropy`` and a zero gradient for its row
(``PACS_FAST_DEBUG_CHECKS=1`` raises instead, one device sync).

Device syncs: none in the forward or the backward (a step can be captured in a CUDA graph). The Triton
kernels fall back to the torch path on an import / compile error, with one warning (kernels/dispatch.py).
"""
from __future__ import annotations

import torch

from pacs_fast.kernels import dispatch

from . import chunked, vocab_parallel as vp
from .backend import apply_op, refuse_double_backward, resolve_backend

FWD_KERNEL = "token_logprobs forward"  # kernels/dispatch.py names of this op's Triton kernels
BWD_KERNEL = "token_logprobs backward"


def token_logprobs(logits, labels, *, temperature=1.0, ignore_index=-100, return_entropy=False,
                   inplace_backward=False, tp_group=None, backend="auto", chunk_bytes=None):
    """Log-prob of ``labels`` under ``softmax(logits / temperature)``.

    Args:
        logits: ``[..., V]`` fp32/bf16/fp16 (with ``tp_group``: this rank's contiguous vocab
            shard ``[..., V / tp]``, shards in rank order).
        labels: ``[...]`` integer global vocabulary ids; ``ignore_index`` marks rows to skip.
        temperature: positive float folded into the logits.
        return_entropy: also return the (differentiable) entropy of each row's distribution.
        inplace_backward: write the gradient into ``logits``' storage (saves one ``[N, V]``
            buffer); ``logits`` must not be used after the backward, and must not be (a view of) a
            leaf tensor such as a parameter (a ValueError; under ``no_grad`` nothing is written). Logits another
            op saved for its backward (``tanh``'s output, a softcap's) make that backward raise autograd's
            "modified by an inplace operation" error, on both backends. Under ``torch.compile`` (torch backend)
            the gradient gets a buffer of its own.
        tp_group: ``torch.distributed`` process group over which the vocabulary is sharded.
        backend: ``"auto"`` | ``"triton"`` | ``"torch"`` (see ``pacs_fast.ops.backend``).
        chunk_bytes: torch backend only: scratch budget for tiles (default 64 MiB).

    Returns:
        ``logp`` fp32 ``[...]`` (float64 for float64 logits), or ``(logp, entropy)`` with ``return_entropy``.
        Differentiable once (a ``create_graph=True`` backward: a RuntimeError saying so), by ``backward`` /
        ``torch.autograd.grad``: not under ``torch.func`` transforms (``grad``, ``vmap``), whose autograd.Function
        needs a ``setup_context`` this op does not have (``pacs_loss`` works under them).
    """
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point() or logits.dim() < 1:
        raise ValueError("token_logprobs: logits must be a floating-point tensor [..., V]")
    if not isinstance(labels, torch.Tensor) or not _integer(labels):
        raise ValueError("token_logprobs: labels must be an integer tensor")
    if logits.shape[-1] == 0:
        raise ValueError(f"token_logprobs: logits has an empty vocabulary dimension (V = logits.shape[-1] = 0, shape "
                         f"{tuple(logits.shape)}): there is no distribution to take log-probs from")
    if labels.shape != logits.shape[:-1]:
        raise ValueError(f"token_logprobs: labels shape {tuple(labels.shape)} must equal logits.shape[:-1] "
                         f"{tuple(logits.shape[:-1])}")
    if labels.device != logits.device:
        raise ValueError("token_logprobs: labels must be on the same device as logits")
    if inplace_backward and logits.requires_grad and torch.is_grad_enabled() \
            and (logits if logits._base is None else logits._base).is_leaf:  # (no_grad: no backward to write)
        raise ValueError("token_logprobs: inplace_backward=True would write the gradient over logits, which are "
                         "(a view of) a leaf tensor (a parameter or an input): pass logits computed in the graph, "
                         "e.g. the LM head's output (inside torch.utils.checkpoint(use_reentrant=True) every input is "
                         "a detached leaf: use use_reentrant=False, or the LM head inside the checkpoint)")
    t = chunked.check_temperature(temperature, "token_logprobs")
    ignore_index = chunked.check_ignore_index(ignore_index, "token_logprobs")
    chunk_bytes = chunked.check_chunk_bytes(chunk_bytes, "token_logprobs")
    vp.check_tp_group(tp_group, "token_logprobs")
    resolved = _resolve(backend, logits)
    lead = labels.shape
    x2 = logits.reshape(-1, logits.shape[-1])
    # a copy for a strided vocabulary, and, for the in-place gradient, for rows that share memory (an expanded
    # view, a row stride below the row's length: rows' gradients would be written over each other's elements)
    shared = inplace_backward and x2.shape[0] > 1 and x2.stride(0) < x2.shape[1]
    if x2.shape[-1] > 0 and (x2.stride(-1) != 1 or shared):
        x2 = x2.contiguous()
    logp, ent = apply_op(_TokenLogprobs.apply, x2, labels.reshape(-1).long().contiguous(), 1.0 / t, ignore_index,
                         bool(return_entropy), bool(inplace_backward), tp_group, resolved, chunk_bytes,
                         triton=resolved == "triton")
    logp = logp.view(lead)
    return (logp, ent.view(lead)) if return_entropy else logp


def _integer(t: torch.Tensor) -> bool:
    """An integer dtype (not bool, float or complex): what label ids are."""
    return not (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool)


class _TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, inv_t, ignore_index, entropy, inplace, group, backend, chunk_bytes):
        n, v_local = logits.shape
        v_off, v_glob = vp.shard_offset(v_local, group)
        valid, bad = vp.label_masks(labels, ignore_index, v_glob)  # no host sync
        # a label out of range is treated as ignored from here on (backward included), NaN at the end
        labels = torch.where(bad, torch.full((), ignore_index, dtype=labels.dtype, device=labels.device), labels)
        local = labels - v_off
        owned = valid & (local >= 0) & (local < v_local)
        safe = torch.where(owned, local, torch.zeros_like(local))
        cd = chunked.compute_dtype(logits)
        target = torch.where(owned, logits.gather(1, safe.unsqueeze(1)).squeeze(1).to(cd) * inv_t,
                             torch.zeros((), dtype=cd, device=logits.device)) \
            if v_local > 0 else torch.zeros(n, dtype=cd, device=logits.device)

        stats = None
        if backend == "triton" and dispatch.broken("tiles", FWD_KERNEL):
            backend = "torch"  # failed earlier in this process (warned then)
        if backend == "triton":
            try:
                from pacs_fast.kernels import token_logprobs as K
                stats = vp.merge_splits(*K.stats_fwd(logits, inv_t, entropy)) if v_local > 0 \
                    else _empty(n, entropy, logits.device)
            except Exception as e:  # any import / compile / launch error: the torch path (one warning)
                dispatch.failed("tiles", FWD_KERNEL, e)
                backend = "torch"
        if stats is not None:
            m, s, a = stats
        elif torch.compiler.is_compiling():  # the tile loop as one opaque op (see _tile_stats_op)
            m, s, a = _tile_stats_op(logits, inv_t, entropy, chunked.encode_chunk(chunk_bytes))
            a = a if entropy else None
        else:
            m, s, a = _tile_stats(logits, inv_t, entropy, chunk_bytes)
        m, s, a, target = vp.allreduce_stats(m, s, a, target, group)
        lse, logp, ent = vp.finalize(m, s, a, target, valid)
        # the backward gets lse in two parts (m, log s): one fp32 lse rounds to ulp(m)
        ctx.save_for_backward(logits, labels, m, torch.log(s), ent if entropy else m)
        ctx.cfg = (inv_t, ignore_index, entropy, inplace, backend, chunk_bytes, v_off)
        ctx.set_materialize_grads(False)
        nan = torch.full((), float("nan"), dtype=logp.dtype, device=logp.device)
        logp = torch.where(bad, nan, logp)  # a label out of range: NaN (PACS_FAST_DEBUG_CHECKS=1 raises)
        ent = torch.zeros_like(logp) if ent is None else torch.where(bad, nan, ent)
        ctx.mark_non_differentiable(*(() if entropy else (ent,)))
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        refuse_double_backward("token_logprobs", "use torch.log_softmax for those")
        logits, labels, m, log_s, ent = ctx.saved_tensors
        inv_t, ignore_index, entropy, inplace, backend, chunk_bytes, v_off = ctx.cfg
        n, v_local = logits.shape
        valid = labels != ignore_index
        zeros = torch.zeros(n, dtype=m.dtype, device=logits.device)
        gl = zeros if g_logp is None else torch.where(valid, g_logp.to(m.dtype), zeros)
        gh = None
        if entropy and g_ent is not None:
            gh = torch.where(valid, g_ent.to(m.dtype), zeros)
        grad = logits if inplace else torch.empty_like(logits)
        if n == 0 or v_local == 0:
            return (grad.zero_(),) + (None,) * 8
        if backend == "triton" and not dispatch.broken("tiles", BWD_KERNEL):
            try:
                from pacs_fast.kernels import token_logprobs as K
                K.grad_bwd(logits, grad, inv_t, labels, v_off, ignore_index, m, log_s, ent, gl, gh)
                if inplace:  # a kernel's write bumps no version counter: autograd then refuses (as on the torch
                    torch.autograd.graph.increment_version(grad)  # path) a later read of the overwritten logits
                return (grad,) + (None,) * 8
            except Exception as e:  # an import / compile error (before any write): the torch path below
                dispatch.failed("tiles", BWD_KERNEL, e)

        if torch.compiler.is_compiling():  # the tile loop as one opaque op; the gradient gets its own buffer
            return (_tile_grad_op(logits, labels, m, log_s, ent, gl, gh, inv_t, ignore_index, v_off,
                                  chunked.encode_chunk(chunk_bytes)),) + (None,) * 8
        _tile_grad(grad, logits, labels, m, log_s, ent, gl, gh, inv_t, ignore_index, v_off, chunk_bytes)
        return (grad,) + (None,) * 8


def _tile_stats(logits, inv_t, entropy, chunk_bytes):
    """Torch backend forward: per-row ``(m, s, a or None)`` of ``logits * inv_t`` over tiles."""
    n, v_local = logits.shape
    tile = chunked.plan_chunks(n, v_local, chunk_bytes)
    return chunked.forward_stats(n, v_local, tile, _fill(logits, inv_t), entropy, logits.device,
                                 dtype=chunked.compute_dtype(logits))


def _tile_grad(grad, logits, labels, m, log_s, ent, gl, gh, inv_t, ignore_index, v_off, chunk_bytes):
    """Torch backend backward: writes d(loss)/d(logits) into ``grad`` (``[N, V_local]``, may be ``logits``).

    dx = gl onehot - p (gh (x - lse) + gl + gh H), times inv_t, with p = exp(x - m) / s: the tiles hold
    x - m (exact for the large entries) and 1 / s and -gh log s are folded into the per-row coefficients
    (chunked.fold_two_part_lse)."""
    n, v_local = logits.shape
    valid = labels != ignore_index
    coef_x, coef_c = chunked.fold_two_part_lse(gl, gh, ent, log_s, inv_t)
    m_safe = torch.where(valid, m, torch.zeros_like(m))
    local = labels - v_off
    owned = valid & (local >= 0) & (local < v_local)
    tile = chunked.plan_chunks(n, v_local, chunk_bytes)
    fill = _fill(logits, inv_t)
    direct = grad.dtype == m.dtype and tile[1] == v_local

    def out_tile(n0, n1, v0, v1):  # whole fp32 rows of the gradient: compute there directly
        return grad[n0:n1] if direct else None

    def consume(n0, n1, v0, v1, dx):
        # the one-hot term without a host sync: one scatter per row (0 where the label is elsewhere)
        rows = owned[n0:n1] & (local[n0:n1] >= v0) & (local[n0:n1] < v1)
        col = (local[n0:n1] - v0).clamp(0, v1 - v0 - 1).unsqueeze(1)
        dx.scatter_add_(1, col, torch.where(rows, gl[n0:n1] * inv_t, 0.0).to(dx.dtype).unsqueeze(1))
        dx.masked_fill_(~valid[n0:n1].unsqueeze(1), 0.0)  # ignored rows: 0 whatever their logits
        if not direct:  # else dx is already that tile of grad (out_tile)
            grad[n0:n1, v0:v1].copy_(dx)

    def fill_rel(n0, n1, v0, v1, out):
        return torch.sub(fill(n0, n1, v0, v1, out), m_safe[n0:n1].unsqueeze(1), out=out)

    chunked.backward_tiles(n, v_local, tile, fill_rel, coef_x, coef_c, consume, logits.device, out_tile=out_tile)


# Under torch.compile the tile loops run as torch.library custom ops, opaque to dynamo: a loop over
# ceil(N / rows per tile) tiles traced by dynamo pins the token count N (every new count compiled again
# until dynamo's recompile limit left the op eager). Eager calls never go through them (an op's first
# eager call imports torch._dynamo, ~1 s). The schemas are written out, as torch 2.13 infers them from the
# annotations: torch 2.5's infer_schema rejects ``list[int]`` (2.4's also the string annotations of
# ``from __future__ import annotations``), so importing pacs_fast.ops failed there.
@torch.library.custom_op("pacs_fast::token_tile_stats", mutates_args=(),
                         schema="(Tensor logits, float inv_t, bool entropy, SymInt[] chunk) "
                                "-> (Tensor, Tensor, Tensor)")
def _tile_stats_op(logits: torch.Tensor, inv_t: float, entropy: bool,
                   chunk: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, s, a = _tile_stats(logits, inv_t, entropy, chunked.decode_chunk(chunk))
    return m, s, (a if a is not None else m.new_empty(0))


@_tile_stats_op.register_fake
def _(logits, inv_t, entropy, chunk):
    n, cd = logits.shape[0], chunked.compute_dtype(logits)
    return logits.new_empty(n, dtype=cd), logits.new_empty(n, dtype=cd), logits.new_empty(n if entropy else 0,
                                                                                            dtype=cd)


@torch.library.custom_op("pacs_fast::token_tile_grad", mutates_args=(),
                         schema="(Tensor logits, Tensor labels, Tensor m, Tensor log_s, Tensor ent, Tensor gl, "
                                "Tensor? gh, float inv_t, SymInt ignore_index, SymInt v_off, SymInt[] chunk) -> Tensor")
def _tile_grad_op(logits: torch.Tensor, labels: torch.Tensor, m: torch.Tensor, log_s: torch.Tensor,
                  ent: torch.Tensor, gl: torch.Tensor, gh: torch.Tensor | None, inv_t: float, ignore_index: int,
                  v_off: int, chunk: list[int]) -> torch.Tensor:
    grad = torch.empty_like(logits)
    _tile_grad(grad, logits, labels, m, log_s, ent, gl, gh, inv_t, ignore_index, v_off, chunked.decode_chunk(chunk))
    return grad


@_tile_grad_op.register_fake
def _(logits, labels, m, log_s, ent, gl, gh, inv_t, ignore_index, v_off, chunk):
    return torch.empty_like(logits)


def _resolve(backend, *tensors):
    """``resolve_backend``, except that float64 inputs (gradcheck, references) use the torch
    path under ``auto`` and are rejected by ``triton`` (the kernels compute in fp32)."""
    resolved = resolve_backend(backend, *tensors)
    if resolved == "triton" and any(t.dtype == torch.float64 for t in tensors):
        if backend == "auto":
            return "torch"
        raise ValueError("backend='triton' computes in fp32; float64 inputs need backend='torch'")
    return resolved


def _fill(logits, inv_t):
    """Tile producer: a view of the logits (inv_t == 1) or the scaled copy in ``out``."""
    def fill(n0, n1, v0, v1, out):
        src = logits[n0:n1, v0:v1]
        if inv_t == 1.0:
            return src
        out.copy_(src)  # (torch.mul(src, s, out=) would compute in bf16 for bf16 logits)
        return out.mul_(inv_t)
    return fill


def _empty(n, entropy, device):
    m = torch.full((n,), float("-inf"), device=device)
    z = torch.zeros(n, device=device)
    return m, z, (z.clone() if entropy else None)
