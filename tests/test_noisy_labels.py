"""Noisy-verifier corrections (pacs_fast/algorithms/noisy_labels.py; derivations in docs/EFFICACY.md).

Exact checks: expectations over the label noise are enumerated (every flip pattern with its
probability), expectations over the policy on the tiny enumerable policy of
test_pacs_gradient_identity. All in float64; tolerances are rounding-level (1e-10 to 1e-12).
"""
import itertools
import random

import numpy as np
import pytest
import torch

from pacs_fast.algorithms import group_advantages, pacs_loss
from pacs_fast.algorithms.noisy_labels import (
    backward_rewards,
    bce_forward,
    check_rates,
    corrected_bce,
    corrected_rewards,
    forward_rewards,
    pacs_loss_noisy,
)
from test_pacs_gradient_identity import V, batch_for, enumerate_group_samples, grad


def noise_patterns(labels, rho0, rho1):
    """Every observed label vector with its probability given the true 0/1 labels."""
    for flips in itertools.product((0, 1), repeat=len(labels)):
        p, obs = 1.0, []
        for y, f in zip(labels, flips):
            rate = rho1 if y > 0.5 else rho0
            p *= rate if f else 1.0 - rate
            obs.append(float((y > 0.5) != bool(f)))
        yield p, torch.tensor(obs, dtype=torch.float64)


def random_rates(seed):
    rng = random.Random(seed)
    rho0, rho1 = rng.uniform(0.0, 0.3), rng.uniform(0.05, 0.45)
    return rho0, rho1


def test_backward_surrogate_is_unbiased(seed):
    rho0, rho1 = random_rates(seed)
    for y in (0.0, 1.0):
        mean = sum(p * backward_rewards(obs, rho0, rho1) for p, obs in noise_patterns([y], rho0, rho1))
        assert abs(float(mean) - y) < 1e-12
    # forward weights: E[w | R] = -(1 - rho0 - rho1) (1 - R)
    for y in (0.0, 1.0):
        mean = sum(p * forward_rewards(obs, rho1) for p, obs in noise_patterns([y], rho0, rho1))
        assert abs(float(mean) + (1 - rho0 - rho1) * (1 - y)) < 1e-12


@pytest.mark.parametrize("score,G,weight", [("rloo", 3, "none"), ("grpo", 3, "none"), ("rloo", 2, "none")])
def test_pacs_backward_expected_gradient_equals_clean(seed, score, G, weight):
    """grad E_{o, noise}[L_backward(theta; o, R~)] == grad E_o[L(theta; o, R)] exactly, and the
    uncorrected noisy loss's expected gradient differs (so the identity is not trivial)."""
    rho0, rho1 = random_rates(seed)
    gen = torch.Generator().manual_seed(seed)
    n_prompts, V = 1, 2
    theta0 = torch.randn(n_prompts, V, generator=gen, dtype=torch.float64).requires_grad_(True)
    theta1 = torch.randn(n_prompts, V, V, generator=gen, dtype=torch.float64).requires_grad_(True)
    ref0 = torch.randn(n_prompts, V, generator=gen, dtype=torch.float64)
    ref1 = torch.randn(n_prompts, V, V, generator=gen, dtype=torch.float64)
    rewards_table = [[1.0, 0.0, 1.0]]
    clean = corrected = naive = 0.0
    for joint in enumerate_group_samples(n_prompts, G):
        logp, logp_ref, mask, R = batch_for(joint, theta0, theta1, ref0, ref1, rewards_table)
        prob = (logp * mask).sum().exp()
        l_clean = pacs_loss(logp, logp_ref, mask, R, group_size=G, score=score, weight_mode=weight)
        clean = clean + prob * l_clean
        for p, obs in noise_patterns(R.tolist(), rho0, rho1):
            l_b, _ = pacs_loss_noisy(logp, logp_ref, mask, obs, group_size=G, correction="backward",
                                     rho0=rho0, rho1=rho1, score=score, weight_mode=weight)
            l_n = pacs_loss(logp, logp_ref, mask, obs, group_size=G, score=score, weight_mode=weight)
            corrected = corrected + prob * p * l_b
            naive = naive + prob * p * l_n
    params = (theta0, theta1)
    assert abs(corrected.item() - clean.item()) < 1e-10  # the expected loss itself is unbiased
    g_clean = grad(clean, params, retain_graph=True)
    g_corr = grad(corrected, params, retain_graph=True)
    g_naive = grad(naive, params)
    for a, b in zip(g_corr, g_clean):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    assert max((a - b).abs().max().item() for a, b in zip(g_naive, g_clean)) > 1e-4


def test_natarajan_form_equals_surrogate_label(seed):
    """Natarajan's unbiased loss [(1-rho_{1-y~}) l(y~) - rho_{y~} l(1-y~)]/D is BCE with label R^."""
    rho0, rho1 = random_rates(seed)
    psi = torch.randn(64, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * 5
    D = 1 - rho0 - rho1
    for y in (0.0, 1.0):
        obs = torch.full_like(psi, y)
        l = lambda lab: corrected_bce(psi, torch.full_like(psi, lab), "none", 0, 0)  # noqa: E731
        rho_y, rho_other = (rho0, rho1) if y == 0 else (rho1, rho0)  # rho_c = flip rate of class c
        natarajan = ((1 - rho_other) * l(y) - rho_y * l(1 - y)) / D
        torch.testing.assert_close(corrected_bce(psi, obs, "backward", rho0, rho1), natarajan, rtol=0, atol=1e-12)


def test_pacs_forward_expected_gradient_is_aligned(seed):
    """E_{y~}[d l_fwd / d psi] = D^2 p(1-p) / (q(1-q)) * (p - R): a positive multiple of the clean
    gradient (p - R), so the population minimiser is the clean one."""
    rho0, rho1 = random_rates(seed)
    D = 1 - rho0 - rho1
    psi = (torch.randn(32, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * 3).requires_grad_(True)
    p = torch.sigmoid(psi.detach())
    q = rho0 + D * p
    for y in (0.0, 1.0):
        expected = 0.0
        for prob, obs in noise_patterns([y], rho0, rho1):
            expected = expected + prob * bce_forward(psi, obs.expand_as(psi), rho0, rho1).sum()
        g = torch.autograd.grad(expected, psi)[0]
        torch.testing.assert_close(g, D ** 2 * p * (1 - p) / (q * (1 - q)) * (p - y), rtol=1e-10, atol=1e-12)
    # stable at extreme scores (log space), rho0 = 0 allowed
    big = torch.tensor([-800.0, 800.0], dtype=torch.float64)
    assert torch.isfinite(bce_forward(big, torch.tensor([1.0, 0.0], dtype=torch.float64), 0.0, rho1)).all()


def test_baseline_corrections_under_group_advantages(seed):
    """Backward: the RLOO / Dr.GRPO advantage of R^ is unbiased for the clean one (linear); GRPO's
    std normalisation makes it equal to the uncorrected advantage. Forward: a constant shift, so
    group advantages are unchanged (documented: the forward correction needs a baseline-free estimator)."""
    rho0, rho1 = random_rates(seed)
    G = 4
    labels = [1.0, 0.0, 1.0, 1.0]
    clean = group_advantages(torch.tensor(labels, dtype=torch.float64), G, "rloo")
    mean = sum(p * group_advantages(backward_rewards(obs, rho0, rho1), G, "rloo")
               for p, obs in noise_patterns(labels, rho0, rho1))
    torch.testing.assert_close(mean, clean, rtol=0, atol=1e-12)
    naive = sum(p * group_advantages(obs, G, "rloo") for p, obs in noise_patterns(labels, rho0, rho1))
    torch.testing.assert_close(naive, (1 - rho0 - rho1) * clean, rtol=0, atol=1e-12)  # shrunk, same direction
    obs = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    torch.testing.assert_close(group_advantages(backward_rewards(obs, rho0, rho1), G, "grpo", eps=0.0),
                               group_advantages(obs, G, "grpo", eps=0.0), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(group_advantages(forward_rewards(obs, rho1), G, "dr_grpo"),
                               group_advantages(obs, G, "dr_grpo"), rtol=0, atol=1e-12)


def test_forward_reinforce_gradient_is_scaled_clean_gradient(seed):
    """On an enumerable softmax policy over 5 outputs, REINFORCE with the forward weights has the
    expected gradient (1 - rho0 - rho1) * grad J (J = expected clean reward)."""
    rho0, rho1 = random_rates(seed)
    gen = torch.Generator().manual_seed(seed)
    theta = torch.randn(5, generator=gen, dtype=torch.float64).requires_grad_(True)
    R = [1.0, 0.0, 0.0, 1.0, 0.0]
    logpi = torch.log_softmax(theta, 0)
    J = (logpi.exp() * torch.tensor(R, dtype=torch.float64)).sum()
    surrogate = 0.0
    for y, lp in zip(R, logpi):
        ew = sum(p * forward_rewards(obs, rho1) for p, obs in noise_patterns([y], rho0, rho1))
        surrogate = surrogate + lp.exp().detach() * float(ew) * lp
    g_fwd = torch.autograd.grad(surrogate, theta, retain_graph=True)[0]
    g_clean = torch.autograd.grad(J, theta)[0]
    torch.testing.assert_close(g_fwd, (1 - rho0 - rho1) * g_clean, rtol=1e-10, atol=1e-12)


def test_objective_applies_the_correction():
    from pacs_fast.config import AlgoConfig
    from pacs_fast.learner.base import RolloutBatch
    from pacs_fast.learner.objective import minibatch_counts, objective
    from pacs_fast.algorithms import grpo_loss

    g = torch.Generator().manual_seed(0)
    B, T, G = 4, 5, 2
    ids = torch.randint(1, 9, (B, T), generator=g)
    mask = torch.zeros(B, T)
    mask[:, 2:] = 1
    R = torch.tensor([1.0, 0.0, 0.0, 1.0])
    logp = -torch.rand(B, T, generator=g, dtype=torch.float32) * mask
    old = (logp - 0.05 * torch.rand(B, T, generator=g)) * mask
    batch = RolloutBatch(ids, torch.ones_like(ids), mask, R, G, old_logp=old, ref_logp=old)
    counts = minibatch_counts(batch)
    algo = AlgoConfig(name="pacs", noise_correction="backward", noise_rho0=0.1, noise_rho1=0.3, weight="none")
    loss, _ = objective(algo, batch, logp, None, None, counts, horizon=T)
    ref, _ = pacs_loss_noisy(logp, old, mask, R, group_size=G, correction="backward", rho0=0.1, rho1=0.3,
                             weight_mode="none")
    surrogate = pacs_loss(logp, old, mask, (R - 0.1) / 0.6, group_size=G, weight_mode="none")
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(loss, surrogate)
    # with an off-policy correction each row's corrected term takes its sequence weight
    batch.is_weights = (0.5 + torch.rand(B, T, generator=g)) * mask
    loss_w, _ = objective(algo, batch, logp, None, None, counts, horizon=T)
    seq_w = (batch.is_weights * mask).sum(-1) / mask.sum(-1)
    ref_w, _ = pacs_loss_noisy(logp, old, mask, R, group_size=G, correction="backward", rho0=0.1, rho1=0.3,
                               weight_mode="none", sample_weights=seq_w)
    torch.testing.assert_close(loss_w, ref_w)
    assert abs(float(loss_w - loss)) > 1e-3
    batch.is_weights = None
    algo = AlgoConfig(name="dr_grpo", noise_correction="backward", noise_rho0=0.1, noise_rho1=0.3)
    loss, _ = objective(algo, batch, logp, None, None, counts, horizon=T)
    plain, _ = objective(AlgoConfig(name="dr_grpo"), batch, logp, None, None, counts, horizon=T)
    torch.testing.assert_close(loss, plain / 0.6)  # centred rewards: backward = a 1/D rescale


@pytest.mark.parametrize("correction", ["backward", "forward"])
def test_noisy_pacs_with_sample_weights_recovers_the_on_policy_loss(seed, correction):
    """Both corrections at once: groups drawn from a behaviour policy mu, labels flipped at rho0 /
    rho1, each row's corrected BCE weighted by pi(y_i) / mu(y_i) (sample_weights). Enumerating every
    group and flip pattern, the expected loss and its gradient equal the same loss's under pi (and,
    for the backward correction, the clean loss's). Exact where a row's term depends on its own
    sequence only (score=naive, weight=none; docs/OFF_POLICY.md), so float64 rounding bounds (1e-10)."""
    rho0, rho1 = random_rates(seed)
    gen = torch.Generator().manual_seed(seed)
    G = 2
    theta0 = torch.randn(1, V, generator=gen, dtype=torch.float64).requires_grad_(True)
    theta1 = torch.randn(1, V, V, generator=gen, dtype=torch.float64).requires_grad_(True)
    mu0, mu1 = torch.randn(1, V, generator=gen, dtype=torch.float64), torch.randn(1, V, V, generator=gen, dtype=torch.float64)
    ref0, ref1 = torch.randn(1, V, generator=gen, dtype=torch.float64), torch.randn(1, V, V, generator=gen, dtype=torch.float64)
    rewards_table = [[1.0, 0.0, 1.0]]
    kw = dict(group_size=G, correction=correction, rho0=rho0, rho1=rho1, score="naive", weight_mode="none")
    under_mu = unweighted_mu = under_pi = clean = 0.0
    for joint in enumerate_group_samples(1, G):
        logp, logp_ref, mask, R = batch_for(joint, theta0, theta1, ref0, ref1, rewards_table)
        logp_mu, _, _, _ = batch_for(joint, mu0, mu1, ref0, ref1, rewards_table)
        seq_pi, seq_mu = (logp.detach() * mask).sum(-1), (logp_mu * mask).sum(-1)
        p_pi, p_mu = seq_pi.sum().exp(), seq_mu.sum().exp()
        clean = clean + p_pi * pacs_loss(logp, logp_ref, mask, R, group_size=G, score="naive", weight_mode="none")
        for p, obs in noise_patterns(R.tolist(), rho0, rho1):
            weighted, terms = pacs_loss_noisy(logp, logp_ref, mask, obs, sample_weights=(seq_pi - seq_mu).exp(), **kw)
            plain, _ = pacs_loss_noisy(logp, logp_ref, mask, obs, **kw)
            under_mu = under_mu + p_mu * p * weighted
            unweighted_mu = unweighted_mu + p_mu * p * plain
            under_pi = under_pi + p_pi * p * plain
    params = (theta0, theta1)
    assert abs(under_mu.item() - under_pi.item()) < 1e-10
    assert abs(unweighted_mu.item() - under_pi.item()) > 1e-4  # without the weights mu's expectation differs
    for a, b in zip(grad(under_mu, params, retain_graph=True), grad(under_pi, params, retain_graph=True)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    if correction == "backward":
        assert abs(under_mu.item() - clean.item()) < 1e-10
        for a, b in zip(grad(under_mu, params, retain_graph=True), grad(clean, params)):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="sample_weights has shape"):
        pacs_loss_noisy(logp, logp_ref, mask, obs, sample_weights=torch.ones(G + 1, dtype=torch.float64), **kw)


def test_bad_rates():
    with pytest.raises(ValueError, match="rho0 \\+ rho1"):
        check_rates(0.5, 0.5)
    with pytest.raises(ValueError, match="rho1"):
        corrected_rewards(torch.zeros(2), "backward", 0.0, 1.0)
    with pytest.raises(ValueError, match="correction"):
        corrected_bce(torch.zeros(2), torch.zeros(2), "sideways", 0.0, 0.1)


# ----------------------------------------------------------------------------- the Scorer's noise and appeal
def test_flips_are_seeded_by_step_and_at_the_given_rates(seed):
    from pacs_fast.trainer.rewards import flip_labels
    rng = random.Random(seed)
    labels = [float(rng.random() < 0.4) for _ in range(20_000)]
    fp, fn = 0.1, 0.3
    a = flip_labels(labels, fp=fp, fn=fn, seed=seed, step=5)
    assert a == flip_labels(labels, fp=fp, fn=fn, seed=seed, step=5)  # resume-exact
    assert a != flip_labels(labels, fp=fp, fn=fn, seed=seed, step=6)
    pos = [x for x, y in zip(a, labels) if y == 1.0]
    neg = [x for x, y in zip(a, labels) if y == 0.0]
    fn_rate, fp_rate = 1 - sum(pos) / len(pos), sum(neg) / len(neg)
    # binomial standard errors ~0.005 and ~0.003: 5 sigma bounds
    assert abs(fn_rate - fn) < 5 * (fn * (1 - fn) / len(pos)) ** 0.5
    assert abs(fp_rate - fp) < 5 * (fp * (1 - fp) / len(neg)) ** 0.5
    assert flip_labels(labels, fp=0, fn=0, seed=seed, step=1) == labels


def lenient_appeal(texts, answers):
    """Also accepts the answer spelled as a word (the strict verifier rejects it)."""
    words = {"four": "4"}
    return [words.get(t.strip().removeprefix("\\boxed{").removesuffix("}"), None) == a for t, a in zip(texts, answers)]


def test_scorer_noise_appeal_and_online_fn_rate():
    from pacs_fast.config import load_config
    from pacs_fast.trainer.rewards import Scorer
    cfg = load_config(None, ["reward.noise_fn=0.0", "reward.appeal=test_noisy_labels:lenient_appeal",
                             "reward.fn_rate=appeal", "algo.noise_correction=backward"])
    scorer = Scorer.from_config(cfg)
    try:
        # 3 right, 1 right but spelled out (a false negative of the strict check), 2 wrong
        texts = ["\\boxed{4}", "\\boxed{4}", "\\boxed{4}", "\\boxed{four}", "\\boxed{5}", "7"]
        assert scorer(texts, ["4"] * 6) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]  # evaluation: no appeal, no noise
        assert scorer.fn_rate is None
        assert scorer(texts, ["4"] * 6, step=1) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
        assert scorer.fn_rate == pytest.approx(1 / 4)  # 1 overturned / (3 positives + 1 overturned)
        assert cfg.algo.noise_rho1 == pytest.approx(1 / 4)  # the learner's correction reads it
        state = scorer.state_dict()
        scorer(texts[:3], ["4"] * 3, step=2)
        assert scorer.fn_rate == pytest.approx(1 / 7)
        scorer.load_state_dict(state)
        assert scorer.fn_rate == pytest.approx(1 / 4)
    finally:
        scorer.close()
    noisy = Scorer.from_config(load_config(None, ["reward.noise_fn=0.5", "train.seed=3"]))
    try:
        r1 = noisy(["\\boxed{4}"] * 200, ["4"] * 200, step=7)
        assert r1 == noisy(["\\boxed{4}"] * 200, ["4"] * 200, step=7) and 50 < sum(r1) < 150
        assert noisy(["\\boxed{4}"] * 200, ["4"] * 200) == [1.0] * 200  # evaluation stays clean
    finally:
        noisy.close()


def substring_appeal(texts, answers):
    """A lenient second check for the data-parallel test: the gold answer anywhere in the text."""
    return [a in t for t, a in zip(texts, answers)]


def _responses(seed, step, n=24):
    rng = np.random.default_rng([seed, step])
    return ([f"\\boxed{{{x}}}" for x in rng.integers(0, 30, n)], [str(x) for x in rng.integers(0, 12, n)])


def _dp_scorer_worker(rank, init_file, seed, result_dir):
    import json

    import torch.distributed as dist

    from pacs_fast.config import AlgoConfig
    from pacs_fast.trainer.parallel import World
    from pacs_fast.trainer.rewards import Scorer

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    world = World(rank=rank, size=2, tp=1, dp=2, dp_rank=rank)
    algo = AlgoConfig(noise_correction="backward")
    scorer = Scorer(0, noise_fp=0.1, noise_fn=0.3, seed=seed, appeal=substring_appeal, algo=algo,
                    gather=world.gather_dp)
    out = []
    for step in (1, 2, 3):
        texts, answers = _responses(seed, step)
        mine, first = world.share(list(zip(texts, answers)))
        rewards = scorer([t for t, _ in mine], [a for _, a in mine], step=step, first=first)
        out.append({"rewards": rewards, "rho1": algo.noise_rho1, "counts": dict(scorer.counts)})
    scorer.close()
    dist.destroy_process_group()
    with open(f"{result_dir}/rank{rank}.json", "w") as f:
        json.dump(out, f)


def test_data_parallel_groups_flip_and_estimate_as_one_process(tmp_path, seed):
    """With several data-parallel groups each scores its share of the step: the label flips are drawn
    by a response's index in the whole step (not its index in the share, which repeated the same
    draws in every share), and the appeal counts are summed over the groups, so every group trains
    with the same false-negative rate, the one a single process computes (two gloo processes,
    compared exactly with one scorer over the whole step)."""
    import json

    import torch.multiprocessing as mp

    from pacs_fast.config import AlgoConfig
    from pacs_fast.trainer.rewards import Scorer

    seed = seed % 10_000
    mp.spawn(_dp_scorer_worker, args=(str(tmp_path / "init"), seed, str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    algo = AlgoConfig(noise_correction="backward")
    whole = Scorer(0, noise_fp=0.1, noise_fn=0.3, seed=seed, appeal=substring_appeal, algo=algo)
    try:
        for step, (a, b) in enumerate(zip(*ranks), start=1):
            rewards = whole(*_responses(seed, step), step=step)
            assert a["rewards"] + b["rewards"] == rewards
            assert a["counts"] == b["counts"] == whole.counts
            assert a["rho1"] == b["rho1"] == algo.noise_rho1
        assert whole.counts["overturned"] > 0 and 0 < algo.noise_rho1 < 0.95  # the estimate was exercised
    finally:
        whole.close()
