"""Clip-Cov and KL-Cov (``algo.name=clip_cov|kl_cov``, pacs_fast/algorithms/covariance_losses.py): values and
gradients against verl's installed ``compute_policy_loss_clip_cov`` / ``compute_policy_loss_kl_cov`` in float64 on
fresh random inputs (masked tokens, the off-policy weights, one token or many chosen, Clip-Cov's random draw
from the same seed), the gradients by hand (which tokens are cut or get the KL term), the trainer's objective
(seeded by the micro-batch), the config (bad values refused before anything loads, idle keys named) and a 2-step
run of the built-in task with each."""
from __future__ import annotations

import pytest
import torch

from pacs_fast.algorithms import policy_loss
from pacs_fast.algorithms.covariance_losses import (COV_BOUNDS, COV_FRAC, KL_COV_COEF, clip_cov_policy_loss,
                                                    kl_cov_policy_loss, token_covariance)

from loss_mode_checks import assert_refused_before_loading, assert_two_step_run, unused_keys
from test_sequence_losses import TINY, _grad, _inputs, _micro, _verl

MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
# verl's seq-mean-token-mean divides each sequence's sum by (count + 1e-8) (test_sequence_losses.py); every other
# mode agrees to float64 rounding: the same terms in the same order
TOL = {"seq-mean-token-mean": dict(rtol=1e-7, atol=1e-7), "token-mean": dict(rtol=1e-12, atol=1e-14),
       "seq-mean-token-sum": dict(rtol=1e-12, atol=1e-14)}


def _verl_config(frac, lb, ub, coef, clips=(0.2, 0.28)):
    _, ActorConfig = _verl()
    from verl.workers.config import PolicyLossConfig
    return ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=8, ppo_mini_batch_size=2,
                       clip_ratio_low=clips[0], clip_ratio_high=clips[1],
                       policy_loss=PolicyLossConfig(loss_mode="clip_cov", clip_cov_ratio=frac, clip_cov_lb=lb,
                                                    clip_cov_ub=ub, kl_cov_ratio=frac, ppo_kl_coef=coef))


def _cov_inputs(gen):
    """_inputs with ratios across PPO's clip and covariance terms in about [-3, 3]; and, whatever the draw, a token
    PPO clips (the first of the row of the largest advantage, A > 0, at a ratio of e^0.5 = 1.65 > 1.28) and one
    in the band (0.3, 5) of the tests that PPO does not clip (the first of the row of the smallest advantage, A < 0,
    at log-prob -3.5 and ratio 1: covariance about (-1.1)(-3.5 - mean logp) = 2 to 4). Seeds had left either set
    empty (3 in 1,000 without a band token), and the checks that the cut acts failed."""
    logp, old, adv, mask, w = _inputs(gen, row_shift=0.1, token_noise=0.4)
    has = mask[:, 0] > 0  # (row 3 has no token)
    top, bottom = int(torch.where(has, adv, -1e9).argmax()), int(torch.where(has, adv, 1e9).argmin())
    logp[top, 0] = old[top, 0] + 0.5
    logp[bottom, 0] = old[bottom, 0] = -3.5
    return logp, old, adv, mask, w


# covariance terms of these inputs lie in about [-3, 3]: a band from 0.3 holds several tokens, so a draw of many
# (frac 0.3) and of one (verl's 2e-4) both choose among candidates
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("frac", [COV_FRAC, 0.05, 0.3])
def test_clip_cov_equals_verl(seed, mode, frac):
    ca, _ = _verl()
    gen = torch.Generator().manual_seed(seed)
    logp, old, adv, mask, w = _cov_inputs(gen)
    cfg = _verl_config(frac, 0.3, 5.0, KL_COV_COEF)
    draw = int(torch.randint(0, 2 ** 31, (1,), generator=gen))
    for weights in (None, w):
        torch.manual_seed(draw)  # verl draws with torch's default generator; ours with the one it is given
        ref, g_ref, m_ref = _grad(lambda x: ca.compute_policy_loss_clip_cov(
            old, x, adv[:, None].expand_as(x), mask, loss_agg_mode=mode, config=cfg, rollout_is_weights=weights),
            logp)
        ours, g, m = _grad(clip_cov_policy_loss, logp, old, adv, mask, clip_low=0.2, clip_high=0.28, cov_frac=frac,
                           cov_low=0.3, cov_high=5.0, generator=torch.Generator().manual_seed(draw),
                           loss_agg_mode=mode, token_weights=weights)
        torch.testing.assert_close(ours, ref, **TOL[mode])
        torch.testing.assert_close(g, g_ref, **TOL[mode])
        assert float(m["cov_cut_frac"]) == pytest.approx(m_ref["actor/pg_clipfrac"], abs=1e-9)
        assert float(m["cov_cut_frac"]) > 0 and float(m["clip_frac"]) > 0  # both cuts happen
        assert float(g[mask == 0].abs().max()) == 0.0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("frac", [COV_FRAC, 0.05, 0.3])
def test_kl_cov_equals_verl(seed, mode, frac):
    ca, _ = _verl()
    gen = torch.Generator().manual_seed(seed)
    logp, old, adv, mask, w = _cov_inputs(gen)
    cfg = _verl_config(frac, *COV_BOUNDS, 0.7)
    for weights in (None, w):
        ref, g_ref, m_ref = _grad(lambda x: ca.compute_policy_loss_kl_cov(
            old, x, adv[:, None].expand_as(x), mask, loss_agg_mode=mode, config=cfg, rollout_is_weights=weights),
            logp)
        ours, g, m = _grad(kl_cov_policy_loss, logp, old, adv, mask, cov_frac=frac, cov_kl_coef=0.7,
                           loss_agg_mode=mode, token_weights=weights)
        torch.testing.assert_close(ours, ref, **TOL[mode])
        torch.testing.assert_close(g, g_ref, **TOL[mode])
        assert float(m["cov_kl_abs"]) == pytest.approx(m_ref["actor/ppo_kl"], rel=1e-9)
        n = int(mask.sum())
        assert float(m["cov_kl_frac"]) * n == pytest.approx(max(1, int(frac * n)))
        assert float(g[mask == 0].abs().max()) == 0.0


def test_the_defaults_are_verls_config_defaults():
    """verl's function falls back to ppo_kl_coef=1, but its config always passes PolicyLossConfig's 0.1 (this said
    1 and defaulted to it: a penalty ten times verl's default run's; sweep)."""
    _verl()
    from verl.workers.config import PolicyLossConfig

    from pacs_fast.config import AlgoConfig

    v, a = PolicyLossConfig(), AlgoConfig()
    assert (COV_FRAC, COV_FRAC, *COV_BOUNDS, KL_COV_COEF) == (v.clip_cov_ratio, v.kl_cov_ratio, v.clip_cov_lb,
                                                              v.clip_cov_ub, v.ppo_kl_coef)
    assert (a.cov_frac, a.cov_low, a.cov_high, a.cov_kl_coef) == (COV_FRAC, *COV_BOUNDS, KL_COV_COEF)


def test_the_gradients_by_hand(seed):
    """Clip-Cov: PPO's gradient (no dual clip) except on the cut tokens, whose gradient is 0 and whose covariance
    lies in the band with the clipped term not active. KL-Cov: -A ratio / n on every token, plus the KL term's
    coef * sign(log ratio) / n on the tokens of the largest covariance."""
    gen = torch.Generator().manual_seed(seed)
    logp, old, adv, mask, _ = _cov_inputs(gen)
    _, g, _ = _grad(clip_cov_policy_loss, logp, old, adv, mask, cov_frac=0.3, cov_low=0.3, cov_high=5.0,
                    generator=torch.Generator().manual_seed(seed))
    _, g_ppo, _ = _grad(policy_loss, logp, old, adv, mask, clip_c=None)
    cov = token_covariance(adv, logp, mask)
    cut = (g == 0) & (g_ppo != 0) & (mask > 0)
    assert 0 < int(cut.sum()) <= max(1, int(0.3 * mask.sum()))
    assert torch.equal(g[~cut], g_ppo[~cut])
    assert bool(((cov[cut] > 0.3) & (cov[cut] < 5.0)).all())

    n = mask.sum()
    _, g, _ = _grad(kl_cov_policy_loss, logp, old, adv, mask, cov_frac=0.1, cov_kl_coef=0.7)
    k = max(1, int(0.1 * float(n)))
    top = torch.topk(cov[mask > 0], k).values.min()
    chosen = (cov >= top) & (mask > 0)
    assert int(chosen.sum()) == k
    ratio = (logp - old).exp()
    want = (-adv[:, None] * ratio + chosen.double() * 0.7 * torch.sign(logp - old)) * mask / n
    torch.testing.assert_close(g, want, rtol=1e-12, atol=1e-14)


def test_a_micro_batch_without_tokens_and_bad_arguments():
    x = torch.zeros(4, 3, dtype=torch.float64)
    empty = torch.zeros(4, 3)
    for fn in (clip_cov_policy_loss, kl_cov_policy_loss):
        loss, _ = fn(x.clone().requires_grad_(), x, torch.ones(4), empty)
        assert float(loss) == 0.0
        with pytest.raises(ValueError, match=r"cov_frac is a fraction of the tokens, in \(0, 1\], got 1.5"):
            fn(x, x, torch.zeros(4), None, cov_frac=1.5)
        with pytest.raises(ValueError, match="cov_frac must be"):
            fn(x, x, torch.zeros(4), None, cov_frac=0.0)
        with pytest.raises(ValueError, match="advantages has 3 entries"):
            fn(x, x, torch.zeros(3), None)
    with pytest.raises(ValueError, match="cov_low must be below cov_high"):
        clip_cov_policy_loss(x, x, torch.zeros(4), None, cov_low=5.0, cov_high=1.0)
    with pytest.raises(ValueError, match="clip_low must be < 1"):
        clip_cov_policy_loss(x, x, torch.zeros(4), None, clip_low=1.0)
    with pytest.raises(ValueError, match="cov_kl_coef"):
        kl_cov_policy_loss(x, x, torch.zeros(4), None, cov_kl_coef=-1.0)


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov"])
def test_the_objective_reaches_the_loss_with_its_settings(seed, name):
    """algo.name=clip_cov|kl_cov reaches the loss with GRPO's advantages, the config's cov settings, the k3 KL and
    the off-policy weights; Clip-Cov draws from a generator seeded by the micro-batch's tokens (the same micro-batch
    cuts the same tokens; other tokens draw anew)."""
    from pacs_fast.algorithms import group_advantages
    from pacs_fast.config import load_config
    from pacs_fast.learner.objective import minibatch_counts, objective, row_keys

    gen = torch.Generator().manual_seed(seed)
    # a wide ratio range clips (almost) nothing, so Clip-Cov's band holds about twice the tokens it cuts and the draw
    # chooses among them (with PPO's 0.2 a seed left exactly as many band tokens as cuts: CI seed 856356058)
    algo = load_config(None, [f"algo.name={name}", "algo.kl_coef=0.05", "algo.cov_frac=0.1", "algo.cov_low=0.01",
                              "algo.cov_kl_coef=0.5", "algo.clip_low=0.9", "algo.clip_high=10"]).algo
    mb = _micro(gen, B=8, T=12)
    mb.input_ids = torch.randint(3, 90, mb.input_ids.shape, generator=gen)
    mb.is_weights = (0.5 + torch.rand(mb.response_mask.shape, generator=gen)) * mb.response_mask
    logp = (mb.old_logp + 0.3 * torch.randn(mb.old_logp.shape, generator=gen, dtype=torch.float64)) * mb.response_mask
    counts = minibatch_counts(mb)
    whole, met = objective(algo, mb, logp, None, None, counts, horizon=12)
    assert torch.equal(objective(algo, mb, logp, None, None, counts, horizon=12)[0], whole)  # reproducible
    common = dict(loss_agg_mode="token-mean", global_count=counts["tokens"], horizon=12.0, logp_ref=mb.ref_logp,
                  kl_coef=0.05, token_weights=mb.is_weights)
    adv = group_advantages(mb.rewards, 4, "grpo")
    if name == "kl_cov":
        want, _ = kl_cov_policy_loss(logp, mb.old_logp, adv, mb.response_mask, cov_frac=0.1, cov_kl_coef=0.5,
                                     **common)
        torch.testing.assert_close(whole, want)
        assert float(met["cov_kl_frac"]) > 0
        return
    def clip_cov(keys):
        return clip_cov_policy_loss(logp, mb.old_logp, adv, mb.response_mask, cov_frac=0.1, cov_low=0.01,
                                    cov_high=5.0, clip_low=0.9, clip_high=10.0, token_keys=keys, **common)[0]

    torch.testing.assert_close(whole, clip_cov(row_keys(mb)))
    cov = token_covariance(adv, logp, mb.response_mask)
    band = int((mb.response_mask.bool() & (cov > 0.01) & (cov < 5.0)).sum())
    assert band > max(1, int(0.1 * int(mb.response_mask.sum())))  # the draw has more candidates than cuts
    assert len({clip_cov(torch.rand(logp.shape, generator=gen)).item() for _ in range(10)}) > 1  # the draw matters
    assert float(met["cov_cut_frac"]) > 0
    # the megatron learner orders a micro-batch's groups otherwise than the torch learner: the same rows in another
    # order cut the same tokens (a micro-batch seed drew others: TP=2 did not match one process; sweep)
    swap = torch.cat([torch.arange(4, 8), torch.arange(4)])
    other = mb.groups([1, 0])
    assert torch.equal(other.input_ids, mb.input_ids[swap])
    moved, _ = objective(algo, other, logp[swap], None, None, minibatch_counts(other), horizon=12)
    torch.testing.assert_close(moved, whole, rtol=1e-12, atol=1e-14)
    keys = row_keys(mb)
    mb.input_ids[0, -1] += 1  # one token more or less in a row: that row's keys are drawn anew, the others kept
    again = row_keys(mb)
    assert not torch.equal(again[0], keys[0]) and torch.equal(again[1:], keys[1:])


@pytest.mark.parametrize("overrides, key", [
    (["algo.name=clip_cov", "algo.cov_frac=0"], "algo.cov_frac must be in (0, 1]"),
    (["algo.name=kl_cov", "algo.cov_frac=1.5"], "algo.cov_frac must be in (0, 1]"),
    (["algo.name=kl_cov", "algo.cov_kl_coef=-1"], "algo.cov_kl_coef must be in [0, inf)"),
    (["algo.name=clip_cov", "algo.cov_low=5", "algo.cov_high=1"], "algo.cov_low must be below algo.cov_high"),
    (["algo.name=clip_cov", "algo.cov_high=nan"], "algo.cov_high must be a finite number"),
    (["algo.name=kl_cov", "rollout.n=1"], "rollout.n must be >= 2 for algo.name=kl_cov"),
    # the entropy mask multiplies every per-token term: KL-Cov's penalty left the confident tokens it targets
    (["algo.name=kl_cov", "algo.entropy_top_frac=0.2"], "not with algo.name=kl_cov (set algo.entropy_top_frac=1)"),
])
def test_bad_values_refused_before_loading(overrides, key, tmp_path, capsys):
    assert_refused_before_loading(overrides, key, tmp_path, capsys)


@pytest.mark.parametrize("overrides, idle", [
    (["algo.name=grpo", "algo.cov_frac=0.01", "algo.cov_kl_coef=2"], ["algo.cov_frac", "algo.cov_kl_coef"]),
    (["algo.name=clip_cov", "algo.cov_kl_coef=2", "algo.clip_c=5", "algo.cov_low=0.5"],
     ["algo.clip_c", "algo.cov_kl_coef"]),
    (["algo.name=kl_cov", "algo.clip_high=0.28", "algo.cov_high=3", "algo.cov_frac=0.002"],
     ["algo.clip_high", "algo.cov_high"]),
    (["algo.name=pacs", "algo.cov_frac=0.01"], ["algo.cov_frac"]),
])
def test_idle_keys_are_named(overrides, idle):
    assert unused_keys(overrides) == sorted(idle)


@pytest.fixture(scope="module")
def cache(warm_cache):
    return str(warm_cache)  # the session's shared warm-up cache (conftest.py)


@pytest.mark.parametrize("name, metric", [("clip_cov", "learner/cov_cut_frac"), ("kl_cov", "learner/cov_kl_frac")])
def test_two_step_run(tmp_path, cache, name, metric):
    extra = ["algo.cov_frac=0.05", "algo.cov_low=0.001"] if "cov" in name else []
    assert_two_step_run(TINY + [f"warmup.cache_dir={cache}", f"algo.name={name}", *extra], tmp_path, [metric])


def test_the_keys_are_drawn_only_when_there_is_a_draw():
    """The trainer's keys (a generator per row, over every token) were made for every micro-batch; as a function
    they are called only when the band holds more tokens than the cut takes."""
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.2, -3.0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    calls = []

    def keys():
        calls.append(1)
        return torch.rand(logp.shape)

    kw = dict(cov_low=-100.0, cov_high=100.0, token_keys=keys)
    clip_cov_policy_loss(logp, logp, adv, None, cov_frac=1.0, **kw)  # every token is cut: no draw
    assert calls == []
    clip_cov_policy_loss(logp, logp, adv, None, cov_frac=0.3, **kw)  # 1 of 6: drawn
    assert calls == [1]
