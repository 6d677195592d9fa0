"""Corrections for a noisy verifier (arXiv 2510.00915 for the baselines; Natarajan et al. 2013 and
Patrini et al. 2017 for PACS's binary cross-entropy). Derivations: docs/EFFICACY.md.

Noise model: the verifier reports ``R~`` instead of the true label ``R`` in {0, 1}, independently
per response, with ``rho0 = P(R~=1 | R=0)`` (false-positive rate) and ``rho1 = P(R~=0 | R=1)``
(false-negative rate), ``rho0 + rho1 < 1``. Write ``D = 1 - rho0 - rho1``.

Baselines (policy-gradient family):

- backward: the surrogate reward ``R^ = (R~ - rho0) / D`` is unbiased, ``E[R^ | R] = R``; any
  estimator linear in the rewards (REINFORCE, RLOO, Dr. GRPO advantages) becomes unbiased for the
  clean one. GRPO's std normalisation makes the advantage invariant to affine maps of the rewards,
  so for GRPO the backward correction changes nothing (up to its eps).
- forward: the rewards are replaced by the weights ``w(R~=1) = rho1``, ``w(R~=0) = rho1 - 1``
  (i.e. ``R~ - (1 - rho1)``); ``E[w | R] = -D (1 - R)``, so the expected REINFORCE update is ``D``
  times the clean one: the same direction, knowing ``rho1`` only. Under a group baseline a constant
  shift cancels: forward = no correction for RLOO / Dr. GRPO / GRPO advantages (documented, tested).

PACS (supervised learning of the label with ``l(psi, y) = softplus(psi) - y psi``):

- backward: ``l`` is linear in ``y``, so Natarajan's unbiased loss
  ``[(1 - rho_{1-y~}) l(psi, y~) - rho_{y~} l(psi, 1 - y~)] / D`` (``rho_c``: the flip rate of
  true class c) equals ``l(psi, (y~ - rho0) / D)``:
  the BCE with the surrogate label ``R^``; ``E[l(psi, R^) | R] = l(psi, R)`` exactly (and so the
  gradient, for fixed class weights).
- forward: the BCE of the *noisy* label against the noisy-channel prediction
  ``q = rho0 + D sigmoid(psi)``; its expected gradient in ``psi`` is
  ``D^2 p (1 - p) / (q (1 - q)) * (p - R)`` with ``p = sigmoid(psi)``: per sample a positive
  multiple of the clean one, with the same zero.

The class weights (``algo.weight=question``) are computed from the observed labels; with them the
backward identity holds for the weights as given (they are not themselves de-noised).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from pacs_fast.algorithms._stable import bce_with_logits

CORRECTIONS = ("none", "backward", "forward")


def check_rates(rho0: float, rho1: float, *, what: str = "noise rates") -> None:
    """Rejects rates outside ``[0, 1)`` or with ``rho0 + rho1 >= 1`` (labels carry no signal)."""
    for name, v in (("rho0", rho0), ("rho1", rho1)):
        if not 0.0 <= float(v) < 1.0:
            raise ValueError(f"{what}: {name} must be in [0, 1), got {v}")
    if rho0 + rho1 >= 1.0:
        raise ValueError(f"{what}: rho0 + rho1 must be < 1 (got {rho0} + {rho1}); the labels carry no signal")


def backward_rewards(noisy: torch.Tensor, rho0: float, rho1: float) -> torch.Tensor:
    """``(R~ - rho0) / (1 - rho0 - rho1)``: unbiased surrogate rewards ``[B]`` (same dtype; may lie
    outside [0, 1])."""
    check_rates(rho0, rho1)
    return (noisy - rho0) / (1.0 - rho0 - rho1)


def forward_rewards(noisy: torch.Tensor, rho1: float) -> torch.Tensor:
    """The forward-correction weights ``rho1`` (label 1) and ``rho1 - 1`` (label 0) as rewards
    ``[B]``, i.e. ``R~ - (1 - rho1)`` (for 0/1 labels)."""
    check_rates(0.0, rho1)
    return noisy - (1.0 - rho1)


def corrected_rewards(noisy: torch.Tensor, correction: str, rho0: float, rho1: float) -> torch.Tensor:
    """The rewards a baseline trains on under ``correction`` (none | backward | forward)."""
    if correction == "none":
        return noisy
    if correction == "backward":
        return backward_rewards(noisy, rho0, rho1)
    if correction == "forward":
        return forward_rewards(noisy, rho1)
    raise ValueError(f"noise correction must be one of {', '.join(CORRECTIONS)}; got {correction!r}")


def bce_backward(psi: torch.Tensor, noisy: torch.Tensor, rho0: float, rho1: float) -> torch.Tensor:
    """Per-sample backward-corrected BCE ``[B]``: ``softplus(psi) - R^ psi`` with ``R^`` the
    surrogate label (unbiased for the clean BCE)."""
    return bce_with_logits(psi, backward_rewards(noisy.to(psi.dtype), rho0, rho1))


def bce_forward(psi: torch.Tensor, noisy: torch.Tensor, rho0: float, rho1: float) -> torch.Tensor:
    """Per-sample forward-corrected BCE ``[B]``: ``-[y~ log q + (1 - y~) log(1 - q)]`` with
    ``q = rho0 + (1 - rho0 - rho1) sigmoid(psi)``, computed in log space (stable for large |psi|):
    ``log q = logaddexp(log rho0, log D + logsigmoid(psi))`` and likewise for ``1 - q``."""
    check_rates(rho0, rho1)
    D = 1.0 - rho0 - rho1
    y = noisy.to(psi.dtype)
    log_d = torch.log(torch.tensor(D, dtype=psi.dtype, device=psi.device))

    def log_mix(rho, logp):  # log(rho + D * p), rho may be 0
        if rho == 0:
            return log_d + logp
        return torch.logaddexp(torch.log(torch.tensor(rho, dtype=psi.dtype, device=psi.device)), log_d + logp)

    log_q = log_mix(rho0, F.logsigmoid(psi))
    log_1mq = log_mix(rho1, F.logsigmoid(-psi))
    return -(y * log_q + (1.0 - y) * log_1mq)


def corrected_bce(psi: torch.Tensor, noisy: torch.Tensor, correction: str, rho0: float,
                  rho1: float) -> torch.Tensor:
    """Per-sample PACS BCE ``[B]`` under ``correction`` (none | backward | forward)."""
    if correction == "none":
        return bce_with_logits(psi, noisy.to(psi.dtype))
    if correction == "backward":
        return bce_backward(psi, noisy, rho0, rho1)
    if correction == "forward":
        return bce_forward(psi, noisy, rho0, rho1)
    raise ValueError(f"noise correction must be one of {', '.join(CORRECTIONS)}; got {correction!r}")


def pacs_loss_noisy(logp: torch.Tensor, logp_ref: torch.Tensor | None, mask: torch.Tensor | None,
                    rewards: torch.Tensor, *, group_size: int, correction: str, rho0: float, rho1: float,
                    beta: float = 1.0, score: str = "rloo", weight_mode: str = "question",
                    proxy: str = "logratio", sample_weights: torch.Tensor | None = None):
    """The PACS loss with a noisy-label correction of its BCE: ``(1/B) sum_i w_i l~(psi_i, R~_i)``.

    Same arguments and returned terms as :func:`pacs_fast.algorithms.pacs_loss` (padded layout,
    torch path) with ``return_terms=True``; ``rewards`` are the observed (noisy) 0/1 labels and the
    class weights are computed from them. ``sample_weights``: ``[B]`` constant factors of each
    sample's corrected BCE term, as in ``pacs_loss`` (the off-policy correction's sequence importance
    weight, 0 for a rejected sample). The two corrections compose: the importance weight turns the
    expectation over the rollout policy into one over the training policy, the corrected BCE the
    expectation over the label noise into the clean BCE. Returns ``(loss, terms)``.
    """
    from pacs_fast.algorithms.pacs import class_balanced_weights, group_scores, reward_proxy

    r = reward_proxy(logp, logp_ref, mask, beta=beta, proxy=proxy)
    psi = group_scores(r, group_size, score)
    w = class_balanced_weights(rewards, group_size, weight_mode).to(r.dtype)
    if sample_weights is not None:
        if sample_weights.shape != (r.shape[0],):
            raise ValueError(f"pacs_loss_noisy: sample_weights has shape {tuple(sample_weights.shape)}, "
                             f"expected ({r.shape[0]},): one factor per row")
        w = w * sample_weights.detach().to(w.dtype)
    sample_loss = w * corrected_bce(psi, rewards.detach(), correction, rho0, rho1)
    loss = sample_loss.sum() / r.shape[0]
    terms = {"proxy": r.detach(), "score": psi.detach(), "pred_reward": torch.sigmoid(psi.detach()),
             "weight": w, "sample_loss": sample_loss.detach()}
    return loss, terms
