"""Per-token estimators of KL(pi || pi_ref) from samples of pi (Schulman, "Approximating KL divergence").

With ``d = logp_ref - logp`` (the log-ratio ref/policy at the sampled token):

- ``"k1"``: ``-d = logp - logp_ref`` (unbiased, high variance, can be negative)
- ``"k2"``: ``d**2 / 2`` (biased, low variance)
- ``"k3"``: ``exp(d) - d - 1`` (unbiased, low variance, >= 0; verl's "low_var_kl")
- ``"k1+"`` / ``"k3+"``: k1's / k3's value with k2's gradient (a straight-through estimate, verl's ``k1+`` /
  ``k3+``): as a loss term, k1 and k3 give a gradient whose expectation is not the KL's (k1's is 0), and k2's is
  the KL's own (``tests/test_kl_estimator.py``); the value stays the unbiased estimate that the logs report
"""
from __future__ import annotations

import torch

from pacs_fast.algorithms._checks import (
    check_choice,
    check_real,
    check_same_shape,
    check_tensor,
    compute_dtype,
)
from pacs_fast.algorithms._stable import k3

KL_ESTIMATORS = ("k1", "k2", "k3", "k1+", "k3+")
LOG_RATIO_CLAMP = 20.0


def _kl_penalty(logp, logp_ref, estimator, clamp):
    dtype = compute_dtype(logp)
    d = logp_ref.detach().to(dtype) - logp.to(dtype)
    if estimator.endswith("+"):  # the value of k1 / k3, the gradient of k2
        k2 = 0.5 * d * d
        return k2 - k2.detach() + _kl_penalty(logp, logp_ref, estimator[:-1], clamp).detach()
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    if clamp is not None:
        d = d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    kl = k3(d)  # e^d - 1 - d, accurate at small d (algorithms/_stable.py)
    if clamp is not None:
        kl = kl.clamp(-clamp, clamp)
    return kl


def kl_penalty(logp: torch.Tensor, logp_ref: torch.Tensor, estimator: str = "k3", *,
               clamp: float | None = None) -> torch.Tensor:
    """Per-token KL estimate (elementwise; shapes ``[B, T]`` or any matching shapes).

    Args:
        logp: policy log-probs of the sampled tokens (differentiable; any float dtype).
        logp_ref: reference log-probs, same shape (detached).
        estimator: ``"k1"``, ``"k2"``, ``"k3"``, ``"k1+"`` or ``"k3+"`` (module docstring).
        clamp: k3 and k3+ only (the value; k3+'s gradient is k2's, unclamped, as verl's). When given, the
            log-ratio is clamped to ``[-20, 20]`` and the estimate to ``[-clamp, clamp]`` (verl's low_var_kl uses
            ``clamp=10``); this bounds the value and the gradient when the policy has moved far from the
            reference. None: the exact estimator.
    Returns:
        Tensor of the input shape in the compute dtype (fp32; fp64 for fp64 input). Not masked:
        aggregate it with :func:`~pacs_fast.algorithms.aggregation.aggregate_loss`.
    """
    fn = "kl_penalty"
    check_choice(fn, "estimator", estimator, KL_ESTIMATORS)
    check_tensor(fn, "logp", logp, floating=True)
    check_tensor(fn, "logp_ref", logp_ref, floating=True)
    check_same_shape(fn, "logp_ref", logp_ref, "logp", logp)
    if clamp is not None:
        if estimator not in ("k3", "k3+"):
            raise ValueError(f"{fn}: clamp only applies to estimator='k3' or 'k3+', got estimator={estimator!r}")
        clamp = check_real(fn, "clamp", clamp, positive=True)
    return _kl_penalty(logp, logp_ref, estimator, clamp)
