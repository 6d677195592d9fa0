"""Unbiased pass@k estimator (Chen et al. 2021, "Evaluating Large Language Models Trained on Code")."""
from __future__ import annotations

import numpy as np


def pass_at_k(n, c, k):
    """Unbiased estimate of pass@k: ``1 - C(n - c, k) / C(n, k)``.

    Args:
        n: samples drawn per problem (int or array of ints).
        c: correct samples per problem (int or array, ``0 <= c <= n``).
        k: budget (int or array, ``1 <= k <= n``).
    Returns:
        float64 numpy array (0-d for scalar inputs) broadcast over ``n, c, k``.

    Computed as ``1 - prod_{i=n-c+1}^{n} (1 - k / i)`` in log space, which is exact in exact
    arithmetic and stable for n = 512 and beyond (no binomial coefficients are formed).
    """
    n, c, k = np.broadcast_arrays(np.asarray(n), np.asarray(c), np.asarray(k))
    if n.size == 0:  # (empty lists are float64 arrays: "must be integers" had named the wrong thing)
        return np.empty(n.shape, dtype=np.float64)
    if not (np.issubdtype(n.dtype, np.integer) and np.issubdtype(c.dtype, np.integer)
            and np.issubdtype(k.dtype, np.integer)):
        raise ValueError("pass_at_k: n, c and k must be integers")
    if np.any(n < 1):
        raise ValueError("pass_at_k: n must be >= 1")
    if np.any((c < 0) | (c > n)):
        raise ValueError("pass_at_k: c must satisfy 0 <= c <= n")
    if np.any((k < 1) | (k > n)):
        raise ValueError("pass_at_k: k must satisfy 1 <= k <= n")
    out = np.empty(n.shape, dtype=np.float64)
    flat_n, flat_c, flat_k, flat_out = n.ravel(), c.ravel(), k.ravel(), out.ravel()
    for idx in range(flat_n.size):
        ni, ci, ki = int(flat_n[idx]), int(flat_c[idx]), int(flat_k[idx])
        if ni - ci < ki:
            flat_out[idx] = 1.0
            continue
        i = np.arange(ni - ci + 1, ni + 1, dtype=np.float64)
        flat_out[idx] = -np.expm1(np.sum(np.log1p(-ki / i))) + 0.0  # + 0.0: c = 0 gives 0.0, not -0.0
    return out.reshape(n.shape)
