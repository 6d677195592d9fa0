"""Statistics of PACS's score psi and of sigmoid(psi) as a predictor of the verifier's reward, under the names every
caller records (``pacs/*``): the trainer's step record (:mod:`pacs_fast.trainer.step`) and the TRL / verl / OpenRLHF
adapters (:mod:`pacs_fast.integrations`).
"""
from __future__ import annotations

import torch


def score_metrics(psi: torch.Tensor, pred_reward: torch.Tensor, rewards: torch.Tensor,
                  proxy: torch.Tensor) -> dict[str, float]:
    """``pacs/psi_mean`` / ``_std``, ``pacs/pred_reward_mean`` / ``_std``, ``pacs/brier``, ``pacs/calib_gap``,
    ``pacs/pred_reward_pos`` / ``_neg`` (the rows with R > 0.5 / R <= 0.5, as ``reward/acc`` counts them; NaN
    without such rows) and ``pacs/proxy_abs_mean``, from ``[rows]`` tensors: the score, sigmoid(score), the
    reward R each row is calibrated against and the reward proxy. Rows whose score is NaN (left out of the
    loss, e.g. truncated rows) are left out here too."""
    keep = torch.isfinite(psi)
    psi, pred = psi.detach().double()[keep], pred_reward.detach().double()[keep]
    R, proxy = rewards.detach().double()[keep], proxy.detach().double()[keep]
    out = {}
    for name, x in (("psi", psi), ("pred_reward", pred)):
        out[f"pacs/{name}_mean"] = float(x.mean())
        # one row: no spread (0); no row (every score NaN): as undefined as the mean beside it
        out[f"pacs/{name}_std"] = float(x.std()) if x.numel() > 1 else 0.0 if x.numel() else float("nan")
    out["pacs/brier"] = float(((pred - R) ** 2).mean())
    out["pacs/calib_gap"] = float((pred.mean() - R.mean()).abs())
    for sel, name in ((R > 0.5, "pos"), (R <= 0.5, "neg")):
        out[f"pacs/pred_reward_{name}"] = float(pred[sel].mean()) if bool(sel.any()) else float("nan")
    out["pacs/proxy_abs_mean"] = float(proxy.abs().mean())
    return out
