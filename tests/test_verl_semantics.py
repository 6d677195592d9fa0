"""Every place where pacs_fast claims verl's semantics, checked against verl's definitions.

References (github.com/volcengine/verl, file ``verl/trainer/ppo/core_algos.py``):
verl 0.7.0 (tag v0.7.0, commit f9c855f7cf04d603c9546bc01776c74806a879c1) and verl 0.9.1 (the PyPI
wheel ``verl-0.9.1-py3-none-any.whl``). Between them only ``agg_loss`` changed: in 0.7.1,
``"seq-mean-token-sum-norm"`` went from a sum over sequences divided by the horizon to the mean
over sequences divided by the horizon, and 0.9.0 added ``"token-sum"``.

- ``agg_loss`` (0.7.0 line 772, 0.9.1 line 1140): :func:`pacs_fast.algorithms.aggregate_loss`;
  ``"seq-mean-token-sum-norm"`` is 0.9.1's definition and ``"token-sum-norm"`` is 0.7.0's
  ``"seq-mean-token-sum-norm"``;
- ``compute_grpo_outcome_advantage`` (0.7.0 line 265) and ``compute_rloo_outcome_advantage``
  (line 475): :func:`pacs_fast.algorithms.group_advantages`, including groups of one response;
- ``compute_policy_loss`` / ``compute_policy_loss_vanilla`` (lines 831 / 907; ``clip_ratio_c`` = 3.0):
  :func:`pacs_fast.algorithms.policy_loss` with its dual clip on by default;
- ``kl_penalty_forward`` (line 1614, ``"low_var_kl"``): ``kl_penalty(..., "k3", clamp=10)``;
- ``compute_gae_advantage_return`` (line 213) with ``verl/utils/torch_functional.py``'s
  ``masked_whiten``: :func:`pacs_fast.algorithms.gae` with ``whiten=True``.

Each ``_verl_*`` function below writes verl's formula out (transcribed, loops and all, with
verl's ``+ 1e-8`` denominators), so these tests mean something without verl installed. When
``verl.trainer.ppo.core_algos`` can be imported, the same inputs are also checked against the
real functions (``test_against_installed_verl``; skipped, saying why, when verl is absent).

Tolerances: float64 inputs; verl's masked means divide by ``count + 1e-8``, a relative change of
at most 1e-8 (one token), so rtol=1e-7 is loose enough for that and tight enough that any
different definition (a factor B, a missing clip) fails by orders of magnitude.
"""
from collections import defaultdict

import pytest
import torch

from pacs_fast.algorithms import aggregate_loss, gae, group_advantages, kl_penalty, policy_loss

VERL_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
# our mode -> (verl version, verl's mode) with the same definition
SAME_AS_VERL = {**{m: ("0.9.1", m) for m in VERL_MODES}, "token-sum": ("0.9.1", "token-sum"),
                **{m: ("0.7.0", m) for m in VERL_MODES[:3]}, "token-sum-norm": ("0.7.0", "seq-mean-token-sum-norm")}
TOL = dict(rtol=1e-7, atol=1e-10)


# -- verl's formulas, written out ----------------------------------------------------------------------
def _masked_sum(v, m):
    return (torch.where(m.bool(), v, 0.0) * m).sum()


def _masked_mean(v, m):
    return _masked_sum(v, m) / (m.sum() + 1e-8)


def _verl_agg_loss(loss_mat, loss_mask, mode, loss_scale_factor=None, version="0.9.1"):
    """core_algos.agg_loss of verl ``version`` (0.7.0 or 0.9.1) with dp_size=1, no global batch info."""
    if mode == "token-mean":
        return _masked_sum(loss_mat, loss_mask) / loss_mask.sum()
    if mode == "token-sum" and version == "0.9.1":
        return _masked_sum(loss_mat, loss_mask)
    if mode == "seq-mean-token-sum" or (mode == "seq-mean-token-sum-norm" and version == "0.9.1"):
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()
        loss = _masked_sum(seq_losses, seq_mask) / seq_mask.sum()
        if mode == "seq-mean-token-sum-norm":
            loss = loss / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
        return loss
    if mode == "seq-mean-token-mean":
        seq_count = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_count + 1e-8)
        seq_mask = (seq_count > 0).float()
        return _masked_sum(seq_losses, seq_mask) / seq_mask.sum()
    assert mode == "seq-mean-token-sum-norm" and version == "0.7.0", (mode, version)
    seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
    if loss_scale_factor is None:
        loss_scale_factor = loss_mask.shape[-1]
    return torch.sum(seq_losses) / loss_scale_factor


def _verl_group_advantage(scores, index, mode, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
    """compute_grpo_outcome_advantage (mode "grpo") / compute_rloo_outcome_advantage ("rloo")."""
    scores = scores.clone()
    id2score = defaultdict(list)
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
    id2mean, id2std = {}, {}
    for idx, group in id2score.items():
        if len(group) == 1:
            id2mean[idx], id2std[idx] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            id2mean[idx], id2std[idx] = torch.mean(torch.stack(group)), torch.std(torch.stack(group))
    for i in range(scores.shape[0]):
        g = len(id2score[index[i]])
        if mode == "rloo":
            if g > 1:
                scores[i] = scores[i] * g / (g - 1) - id2mean[index[i]] * g / (g - 1)
        elif norm_adv_by_std_in_grpo:
            scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
        else:
            scores[i] = scores[i] - id2mean[index[i]]
    return scores


def _verl_policy_loss(old_log_prob, log_prob, advantages, response_mask, cliprange_low, cliprange_high,
                      clip_ratio_c=3.0, loss_agg_mode="token-mean", loss_scale_factor=None):
    """compute_policy_loss_vanilla: clipped surrogate + dual clip for A < 0, then agg_loss."""
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = _masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = _masked_mean(torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(),
                                     response_mask)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    pg_loss = _verl_agg_loss(pg_losses, response_mask, loss_agg_mode, loss_scale_factor)
    ppo_kl = _masked_mean(-negative_approx_kl, response_mask)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


def _verl_low_var_kl(logprob, ref_logprob):
    kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)


def _verl_gae(token_level_rewards, values, response_mask, gamma, lam):
    nextvalues, lastgaelam, rev = 0, 0, []
    for t in reversed(range(token_level_rewards.shape[-1])):
        delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam
        rev.append(lastgaelam)
    advantages = torch.stack(rev[::-1], dim=1)
    returns = advantages + values
    mean = _masked_mean(advantages, response_mask)
    var = _masked_mean((advantages - mean) ** 2, response_mask)
    var = var * response_mask.sum() / (response_mask.sum() - 1)
    return (advantages - mean) * torch.rsqrt(var + 1e-8), returns


# -- inputs -------------------------------------------------------------------------------------------
def _batch(gen, B=6, T=7):
    """float64 per-token losses / log-probs, a 0/1 float mask with ragged rows and one empty row."""
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    lengths[B // 2] = 0
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    loss_mat = torch.randn(B, T, generator=gen, dtype=torch.float64)
    return loss_mat, mask


# -- the tests ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", sorted(SAME_AS_VERL))
def test_aggregate_loss_equals_verl_agg_loss(seed, mode):
    version, verl_mode = SAME_AS_VERL[mode]
    gen = torch.Generator().manual_seed(seed)
    loss_mat, mask = _batch(gen, B=int(torch.randint(2, 9, (1,), generator=gen)))
    tol = dict(TOL)
    if mode == "seq-mean-token-mean":  # verl divides each row by (tokens + 1e-8): each row's mean is off by up
        # to 1e-8 of itself (<= 1e-8 max |l|), which a result near 0 (rows of either sign) holds in full: seed
        # 3386255245 gave 0.0034445562 against 0.0034445576, 3.9e-7 relative, 1.4e-9 absolute
        tol["atol"] += 1e-8 * float(loss_mat.abs().max())
    torch.testing.assert_close(aggregate_loss(loss_mat, mask, mode),
                               _verl_agg_loss(loss_mat, mask, verl_mode, version=version), **tol)
    torch.testing.assert_close(aggregate_loss(loss_mat, mask.bool(), mode, horizon=11.0),
                               _verl_agg_loss(loss_mat, mask, verl_mode, loss_scale_factor=11.0, version=version),
                               **tol)


def test_both_of_verls_seq_mean_token_sum_norm_definitions_are_offered():
    """Issue 17 item 15: verl <= 0.7.0 (the PACS paper's scripts) summed over sequences under this
    name, a factor B from the mean; verl >= 0.7.1 takes the mean. The name follows current verl,
    the sum is ``token-sum-norm``; the trainer's dr_grpo uses the mean (Dr. GRPO's objective)."""
    from pacs_fast.config import AlgoConfig
    from pacs_fast.learner.objective import resolve_loss_agg

    loss_mat = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-sum-norm", horizon=4).item() == (3 + 15) / 2 / 4
    assert aggregate_loss(loss_mat, mask, "token-sum-norm", horizon=4).item() == (3 + 15) / 4
    assert _verl_agg_loss(loss_mat, mask, "seq-mean-token-sum-norm", 4, version="0.7.0").item() == (3 + 15) / 4
    assert resolve_loss_agg(AlgoConfig(name="dr_grpo")) == "seq-mean-token-sum-norm"


@pytest.mark.parametrize("group_size", [1, 2, 5])
@pytest.mark.parametrize("mode,norm_std", [("grpo", True), ("grpo", False), ("dr_grpo", True), ("rloo", True)])
def test_group_advantages_equal_verl(seed, group_size, mode, norm_std):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 2, (3 * group_size,), generator=gen).double()
    rewards[:group_size] = 1.0  # one group with a single label (std 0)
    index = [str(i // group_size) for i in range(rewards.shape[0])]
    verl_norm = norm_std and mode == "grpo"  # verl's dr_grpo = grpo with norm_adv_by_std_in_grpo=False
    expected = _verl_group_advantage(rewards, index, "rloo" if mode == "rloo" else "grpo",
                                     norm_adv_by_std_in_grpo=verl_norm)
    torch.testing.assert_close(group_advantages(rewards, group_size, mode, norm_std=norm_std), expected, **TOL)


def test_group_of_one_response_gets_its_reward_as_advantage():
    """Issue 17 item 15: a group of size 1 with norm_std=False gave 0 here and R in verl."""
    rewards = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    for mode in ("dr_grpo", "rloo"):
        assert group_advantages(rewards, 1, mode).tolist() == [1.0, 0.0, 1.0]
    assert group_advantages(rewards, 1, "grpo", norm_std=False).tolist() == [1.0, 0.0, 1.0]
    torch.testing.assert_close(group_advantages(rewards, 1, "grpo"), rewards / (1 + 1e-6), rtol=0, atol=0)


@pytest.mark.parametrize("mode", VERL_MODES)
def test_policy_loss_equals_verl_vanilla_with_dual_clip_by_default(seed, mode):
    gen = torch.Generator().manual_seed(seed)
    _, mask = _batch(gen)
    old = -torch.rand(mask.shape, generator=gen, dtype=torch.float64) * 3
    # ratios from ~0.05 to ~20 so that both clips and the dual clip (ratio > 3, A < 0) are active
    logp = (old + 3 * torch.randn(mask.shape, generator=gen, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(mask.shape[0], generator=gen, dtype=torch.float64)
    adv[0] = -abs(adv[0]) - 0.1  # row 0 (never empty): A < 0 with a ratio of e^2 > 3 at its first token
    with torch.no_grad():
        logp[0, 0] = old[0, 0] + 2.0
    ours, m = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, loss_agg_mode=mode, horizon=9.0)
    vlogp = logp.detach().clone().requires_grad_(True)
    ref, clipfrac, ppo_kl, clipfrac_lower = _verl_policy_loss(old, vlogp, adv[:, None], mask, 0.2, 0.28,
                                                              loss_agg_mode=mode, loss_scale_factor=9.0)
    tol = dict(TOL)
    if mode == "seq-mean-token-mean":
        # verl divides a row's sum S by (count + 1e-8), which moves the row mean by |S| 1e-8 / count^2;
        # the mean over rows can cancel down to a result ~1e3x smaller than its terms (one seed: 3e-7
        # relative). |S| <= sum over the row of |A| max(ratio, 1.28) (the dual clip only lowers it).
        token_bound = adv.abs()[:, None] * (logp - old).detach().exp().clamp(min=1.28) * mask
        count = mask.sum(-1)
        rows = count > 0
        shift = (token_bound.sum(-1)[rows] * 1e-8 / count[rows] ** 2).sum() / rows.sum()
        tol["atol"] = TOL["atol"] + 2 * float(shift)
    torch.testing.assert_close(ours, ref, **tol)
    torch.testing.assert_close(m["clip_frac"], clipfrac, **TOL)
    torch.testing.assert_close(m["dual_clip_frac"], clipfrac_lower, **TOL)
    torch.testing.assert_close(m["ppo_kl"], ppo_kl, **TOL)
    assert m["dual_clip_frac"].item() > 0  # the case really exercises the dual clip
    ours.backward()
    ref.backward()
    torch.testing.assert_close(logp.grad, vlogp.grad, **TOL)


def test_k3_with_clamp_10_equals_verl_low_var_kl(seed):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(5, 9, generator=gen, dtype=torch.float64) * 4
    ref = logp + 8 * torch.randn(5, 9, generator=gen, dtype=torch.float64)  # some past both clamps
    torch.testing.assert_close(kl_penalty(logp, ref, "k3", clamp=10.0), _verl_low_var_kl(logp, ref), **TOL)


def test_gae_with_whitening_equals_verl(seed):
    gen = torch.Generator().manual_seed(seed)
    _, mask = _batch(gen)
    mask[0, 1] = 0.0  # a hole inside a response (an observation token): verl skips it too
    rewards = torch.randn(mask.shape, generator=gen, dtype=torch.float64)
    values = torch.randn(mask.shape, generator=gen, dtype=torch.float64)
    adv, ret = gae(rewards, values, mask, gamma=0.99, lam=0.95, whiten=True)
    vadv, vret = _verl_gae(rewards, values, mask, 0.99, 0.95)
    sel = mask.bool()  # verl leaves arbitrary values at masked positions; ours are 0 there
    torch.testing.assert_close(adv[sel], vadv[sel], **TOL)
    torch.testing.assert_close(ret[sel], vret[sel], **TOL)


def _installed_verl():
    try:
        from verl.trainer.ppo import core_algos
    except Exception as e:  # ImportError, or one of verl's heavy dependencies failing at import
        pytest.skip(f"verl.trainer.ppo.core_algos cannot be imported here ({type(e).__name__}: {e}); "
                    f"the written-out formulas above cover the same definitions")
    return core_algos


@pytest.mark.filterwarnings("ignore:.*compute_policy_loss.*deprecated:FutureWarning")  # the plain-argument form
def test_against_installed_verl(seed):
    """The same definitions against the real functions, when verl is importable."""
    ca = _installed_verl()
    from importlib.metadata import version

    from packaging.version import Version

    old_norm = Version(version("verl")) < Version("0.7.1")  # the sum over sequences, then
    gen = torch.Generator().manual_seed(seed)
    loss_mat, mask = _batch(gen)
    for mode in VERL_MODES:
        ours = "token-sum-norm" if mode == "seq-mean-token-sum-norm" and old_norm else mode
        tol = TOL
        if mode == "seq-mean-token-mean":
            # verl divides each sequence's token sum by (count + 1e-8): each sequence mean is off by up to
            # 1e-8 of itself, and the mean over sequences can cancel to far below them (2.1e-10 off on
            # -6.7e-4, seed 4064573799): bounded by 1e-8 of the largest token loss (twice that for the
            # float64 rounding on top), not by a fraction of the result
            tol = dict(rtol=0, atol=2e-8 * float(loss_mat.abs().max()))
        torch.testing.assert_close(aggregate_loss(loss_mat, mask, ours),
                                   ca.agg_loss(loss_mat, mask, mode).to(torch.float64), **tol)
    if Version(version("verl")) >= Version("0.9.0"):
        torch.testing.assert_close(aggregate_loss(loss_mat, mask, "token-sum"),
                                   ca.agg_loss(loss_mat, mask, "token-sum").to(torch.float64), **TOL)
    rewards = torch.randint(0, 2, (8,), generator=gen).double()
    for G in (1, 4):
        index = [str(i // G) for i in range(8)]
        tok = torch.zeros(8, 3, dtype=torch.float64)
        tok[:, -1] = rewards
        ones = torch.ones(8, 3, dtype=torch.float64)
        for norm in (True, False):
            v, _ = ca.compute_grpo_outcome_advantage(tok, ones, index, norm_adv_by_std_in_grpo=norm)
            torch.testing.assert_close(group_advantages(rewards, G, "grpo", norm_std=norm), v[:, 0], **TOL)
        v, _ = ca.compute_rloo_outcome_advantage(tok, ones, index)
        torch.testing.assert_close(group_advantages(rewards, G, "rloo"), v[:, 0], **TOL)
    old = -torch.rand(mask.shape, generator=gen, dtype=torch.float64)
    logp = old + 2 * torch.randn(mask.shape, generator=gen, dtype=torch.float64)
    adv = torch.randn(mask.shape[0], generator=gen, dtype=torch.float64)
    for mode in VERL_MODES:
        agg = "token-sum-norm" if mode == "seq-mean-token-sum-norm" and old_norm else mode
        ours, _ = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, loss_agg_mode=agg)
        ref = ca.compute_policy_loss(old, logp, adv[:, None].expand_as(logp), mask, cliprange=0.2,
                                     cliprange_low=0.2, cliprange_high=0.28, loss_agg_mode=mode)[0]
        # verl's policy-loss path builds float32 masks / intermediates (e.g. ``.float()`` in agg_loss), so its
        # float64 result carries float32 rounding: one CI draw differed by 3.2e-7 relative. That rounding is of
        # the per-token losses (|adv| x a ratio the dual clip keeps <= 3), not of a result that cancels to near
        # 0 (seed 2972361206: 6.9e-4, 6.1e-9 off): 1e-6 x max |adv| absolute (~3 fp32 ulps of the largest
        # term). A wrong formula is off by O(1); the written-out formulas above keep the 1e-7 / 1e-10 bound.
        torch.testing.assert_close(ours, ref, rtol=2e-6, atol=1e-9 + 1e-6 * float(adv.abs().max()))
    torch.testing.assert_close(kl_penalty(logp, old, "k3", clamp=10.0), ca.kl_penalty(logp, old, "low_var_kl"),
                               **TOL)


def test_trainer_config_algo_clip_c_reaches_the_loss():
    """``algo.clip_c`` (default 3.0, verl's) is validated and passed to the policy loss by the
    learner's objective; 0 turns the dual clip off."""
    import dataclasses

    from pacs_fast.config import Config, validate
    from pacs_fast.learner.base import RolloutBatch
    from pacs_fast.learner.objective import minibatch_counts, objective

    cfg = Config()
    assert cfg.algo.clip_c == 3.0
    for bad in (1.0, 0.5, -3.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="algo.clip_c"):
            validate(dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, clip_c=bad)))
    B, T = 4, 3
    mask = torch.ones(B, T)
    old = torch.full((B, T), -1.0)
    logp = old + torch.tensor([[2.0, 0.0, 0.0]] * B)  # ratio e^2 > 3 at the first token of every row
    micro = RolloutBatch(input_ids=torch.zeros(B, T, dtype=torch.long), attention_mask=torch.ones(B, T,
                         dtype=torch.long), response_mask=mask, rewards=torch.tensor([1.0, 0.0, 0.0, 0.0]),
                         group_size=4, old_logp=old)
    counts = minibatch_counts(micro)
    losses = {}
    for c in (3.0, 0.0):
        algo = dataclasses.replace(cfg.algo, name="grpo", clip_c=c)
        losses[c], met = objective(algo, micro, logp, None, None, counts, horizon=T)
        expected, _ = policy_loss(logp, old, group_advantages(micro.rewards, 4, "grpo"), mask,
                                  clip_low=algo.clip_low, clip_high=algo.clip_high, clip_c=c or None)
        torch.testing.assert_close(losses[c], expected)
    assert losses[3.0] < losses[0.0]  # the three rows with A < 0 are capped at -A * 3 < -A * e^2
