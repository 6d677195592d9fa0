"""``algo.kl_estimator`` / ``algo.kl_clamp``: which per-token estimate of KL(pi || pi_ref) the baselines' KL
penalty (``algo.kl_coef``) uses (k1, k2, k3; verl's ``kl_loss_type`` kl / mse / low_var_kl, OpenRLHF's
``kl_estimator``), and verl's low_var_kl clamp.

- The objective of every baseline that takes a KL term equals the loss op called with that estimator (the
  same computation: bit for bit), and each estimator's KL term is the float64 formula's, with its gradient.
- k2's gradient is the KL's own: its expectation under the sampling policy is ``grad KL(pi || pi_ref)``
  (checked exactly on a small categorical policy, over every token with its probability).
- Settings it cannot take are one line; the keys are named unused where nothing reads them.
"""
import pytest
import torch

from pacs_fast.config import AlgoConfig, load_config, unused_settings, validate

from test_correction_wiring import _batch
from test_entropy_selection import _grads


def _loss(algo, batch, logp0):
    return _grads(algo, batch, logp0, None)


@pytest.mark.parametrize("name", ["grpo", "rloo", "dr_grpo", "gspo", "cispo"])
def test_the_objective_uses_the_estimator_it_is_given(seed, name):
    gen = torch.Generator().manual_seed(seed)
    batch = _batch(gen)
    mask = batch.response_mask
    batch.ref_logp = batch.old_logp - 0.3 * torch.rand(mask.shape, generator=gen, dtype=torch.float64) * mask
    logp0 = batch.old_logp + 0.05 * torch.randn(mask.shape, generator=gen, dtype=torch.float64) * mask
    coef = 0.25
    no_kl, no_kl_grad, _ = _loss(AlgoConfig(name=name), batch, logp0)
    d = (batch.ref_logp - logp0) * mask
    formulas = {"k1": -d, "k2": 0.5 * d * d, "k3": torch.expm1(d) - d}
    grads = {"k1": torch.ones_like(d), "k2": -d, "k3": 1 - torch.exp(d)}  # d(estimate)/d(logp)
    formulas.update({"k1+": formulas["k1"], "k3+": formulas["k3"]})  # (straight through: k2's gradient)
    grads.update({"k1+": grads["k2"], "k3+": grads["k2"]})
    kl_terms = {}
    for est in ("k1", "k2", "k3", "k1+", "k3+"):
        loss, grad, metrics = _loss(AlgoConfig(name=name, kl_coef=coef, kl_estimator=est), batch, logp0)
        kl_terms[est] = loss - no_kl
        # every baseline here aggregates the KL with its loss_agg; token-mean for these defaults but dr_grpo / gspo
        agg = {"dr_grpo": "seq-mean-token-sum-norm", "gspo": "seq-mean-token-mean"}.get(name, "token-mean")
        per_token = formulas[est] * mask
        if agg == "token-mean":
            want, w = per_token.sum() / mask.sum(), mask / mask.sum()
        elif agg == "seq-mean-token-mean":
            n = mask.sum(1, keepdim=True).clamp(min=1)
            want, w = (per_token.sum(1, keepdim=True) / n).mean(), mask / n / mask.shape[0]
        else:
            want, w = (per_token.sum(1) / 9).mean(), mask / 9 / mask.shape[0]
        assert float(kl_terms[est]) == pytest.approx(coef * float(want), rel=1e-9, abs=1e-15)
        assert torch.allclose(grad - no_kl_grad, coef * grads[est] * w, rtol=1e-9, atol=1e-15)
    assert len({round(float(v), 12) for v in kl_terms.values()}) == 3  # (three values: k1+ / k3+ are k1 / k3's)


@pytest.mark.parametrize("est, verl_name", [("k3+", "k3+"), ("k1+", "k1+"), ("k3", "low_var_kl"), ("k1", "kl"),
                                           ("k2", "mse")])
def test_each_estimator_equals_verls_kl_penalty(seed, est, verl_name):
    """Values and gradients against verl's installed kl_penalty (k3+ / k1+: the value of k3 / k1 with k2's
    gradient, straight through); verl's low_var_kl clamps at 10 always, so ours with algo.kl_clamp=10."""
    ca = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed")
    from pacs_fast.algorithms.kl import kl_penalty

    gen = torch.Generator().manual_seed(seed)
    ref = -3 * torch.rand(7, 11, generator=gen, dtype=torch.float64)
    logp = ref + 0.5 * torch.randn(7, 11, generator=gen, dtype=torch.float64)
    logp[0, :3] -= 25.0  # far from the reference: the clamp acts on k3's value
    clamp = 10.0 if est.startswith("k3") else None
    x, y = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    ours, theirs = kl_penalty(x, ref, est, clamp=clamp), ca.kl_penalty(y, ref, verl_name)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    weights = torch.rand(7, 11, generator=gen, dtype=torch.float64)
    (gx,) = torch.autograd.grad((ours * weights).sum(), x)
    (gy,) = torch.autograd.grad((theirs * weights).sum(), y)
    torch.testing.assert_close(gx, gy, rtol=1e-12, atol=1e-12)
    if est.endswith("+"):  # k2's gradient, -d
        torch.testing.assert_close(gx, weights * (logp - ref), rtol=1e-12, atol=1e-12)


def test_the_clamp_bounds_k3_as_verls_low_var_kl():
    gen = torch.Generator().manual_seed(0)
    batch = _batch(gen)
    mask = batch.response_mask
    batch.ref_logp = batch.old_logp.clone()
    logp0 = batch.old_logp.clone()
    logp0[0, mask[0] > 0] -= 30.0  # a row far from the reference: e^d - d - 1 ~ 1e13 per token unclamped
    clamped, grad, _ = _loss(AlgoConfig(name="grpo", kl_coef=1.0, kl_clamp=10.0), batch, logp0)
    free, _, _ = _loss(AlgoConfig(name="grpo", kl_coef=1.0), batch, logp0)
    base, _, _ = _loss(AlgoConfig(name="grpo"), batch, logp0)
    n0 = float(mask[0].sum())
    assert float(clamped - base) == pytest.approx(10.0 * n0 / float(mask.sum()), rel=1e-9)  # each far token at 10
    assert float(free - base) > 1e11 and torch.isfinite(grad).all()


def test_k2s_expected_gradient_is_the_kls_gradient():
    """On a categorical policy pi = softmax(theta) over 6 tokens (one position), the expectation under pi of
    grad k_est(token) (pi's log-prob differentiated, the sample held fixed, as in the loss) against grad
    KL(pi || ref): k2's is the KL's exactly, k3's and k1's are not (k1's is 0)."""
    torch.manual_seed(3)
    theta = torch.randn(6, dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.randn(6, dtype=torch.float64), 0)
    logp = torch.log_softmax(theta, 0)
    kl = (logp.exp() * (logp - ref)).sum()
    (want,) = torch.autograd.grad(kl, theta, retain_graph=True)
    p = logp.exp().detach()
    expected = {}
    for est, f in {"k1": lambda d: -d, "k2": lambda d: 0.5 * d * d, "k3": lambda d: torch.expm1(d) - d}.items():
        total = sum(p[i] * torch.autograd.grad(f(ref[i] - logp[i]), theta, retain_graph=True)[0] for i in range(6))
        expected[est] = total
    assert torch.allclose(expected["k2"], want, rtol=1e-12, atol=1e-14)
    assert not torch.allclose(expected["k3"], want, rtol=1e-3) and float(expected["k1"].abs().max()) < 1e-15


@pytest.mark.parametrize("overrides,message", [
    (["algo.name=grpo", "algo.kl_coef=0.1", "algo.kl_estimator=low_var_kl"],
     r"algo.kl_estimator must be one of k1, k2, k3, k1\+, k3\+; got 'low_var_kl'"),
    (["algo.name=grpo", "algo.kl_coef=0.1", "algo.kl_estimator=k1+", "algo.kl_clamp=10"],
     r"algo.kl_estimator=k1\+ takes none"),
    (["algo.name=grpo", "algo.kl_coef=0.1", "algo.kl_estimator=k2", "algo.kl_clamp=10"],
     r"algo.kl_clamp bounds the k3 \(and k3\+\) estimate .* algo.kl_estimator=k2 takes none"),
    (["algo.name=grpo", "algo.kl_coef=0.1", "algo.kl_clamp=-1"], r"algo.kl_clamp must be in \[0, inf\)"),
])
def test_settings_it_cannot_take(overrides, message):
    with pytest.raises(ValueError, match=message):
        validate(load_config(None, overrides))


def test_the_keys_are_named_unused_where_nothing_reads_them():
    lines = unused_settings(load_config(None, ["algo.name=grpo", "algo.kl_estimator=k2"]))
    assert lines == ["algo.kl_estimator=k2 has no effect with algo.kl_coef=0 (no KL penalty)"]
    lines = unused_settings(load_config(None, ["algo.kl_estimator=k2"]))  # pacs
    assert len(lines) == 1 and "with algo.name=pacs" in lines[0]
    assert unused_settings(load_config(None, ["algo.name=grpo", "algo.kl_coef=0.1", "algo.kl_estimator=k2"])) == []
