"""The checks of the algorithms' own settings that the baselines added beside PACS: verl's loss modes (GMPO / SAPO
aggregate per sequence, KL-Cov with the entropy mask, Clip-Cov's band) and the reset of a fixed reference
(``algo.reset_every`` / ``algo.reset_mix``). Each raises a ValueError naming the key, before any model loads
(called by :func:`pacs_fast.config.validation.validate`)."""
from __future__ import annotations

from pacs_fast.config.schema import Config


def validate_loss_modes(cfg: Config) -> None:
    """verl's loss modes: settings they cannot take."""
    if cfg.algo.name in ("gmpo", "sapo") and cfg.algo.loss_agg not in ("auto", "seq-mean-token-mean"):
        verl_name = {"gmpo": "geo_mean"}.get(cfg.algo.name, cfg.algo.name)
        raise ValueError(f"algo.name={cfg.algo.name} aggregates per sequence (verl's {verl_name} takes no other mode): "
                         f"algo.loss_agg must be auto or seq-mean-token-mean, got {cfg.algo.loss_agg}")
    if cfg.algo.name == "gmpo" and cfg.algo.entropy_top_frac < 1.0:
        raise ValueError(f"algo.entropy_top_frac={cfg.algo.entropy_top_frac} passes a 0/1 token mask, which GMPO takes "
                         f"as its geometric mean per sequence (verl's, for the importance weights): ~0 for every "
                         f"sequence that drops a token, so nothing trains; not with algo.name=gmpo (set "
                         f"algo.entropy_top_frac=1)")
    if cfg.algo.name == "kl_cov" and cfg.algo.entropy_top_frac < 1.0:
        raise ValueError(f"algo.entropy_top_frac={cfg.algo.entropy_top_frac} keeps every per-token term on the "
                         f"high-entropy tokens only, KL-Cov's penalty included, which falls on the confident (low-"
                         f"entropy) tokens it is for: not with algo.name=kl_cov (set algo.entropy_top_frac=1)")
    if cfg.algo.name == "dro" and cfg.algo.entropy_top_frac < 1.0:
        raise ValueError(f"algo.entropy_top_frac={cfg.algo.entropy_top_frac} keeps every per-token term on the "
                         f"high-entropy tokens only, DRO's quadratic pull to the rollout policy included (it left "
                         f"the other tokens free to drift): not with algo.name=dro (set algo.entropy_top_frac=1)")
    if cfg.algo.name == "dro" and not cfg.algo.dro_beta > 0:
        raise ValueError(f"algo.name=dro needs algo.dro_beta > 0 (the coefficient of its quadratic penalty "
                         f"beta / 2 (logp - old_logp)^2; verl's dro_beta has no default), got {cfg.algo.dro_beta}")
    if cfg.algo.name == "clip_cov" and not cfg.algo.cov_low < cfg.algo.cov_high:
        raise ValueError(f"algo.cov_low must be below algo.cov_high (Clip-Cov draws the tokens it cuts from the open "
                         f"band between them), got {cfg.algo.cov_low} and {cfg.algo.cov_high}")


def validate_reset(cfg: Config) -> None:
    """``algo.reset_every`` needs a fixed reference to reset; ``algo.reset_mix`` is a weight in (0, 1]."""
    a = cfg.algo
    if not (0.0 < a.reset_mix <= 1.0):  # NaN fails too
        raise ValueError(f"algo.reset_mix must be in (0, 1] (the policy's weight in the new reference; 1 = a hard "
                         f"reset), got {a.reset_mix}")
    if not a.reset_every:
        return
    if a.name == "pacs" and a.ref != "fixed":
        raise ValueError(f"algo.reset_every={a.reset_every} resets a fixed reference and needs algo.ref=fixed "
                         f"(algo.ref={a.ref}: the reference is already the rollout policy at every step)")
    if a.name != "pacs" and not a.kl_coef:
        raise ValueError(f"algo.reset_every={a.reset_every} resets the KL penalty's reference and needs "
                         f"algo.kl_coef > 0 (algo.name={a.name} keeps no reference without it)")
    if a.reset_mix < 1.0 and cfg.model.lora_rank:
        raise ValueError(f"algo.reset_mix={a.reset_mix} mixes whole weights, which LoRA adapters cannot hold "
                         f"(a mix of two adapter pairs is not the mix of their products); use algo.reset_mix=1 "
                         f"with model.lora_rank")
