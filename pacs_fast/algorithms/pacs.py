"""PACS (arXiv 2509.02522): RLVR as supervised learning of the verifier's label.

The policy's own log-probabilities define a reward *proxy* ``r_i`` per response, a group *score*
``psi_i`` compares it with the other responses to the same prompt, and the loss is a class-balanced
binary cross-entropy between ``sigmoid(psi_i)`` and the verifier reward ``R_i``:

    L = (1/B) * sum_i w_i * (softplus(psi_i) - R_i * psi_i)

Exact semantics (masked sums, unbiased std, eps) are in the docstrings below. Everything here is
plain differentiable PyTorch (any device); ``pacs_loss(backend="triton")``
dispatches to the fused kernel in :mod:`pacs_fast.ops.pacs_loss`, which has the same contract.

Layouts. *Padded*: ``logp``/``logp_ref``/``mask`` are ``[B, T]``. *Packed* (varlen): pass
``cu_seqlens`` (int ``[B+1]``, ``cu_seqlens[0] == 0``, non-decreasing, ``cu_seqlens[-1] ==
total_tokens``); ``logp``/``logp_ref``/``mask`` are then 1-D ``[total_tokens]`` and sequence ``i``
owns tokens ``cu_seqlens[i]:cu_seqlens[i+1]``. ``mask`` may be ``None`` (every token counts).
These offsets are checked on CPU tensors; on a GPU only with ``PACS_FAST_DEBUG_CHECKS=1`` (the check
would be a host sync, as for the fused kernel), never inside ``torch.compile``. The packed layout
is differentiable once (its per-sequence sums are ``torch.segment_reduce``, which has no double
backward; ``torch.func.grad`` works); the padded layout also takes a ``create_graph=True`` backward.
Groups are ``group_size`` contiguous rows (sequences).

Dtypes. Inputs may be any float dtype; computation is fp32 (fp64 when the input is fp64) and the
returned loss and terms have that compute dtype.
"""
from __future__ import annotations

import torch

from pacs_fast.algorithms._checks import (
    check_choice,
    check_finite_values,
    check_group_size,
    check_mask,
    check_real,
    check_same_shape,
    check_tensor,
    compute_dtype,
    mask_nonzero,
    mask_select,
)
from pacs_fast.algorithms._stable import bce_with_logits, centred_in_groups

SCORES = ("rloo", "grpo", "dr_grpo", "naive")
# the scores that compare a response with the rest of its group: undefined or identically 0 (no gradient) for a
# group of one (dr_grpo: psi = r - mean = 0), so they need G >= 2
GROUP_SCORES = ("rloo", "grpo", "dr_grpo")
WEIGHT_MODES = ("question", "none", "only_positive", "only_negative")
PROXIES = ("logratio", "mean_logp")
BACKENDS = ("torch", "triton", "auto")
GRPO_EPS = 1e-6
TERM_KEYS = ("proxy", "score", "pred_reward", "weight", "sample_loss")


# --------------------------------------------------------------------------------------------
# validation


def _check_tokens(fn: str, logp, logp_ref, mask, cu_seqlens, *, need_ref: bool) -> int:
    """Checks the token tensors of either layout and returns the number of sequences B."""
    if cu_seqlens is None:
        check_tensor(fn, "logp", logp, ndim=2, floating=True)
        num_rows = logp.shape[0]
    else:
        check_tensor(fn, "cu_seqlens", cu_seqlens, ndim=1)
        if cu_seqlens.is_floating_point() or cu_seqlens.dtype == torch.bool or cu_seqlens.is_complex():
            raise ValueError(f"{fn}: cu_seqlens must be an integer tensor, got {cu_seqlens.dtype}")
        if cu_seqlens.numel() < 2:
            raise ValueError(f"{fn}: cu_seqlens must have B+1 >= 2 entries, got {cu_seqlens.numel()}")
        check_tensor(fn, "logp", logp, ndim=1, floating=True)
        if cu_seqlens.device != logp.device:
            raise ValueError(f"{fn}: cu_seqlens is on {cu_seqlens.device} but logp is on {logp.device}")
        num_rows = cu_seqlens.numel() - 1
        if _values_checked(cu_seqlens):  # a wrong cu_seqlens would otherwise give silently wrong sums
            _check_offsets(fn, cu_seqlens, logp)
    if need_ref:
        check_tensor(fn, "logp_ref", logp_ref, floating=True)
        check_same_shape(fn, "logp_ref", logp_ref, "logp", logp)
    elif logp_ref is not None:
        check_tensor(fn, "logp_ref", logp_ref, floating=True)
        check_same_shape(fn, "logp_ref", logp_ref, "logp", logp)
    if mask is not None:
        check_mask(fn, mask, logp, "logp")
    return num_rows


def _values_checked(t: torch.Tensor) -> bool:
    """Whether checks that read device values run: on CPU tensors (free), or anywhere with
    ``PACS_FAST_DEBUG_CHECKS=1``; never while ``torch.compile`` traces (data-dependent) or on ``meta``.
    On a GPU the default costs no host sync, as the fused kernel (kernels/dispatch.py)."""
    if t.device.type == "meta" or torch.compiler.is_compiling():
        return False
    if t.device.type == "cpu":
        return True
    from pacs_fast.kernels.dispatch import debug_checks

    return debug_checks()


def _check_offsets(fn: str, cu_seqlens: torch.Tensor, logp: torch.Tensor) -> None:
    bad = (cu_seqlens[0] != 0) | (cu_seqlens[-1] != logp.numel()) | (cu_seqlens.diff() < 0).any()
    if bool(bad):
        raise ValueError(f"{fn}: cu_seqlens must start at 0, be non-decreasing and end at "
                         f"logp.numel()={logp.numel()}; got {cu_seqlens.tolist()[:8]}...")


def _check_rewards(fn: str, rewards, num_rows: int, rows_from: str, device: torch.device) -> None:
    check_tensor(fn, "rewards", rewards, ndim=1)
    if rewards.is_complex():
        raise ValueError(f"{fn}: rewards must be real, got {rewards.dtype}")
    if rewards.device != device:
        raise ValueError(f"{fn}: rewards is on {rewards.device} but logp is on {device}")
    if rewards.shape[0] != num_rows:
        raise ValueError(f"{fn}: rewards has {rewards.shape[0]} entries but {rows_from} describes "
                         f"{num_rows} sequences")


# --------------------------------------------------------------------------------------------
# pieces (no validation; the public wrappers below validate)


def _row_sums(x: torch.Tensor, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """Per-sequence sums: ``x[B,T] -> [B]`` or packed ``x[N] -> [B]`` (segment sum, no Python loop)."""
    if cu_seqlens is None:
        return x.sum(-1)
    # cu_seqlens has been validated, so skip the op's own (synchronising) check; segment_reduce takes
    # int32 / int64 offsets only (int16 / int8 / uint8 raised NotImplementedError; the fused kernel casts)
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        cu_seqlens = cu_seqlens.long()
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float16, torch.bfloat16):
        # the CPU kernel sums each segment in one sequential pass (the padded .sum is pairwise): at 32k tokens
        # fp32 kept 140x its rounding (8.7e-6 relative for 6.1e-8); in float64 it costs little here (CUDA: CUB)
        return torch.segment_reduce(x.double(), "sum", offsets=cu_seqlens, unsafe=True).to(x.dtype)
    return torch.segment_reduce(x, "sum", offsets=cu_seqlens, unsafe=True)


def _reward_proxy(logp, logp_ref, mask, beta, proxy, cu_seqlens) -> torch.Tensor:
    dtype = compute_dtype(logp)
    x = logp.to(dtype)
    if proxy == "logratio":
        x = x - logp_ref.detach().to(dtype)
        return beta * _row_sums(mask_select(x, mask), cu_seqlens)
    # mean_logp: masked mean; rows with no response tokens get r = 0 (and zero gradient).
    num = _row_sums(mask_select(x, mask), cu_seqlens)
    if mask is None:
        ones = torch.ones_like(x, dtype=dtype)
        den = _row_sums(ones, cu_seqlens)
    else:
        den = _row_sums(mask_select(torch.ones_like(x, dtype=dtype), mask.detach()), cu_seqlens)
    empty = den == 0
    return beta * num / torch.where(empty, 1.0, den)  # num is exactly 0 on empty rows


def _safe_sqrt(v: torch.Tensor) -> torch.Tensor:
    """sqrt with gradient 0 (the subgradient) at v == 0 instead of NaN."""
    pos = v > 0
    return torch.where(pos, torch.sqrt(torch.where(pos, v, 1.0)), 0.0)


def _group_scores(r: torch.Tensor, group_size: int, score: str, eps: float) -> torch.Tensor:
    if score == "naive":
        return r
    centered = centred_in_groups(r.reshape(-1, group_size))
    if score == "dr_grpo":
        out = centered
    elif score == "rloo":
        # r_i - (S - r_i)/(G-1) == G/(G-1) * (r_i - mean)
        out = centered * (group_size / (group_size - 1))
    else:  # grpo: unbiased std
        std = _safe_sqrt((centered * centered).sum(dim=1, keepdim=True) / (group_size - 1))
        out = centered / (std + eps)
    return out.reshape(-1)


def _class_balanced_weights(rewards: torch.Tensor, group_size: int, weight_mode: str,
                            dtype: torch.dtype) -> torch.Tensor:
    R = rewards.detach().to(dtype)
    if weight_mode == "none":
        return torch.ones_like(R)
    if weight_mode == "only_positive":
        return R.clone()
    if weight_mode == "only_negative":
        return 1.0 - R
    g = R.reshape(-1, group_size)
    n_pos = g.sum(dim=1, keepdim=True)
    # summed, not G - n_pos: with soft rewards near 1 that difference cancels (fp32: n_neg = 1e-3 off by
    # 1e-4 relative, the weights as much); each 1 - R is exact for R >= 1/2
    n_neg = (1.0 - g).sum(dim=1, keepdim=True)
    mixed = (n_pos > 0) & (n_neg > 0)
    w = (g * (group_size / (2.0 * torch.where(mixed, n_pos, 1.0)))
         + (1.0 - g) * (group_size / (2.0 * torch.where(mixed, n_neg, 1.0))))
    return torch.where(mixed, w, 1.0).reshape(-1)


# --------------------------------------------------------------------------------------------
# public API


def reward_proxy(logp: torch.Tensor, logp_ref: torch.Tensor | None, mask: torch.Tensor | None, *,
                 beta: float = 1.0, proxy: str = "logratio",
                 cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """The PACS reward proxy ``r_i``, one per sequence.

    - ``"logratio"`` (paper eq. 8): ``r_i = beta * sum_t mask[i,t] * (logp[i,t] - logp_ref[i,t])``
    - ``"mean_logp"``: ``r_i = beta * sum_t mask[i,t] * logp[i,t] / sum_t mask[i,t]``; a row with no
      response tokens has ``r_i = 0`` (and zero gradient), never NaN. ``logp_ref`` is unused (may be None).

    Args:
        logp: ``[B, T]`` (or packed ``[N]``), any float dtype; differentiable.
        logp_ref: same shape; treated as a constant (detached).
        mask: same shape, bool or 0/1, or None (every token counts). Values at masked-out positions
            never reach the result, even NaN/Inf.
        cu_seqlens: int ``[B+1]`` for the packed layout (see module docstring).
    Returns:
        ``[B]`` tensor in the compute dtype (fp32, or fp64 for fp64 input).
    """
    fn = "reward_proxy"
    check_choice(fn, "proxy", proxy, PROXIES)
    beta = check_real(fn, "beta", beta, positive=True)  # 0: an exactly zero gradient; < 0: against the verifier
    _check_tokens(fn, logp, logp_ref, mask, cu_seqlens, need_ref=proxy == "logratio")
    return _reward_proxy(logp, logp_ref, mask, beta, proxy, cu_seqlens)


def group_scores(proxy: torch.Tensor, group_size: int, score: str = "rloo", *,
                 eps: float = GRPO_EPS) -> torch.Tensor:
    """Group score ``psi_i`` from the proxies of its group (contiguous rows of ``group_size``).

    - ``"rloo"``: ``psi_i = r_i - (S_g - r_i)/(G-1)`` with ``S_g`` the group sum (needs G >= 2)
    - ``"grpo"``: ``psi_i = (r_i - mean_g)/(std_g + eps)``, unbiased std (needs G >= 2). When a
      group's proxies are all equal the std's (undefined) gradient is taken as 0, so the result
      stays finite: ``d psi_i / d r_j = (delta_ij - 1/G)/eps`` there. With G = 2 the scores are
      ``+-1/sqrt(2)`` (up to eps) whatever the proxies, so they carry almost no gradient.
    - ``"dr_grpo"``: ``psi_i = r_i - mean_g``;  ``"naive"``: ``psi_i = r_i``

    Args:
        proxy: ``[B]`` float tensor (differentiable). Returns ``[B]`` in its dtype, computed in fp32
            (fp64 for fp64 input), as ``pacs_loss`` computes it.
        eps: > 0 (the grpo score's gradient at equal proxies is ``1/eps``).
    """
    fn = "group_scores"
    check_choice(fn, "score", score, SCORES)
    check_tensor(fn, "proxy", proxy, ndim=1, floating=True)
    group_size = check_group_size(fn, group_size, proxy.shape[0], "proxy")
    eps = check_real(fn, "eps", eps, positive=True)  # 0: 0 / 0 for equal proxies (every on-policy first step)
    if group_size == 1 and score in GROUP_SCORES:
        raise ValueError(f"{fn}: group_size=1 is not allowed with score={score!r} (needs G >= 2)")
    return _group_scores(proxy.to(compute_dtype(proxy)), group_size, score, eps).to(proxy.dtype)


def class_balanced_weights(rewards: torch.Tensor, group_size: int,
                           weight_mode: str = "question") -> torch.Tensor:
    """Per-sample weights ``w_i`` (paper 3.4.2; no gradient).

    - ``"question"``: in a group with both labels, ``w_i = G / (2 n_{R_i})`` with ``n_c`` the number
      of responses in the group with label ``c`` (sklearn's "balanced"); groups with a single label
      get ``w_i = 1``. Soft rewards ``R in [0, 1]`` count fractionally:
      ``n_1 = sum_g R_j``, ``n_0 = sum_g (1 - R_j)`` (= G - n_1) and
      ``w_i = R_i G/(2 n_1) + (1-R_i) G/(2 n_0)`` when ``0 < n_1 < G`` (identical to the above for 0/1
      rewards; the weights of a group still sum to G).
    - ``"none"``: 1;  ``"only_positive"``: ``R_i``;  ``"only_negative"``: ``1 - R_i``

    Args:
        rewards: ``[B]`` in ``[0, 1]`` (float, int or bool). Returns ``[B]`` (fp32, or fp64 for fp64 input).
    """
    fn = "class_balanced_weights"
    check_choice(fn, "weight_mode", weight_mode, WEIGHT_MODES)
    check_tensor(fn, "rewards", rewards, ndim=1)
    group_size = check_group_size(fn, group_size, rewards.shape[0], "rewards")
    dtype = compute_dtype(rewards) if rewards.is_floating_point() else torch.float32
    return _class_balanced_weights(rewards, group_size, weight_mode, dtype)


def pacs_loss(logp: torch.Tensor, logp_ref: torch.Tensor | None, mask: torch.Tensor | None,
              rewards: torch.Tensor, *, group_size: int, beta: float = 1.0, score: str = "rloo",
              weight_mode: str = "question", proxy: str = "logratio", return_terms: bool = False,
              cu_seqlens: torch.Tensor | None = None, check_finite: bool = False,
              backend: str = "torch", sample_weights: torch.Tensor | None = None):
    """The PACS loss ``L = (1/B) sum_i w_i (softplus(psi_i) - R_i psi_i)`` (paper eq. 9).

    ``r = reward_proxy(...)``, ``psi = group_scores(r, ...)``, ``w = class_balanced_weights(R, ...)``.
    Gradient (rloo): with ``g_i = w_i (sigmoid(psi_i) - R_i) / B``,
    ``dL/dlogp[k,t] = beta * mask[k,t] * (G g_k - sum_{j in group} g_j) / (G-1)``.

    Args:
        logp: ``[B, T]`` policy log-probs of the sampled tokens (any float dtype; requires grad), or
            packed ``[N]`` with ``cu_seqlens``.
        logp_ref: same shape, reference log-probs (detached). Unused (may be None) for ``proxy="mean_logp"``.
        mask: same shape, bool or 0/1 (1 = response token), or None for "all tokens".
        rewards: ``[B]`` verifier rewards in ``[0, 1]`` (0/1 or soft).
        group_size: ``G``; rows ``[kG, (k+1)G)`` are the responses to one prompt. ``B % G == 0``.
        beta: proxy scale (> 0). score: rloo | grpo | dr_grpo | naive. weight_mode: question | none |
            only_positive | only_negative. proxy: logratio | mean_logp. ``score="grpo"`` divides by
            the group's std + 1e-6: where a group's proxies are equal (``logp == logp_ref``, the first
            mini-batch of an on-policy step) its gradient is ``(delta_ij - 1/G) / 1e-6``, ~1e6x rloo's
            (:func:`group_scores`); rloo (the default) has no such point.
        return_terms: also return a dict of detached ``[B]`` tensors with exactly the keys
            ``"proxy"`` (r), ``"score"`` (psi), ``"pred_reward"`` (sigmoid(psi)), ``"weight"`` (w) and
            ``"sample_loss"`` (``w_i (softplus(psi_i) - R_i psi_i)``, before the 1/B mean).
        cu_seqlens: int ``[B+1]`` for packed input (module docstring).
        check_finite: when True, raise ValueError naming the argument if ``logp``/``logp_ref`` hold
            NaN/Inf at unmasked positions, ``rewards`` hold NaN/Inf or values outside ``[0, 1]``, or
            ``sample_weights`` NaN/Inf or negative values (costs a device sync; off by default, then nothing is
            checked).
        backend: ``"torch"`` (this reference), ``"triton"`` (fused kernel) or ``"auto"`` (fused on CUDA).
        sample_weights: ``[B]`` constant factors of each sample's BCE term (off-policy correction: the
            sequence importance weight pi_old(y_i) / mu(y_i), 0 for a rejected sample; docs/OFF_POLICY.md),
            applied on top of ``w_i`` (and in ``terms["weight"]``); the mean stays over all B rows (the
            caller rescales for rejected rows). Torch backend only. None: 1.
    Returns:
        0-d loss in the compute dtype (fp32; fp64 for fp64 input), or ``(loss, terms)``.
    """
    fn = "pacs_loss"
    check_choice(fn, "score", score, SCORES)
    check_choice(fn, "weight_mode", weight_mode, WEIGHT_MODES)
    check_choice(fn, "proxy", proxy, PROXIES)
    check_choice(fn, "backend", backend, BACKENDS)
    beta = check_real(fn, "beta", beta, positive=True)  # 0: an exactly zero gradient; < 0: against the verifier
    num_rows = _check_tokens(fn, logp, logp_ref, mask, cu_seqlens, need_ref=proxy == "logratio")
    _check_rewards(fn, rewards, num_rows, "logp" if cu_seqlens is None else "cu_seqlens", logp.device)
    group_size = check_group_size(fn, group_size, num_rows, "rewards")  # numpy integers become int
    if group_size == 1 and score in GROUP_SCORES:
        raise ValueError(f"{fn}: group_size=1 is not allowed with score={score!r} (needs G >= 2)")
    if num_rows == 0:
        raise ValueError(f"{fn}: rewards is empty (B = 0)")
    if check_finite:
        where = mask_nonzero(mask)
        check_finite_values(fn, "logp", logp, where)
        if logp_ref is not None and proxy == "logratio":
            check_finite_values(fn, "logp_ref", logp_ref, where)
        check_finite_values(fn, "rewards", rewards)
        if rewards.device.type != "meta" and bool(((rewards < 0) | (rewards > 1)).any()):
            raise ValueError(f"{fn}: rewards must lie in [0, 1]")

    if sample_weights is not None:
        check_tensor(fn, "sample_weights", sample_weights, ndim=1, floating=True)
        if sample_weights.shape[0] != num_rows:
            raise ValueError(f"{fn}: sample_weights has {sample_weights.shape[0]} entries but there are {num_rows} rows")
        if backend == "triton":
            raise ValueError(f"{fn}: sample_weights needs backend='torch' (the fused kernel has no per-sample factor)")
        if check_finite:
            check_finite_values(fn, "sample_weights", sample_weights)
            if sample_weights.device.type != "meta" and bool((sample_weights < 0).any()):
                raise ValueError(f"{fn}: sample_weights must be >= 0 (importance weights; 0 rejects a sample)")
        backend = "torch"
    asked = backend
    if backend != "torch":
        from pacs_fast.ops.backend import resolve_backend

        backend = resolve_backend(backend, logp)
    if backend == "triton":
        from pacs_fast.kernels import dispatch

        if dispatch.broken("tiles", "PACS loss forward"):  # failed earlier in this process (warned then)
            backend = "torch"
        else:
            try:  # the fused kernels' modules: an import error of theirs is a kernel failure (one warning)
                from pacs_fast.kernels.pacs_loss import MAX_GROUP_SIZE
                from pacs_fast.ops.pacs_loss import fused_pacs_loss
            except Exception as e:
                dispatch.failed("tiles", "PACS loss forward", e)
                backend = "torch"
    if backend == "triton" and asked == "auto" and group_size > MAX_GROUP_SIZE:
        backend = "torch"  # the fused kernel's limit: "auto" takes the torch path
    if backend == "triton":
        from pacs_fast.kernels.dispatch import KernelFailed

        try:
            return fused_pacs_loss(logp, logp_ref, mask, rewards, group_size=group_size, beta=beta,
                                   score=score, weight_mode=weight_mode, proxy=proxy,
                                   return_terms=return_terms, cu_seqlens=cu_seqlens,
                                   check_finite=False)
        except KernelFailed:  # the kernel cannot run here (warned once): the torch path below
            pass

    r = _reward_proxy(logp, logp_ref, mask, beta, proxy, cu_seqlens)
    psi = _group_scores(r, group_size, score, GRPO_EPS)
    w = _class_balanced_weights(rewards, group_size, weight_mode, r.dtype)
    if sample_weights is not None:
        w = w * sample_weights.detach().to(w.dtype)
    R = rewards.detach().to(r.dtype)
    sample_loss = w * bce_with_logits(psi, R)  # softplus(psi) - R psi without its cancellation
    loss = sample_loss.sum() / num_rows
    if not return_terms:
        return loss
    terms = {
        "proxy": r.detach(),
        "score": psi.detach(),
        "pred_reward": torch.sigmoid(psi.detach()),
        "weight": w,
        "sample_loss": sample_loss.detach(),
    }
    return loss, terms
