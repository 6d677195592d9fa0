"""What stands at masked-out (padding) positions never reaches a loss or a gradient: the baselines' losses
(policy_loss with its KL penalty, gspo, cispo, value_loss) with NaN / +-Inf at every masked position of every
input give the loss of clean inputs and a gradient that is exactly 0 there (the hostile sweep of
2026-11-28: cispo with NaN in old_logp at padding gave grad [-0.55, -0.5, nan], and the others likewise
through advantages, token_weights, logp_ref or the value inputs; pacs_loss already held)."""
import pytest
import torch

from pacs_fast.algorithms import cispo_policy_loss, gspo_policy_loss, policy_loss, value_loss

B, T = 4, 6


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 3, 1, 4])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    return dict(mask=mask, logp=logp, old_logp=logp + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64),
                advantages=torch.randn(B, T, generator=g, dtype=torch.float64),
                token_weights=0.5 + torch.rand(B, T, generator=g, dtype=torch.float64),
                logp_ref=logp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64))


def _poison(x, mask, value):
    return torch.where(mask, x, torch.full_like(x, value))


LOSSES = {
    "ppo_kl": lambda logp, d: policy_loss(logp, d["old_logp"], d["advantages"], d["mask"], kl_coef=0.1,
                                          logp_ref=d["logp_ref"], token_weights=d["token_weights"])[0],
    "gspo_kl": lambda logp, d: gspo_policy_loss(logp, d["old_logp"], d["advantages"], d["mask"], kl_coef=0.1,
                                                logp_ref=d["logp_ref"], token_weights=d["token_weights"])[0],
    "cispo_kl": lambda logp, d: cispo_policy_loss(logp, d["old_logp"], d["advantages"], d["mask"], kl_coef=0.1,
                                                  logp_ref=d["logp_ref"], token_weights=d["token_weights"])[0],
    "value": lambda v, d: value_loss(v, d["old_logp"], d["logp_ref"], d["mask"])[0],
}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float64])
def test_padding_never_reaches_the_loss_or_its_gradient(name, bad, mask_dtype, seed):
    clean = _inputs(seed % 1000)
    mask = clean["mask"]
    dirty = {k: (v if k == "mask" else _poison(v, mask, bad)) for k, v in clean.items()}
    clean["mask"] = dirty["mask"] = mask.to(mask_dtype)
    out = {}
    for label, d in (("clean", clean), ("dirty", dirty)):
        x = d["logp"].clone().requires_grad_(True)
        loss = LOSSES[name](x, d)
        (grad,) = torch.autograd.grad(loss, x)
        out[label] = (loss.detach(), grad)
    (l0, g0), (l1, g1) = out["clean"], out["dirty"]
    assert torch.isfinite(l1) and torch.equal(l1, l0), (l0, l1)
    assert torch.isfinite(g1).all() and torch.equal(g1, g0)
    assert bool((g1[~mask] == 0).all())
