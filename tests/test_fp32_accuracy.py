"""fp32 accuracy where a textbook form cancels (an audit of fp32 against float64 on the same inputs, cast up).

Each case is one the old form got wrong by far more than the quantity's conditioning allows, and each bound
is a few fp32 roundings of the quantity's own scale (said at each assertion): the BCE of a confident sample,
the log-prob of a confident token, the k3 KL estimator at small log-ratios, GRPO advantages of a group of equal
soft rewards, the leave-one-out baseline of near-equal process returns, and whitening a constant.
"""
import pytest
import torch
import torch.nn.functional as F

from pacs_fast.algorithms import group_advantages, kl_penalty, pacs_loss
from pacs_fast.algorithms.advantages import masked_whiten
from pacs_fast.algorithms.off_policy import correction_metrics
from pacs_fast.algorithms.process_rewards import process_advantages

EPS32 = 2.0 ** -24  # fp32's unit roundoff


def _pacs(backend):
    from functools import partial

    from pacs_fast.ops.pacs_loss import fused_pacs_loss

    return partial(pacs_loss, backend="torch") if backend == "torch" else fused_pacs_loss


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_the_bce_of_confident_samples_keeps_its_digits(backend):
    """psi = +-16, +-10 with the label it predicts, and psi = 6.9 with R = 0.999: softplus(psi) - R psi cancelled
    (0 for 1.1e-7 at psi = 16, R = 1) and autograd's sigmoid(psi) - R with it (34% off). The sample loss and its
    gradient within 8 roundings of their own size (the relative condition number is |psi| <= 16, but each
    form here takes the large linear part exactly)."""
    psi_want = torch.tensor([16.0, -16.0, 10.0, -10.0, 6.9, 0.0])
    R = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.999, 0.3])
    B = psi_want.numel()
    # score "naive" with proxy "logratio": psi_i = beta * sum_t (logp - logp_ref) over the one token of row i
    logp = (psi_want - 5.0)[:, None].clone().requires_grad_(True)
    logp_ref = torch.full((B, 1), -5.0)
    # the fused op itself for "triton": pacs_loss would fall back to the torch path if the kernel failed
    loss, terms = _pacs(backend)(logp, logp_ref, None, R, group_size=1, score="naive", weight_mode="none",
                                 proxy="logratio", return_terms=True)
    loss.backward()
    psi = terms["score"].double()
    Rd = R.double()
    want_loss = F.softplus(psi) - Rd * psi
    want_grad = (torch.sigmoid(psi) - Rd) / B
    got_loss = terms["sample_loss"].double()
    assert ((got_loss - want_loss).abs() <= 8 * EPS32 * want_loss.abs()).all(), (got_loss, want_loss)
    # sigmoid(psi) - R is a difference of two terms of at most min(sigmoid, 1 - sigmoid) and min(R, 1 - R) after
    # the exact linear part: within 8 roundings of those (psi = 6.9 with R = 0.999 sits at the optimum, where
    # the difference cancels whatever the form: 1e-3 - 1.007e-3)
    sig = torch.sigmoid(psi)
    scale = want_grad.abs() + (torch.minimum(sig, 1 - sig) + torch.minimum(Rd, 1 - Rd)) / B
    got_grad = logp.grad.double().reshape(-1)
    assert ((got_grad - want_grad).abs() <= 8 * EPS32 * scale).all(), (got_grad, want_grad)


def test_k3_at_small_log_ratios_keeps_its_digits(seed):
    """e^d - 1 - d at |d| <= 1e-4 is ~d^2/2: expm1(d) - d kept eps / |d| of it (100% over 4k tokens) and its
    gradient (expm1(d) + 1) - 1 as much. Value and gradient within 8 roundings of themselves, the mean over the
    tokens too (a sum of positive terms: no cancellation left); the two metrics that log it likewise."""
    gen = torch.Generator().manual_seed(seed)
    d = (torch.rand(4096, generator=gen) * 2 - 1) * 1e-4
    d[0], d[1], d[2] = 0.3, -0.7, 3.0  # both sides of the series' edge at |d| = 1/2
    logp = torch.zeros_like(d, requires_grad=True)
    kl = kl_penalty(logp, d, "k3")  # d = logp_ref - logp
    kl.sum().backward()
    dd = d.double()
    want = _k3_exact(d)  # (float64's expm1(d) - d cancels too: 77 fp32 roundings at d = 5e-11)
    assert ((kl.double() - want).abs() <= 8 * EPS32 * want).all()
    assert ((logp.grad.double() + torch.expm1(dd)).abs() <= 8 * EPS32 * torch.expm1(dd).abs()).all()
    mask = torch.ones(1, d.numel(), dtype=torch.bool)
    lr = -d[None]  # the metric's k3 is in log(pi / mu) = -d with d = log(mu / pi)
    m = correction_metrics(lr, mask, torch.ones_like(lr), mask, cap=2.0)
    want_mean = _k3_exact(-d).mean().item()
    assert abs(m["kl_k3"] - want_mean) <= 8 * EPS32 * want_mean


def _k3_exact(d: torch.Tensor) -> torch.Tensor:
    """e^d - 1 - d of each fp32 value, in 40-digit arithmetic (mpmath), as float64."""
    import mpmath

    with mpmath.workdps(40):
        return torch.tensor([float(mpmath.expm1(mpmath.mpf(x)) - mpmath.mpf(x)) for x in d.double().tolist()],
                            dtype=torch.float64)


@pytest.mark.parametrize("eps", [1e-6, 0.0])
def test_a_group_of_equal_soft_rewards_has_advantage_zero(eps):
    """Centred on its fp32 mean, a group of eight 0.1s was off by one ulp, and 1 / (std + eps) made that
    |A| up to 0.1 (0.8-0.99 with eps = 0), every response the same sign: exactly 0 now."""
    values = [0.1, 0.3, 0.7, 0.9, 0.99, -0.1, 1.3, 1.0 / 3]
    rewards = torch.tensor(values).repeat_interleave(8)
    for mode in ("grpo", "dr_grpo", "rloo"):
        adv = group_advantages(rewards, 8, mode, eps=eps)
        assert (adv == 0).all(), (mode, adv.view(-1, 8)[:, 0])


def test_near_equal_process_returns_keep_their_leave_one_out_baseline(seed):
    """First-step returns near 1 with a spread of 1e-3: (sum - v) / (G - 1) lost 4 digits (1.7e-4 of max |A|).
    The advantages are differences of fp32 returns, which near-equal values take exactly: within 8 roundings
    of the largest advantage."""
    gen = torch.Generator().manual_seed(seed)
    G, K = 8, 3
    step_rewards = 1.0 - torch.rand(4 * G, K, generator=gen) * 1e-3
    mask = torch.ones(4 * G, K, dtype=torch.bool)
    got = process_advantages(step_rewards, mask, G, form="min")
    want = process_advantages(step_rewards.double(), mask, G, form="min")
    assert (got.double() - want).abs().max().item() <= 8 * EPS32 * want.abs().max().item()


def test_whitening_a_constant_gives_zero():
    """verl's masked_whiten of a constant is c 1e-8 / (n + 1e-8) / sqrt(1e-8) (~1e-4 c / n); its fp32 mean's
    rounding gave up to 2.4e-3. Within 8 roundings of that true value's scale, masked entries 0."""
    x = torch.full((4, 300), 0.7)
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[:, 250:] = False
    x[~mask] = float("nan")  # never read
    got = masked_whiten(x, mask)
    want = masked_whiten(x.double(), mask)
    assert (got[~mask] == 0).all()
    assert (got.double() - want).abs().max().item() <= 8 * EPS32 * max(want.abs().max().item(), 1e-4)


def test_packed_row_sums_on_the_cpu_are_as_accurate_as_padded_ones(seed):
    """A packed row's proxy is a segment sum; on the CPU torch.segment_reduce sums a segment in one
    sequential pass (the padded .sum is pairwise): at 32k tokens fp32 kept 8.7e-6 of the sum for 6.1e-8.
    Within 8 roundings of the sum of |terms| for rows of 32k, 1k and 1 tokens."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [32768, 1000, 1]
    logp = -torch.rand(sum(lengths), generator=gen) * 3
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    r = pacs_loss(logp.requires_grad_(True), None, None, torch.tensor([1.0, 0.0, 1.0]), group_size=3,
                  proxy="mean_logp", cu_seqlens=cu, return_terms=True, backend="torch")[1]["proxy"]
    for i, n in enumerate(lengths):
        seg = logp.detach()[cu[i]:cu[i + 1]].double()
        assert abs(r[i].item() - seg.mean().item()) <= 8 * EPS32 * seg.abs().mean().item(), (n, r[i].item())


def test_gae_over_a_long_response_keeps_its_digits(seed):
    """gamma = lam = 1 (the defaults) over 16k tokens: an fp32 recursion accumulated 2.8e-6 of max |A| (47
    roundings). Advantages and returns within 2 roundings of their largest value (the final cast to fp32)."""
    from pacs_fast.algorithms.advantages import gae

    gen = torch.Generator().manual_seed(seed)
    B, T = 4, 16384
    rewards = torch.zeros(B, T)
    rewards[:, -1] = (torch.rand(B, generator=gen) < 0.5).float()  # an outcome reward on the last token
    values = 0.5 + 0.3 * torch.randn(B, T, generator=gen)  # a critic's values around 0.5
    adv, ret = gae(rewards, values, None, whiten=False)
    adv64, ret64 = gae(rewards.double(), values.double(), None, whiten=False)
    assert adv.dtype == ret.dtype == torch.float32
    assert (adv.double() - adv64).abs().max().item() <= 2 * EPS32 * adv64.abs().max().item()
    assert (ret.double() - ret64).abs().max().item() <= 2 * EPS32 * ret64.abs().max().item()


def test_k3_saves_one_tensor_and_takes_second_order_and_torch_func():
    """The series would keep ~15 intermediates of the input's size for its backward; k3 keeps d alone and its
    gradient stays differentiable (the README's promise for the baselines' losses: create_graph and torch.func)."""
    from pacs_fast.algorithms._stable import k3

    saved = []
    d = torch.randn(64, dtype=torch.float64, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        k3(d).sum()
    assert saved == [d.shape]
    assert torch.autograd.gradgradcheck(k3, (d[:6].detach().requires_grad_(True),))
    grad = torch.func.grad(lambda x: kl_penalty(x, torch.zeros_like(x), "k3").sum())(d.detach())
    assert torch.allclose(grad, -torch.expm1(-d.detach()))  # d/dlogp of k3(logp_ref - logp)


@pytest.mark.parametrize("op", ["token_logprobs", "linear_logprobs"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_the_log_prob_of_a_confident_token_keeps_its_digits(op, backend, seed, monkeypatch):
    """Logits ~300 whose target leads the others by 12-20: logp = -log(1 + delta), delta = 1e-7 to 4e-4 (float64
    reference of the same fp32 logits). ``target - lse`` with one fp32 ``lse = m + log s`` rounded log s to
    ulp(300) = 3e-5, up to 256 fp32 roundings of 1 off (163-256 over 300 draws of the old form); now
    ``(target - m) - log s``, where ``target - m`` is exact (within 2x of each other) and ``log s`` carries the
    rounding of ``s = 1 + delta``: each addition into a partial sum near 1 rounds by up to one EPS32, bounded here
    by 16 of them (measured <= 6.2 on 200 draws, both backends). Rows whose target trails by 16-20 (logp ~ -20)
    too, to their own scale."""
    from pacs_fast.kernels import dispatch
    from pacs_fast.ops.linear_logprobs import linear_logprobs
    from pacs_fast.ops.token_logprobs import token_logprobs

    def no_fallback(family, kernel, err, key=None):  # [triton]: the kernel itself, not the torch path behind it
        raise AssertionError(f"{family} {kernel} fell back: {err!r}")
    monkeypatch.setattr(dispatch, "broken", lambda *a, **k: False)
    monkeypatch.setattr(dispatch, "failed", no_fallback)
    gen = torch.Generator().manual_seed(seed)
    N, V = 24, 64
    x = 300 + 4 * torch.rand(N, 1, generator=gen) - (16 + 4 * torch.rand(N, V, generator=gen))
    labels = torch.randint(0, V, (N,), generator=gen)
    lead = torch.arange(N) % 4 != 0  # three rows in four: the target is the confident max
    x[lead, labels[lead]] = x[lead].max(1).values + 12 + 4 * torch.rand(int(lead.sum()), generator=gen)
    x[~lead, 0] = 304 + torch.rand(int((~lead).sum()), generator=gen)  # another token leads; labels != 0 there
    labels[~lead] = 1 + labels[~lead] % (V - 1)
    if op == "token_logprobs":
        got = token_logprobs(x, labels, backend=backend)
    else:  # hidden @ I = the logits exactly (products by 1 and 0)
        got = linear_logprobs(x, torch.eye(V), labels, backend=backend)
    want = torch.log_softmax(x.double(), -1).gather(1, labels[:, None]).squeeze(1)
    assert float(want[lead].min()) > -1e-3 and float(want[~lead].max()) < -10  # the rows are what they say
    err = (got.double() - want).abs()
    assert (err <= 16 * EPS32 * (1 + want.abs())).all(), (err / EPS32).max()


def test_whitening_half_precision_inputs_computes_in_fp32(seed):
    """masked_whiten on bf16 / fp16 advantages: it summed in the input dtype, so fp16's token count of 131,072
    was inf (every output NaN) and bf16's sums over 32k tokens kept ~3 digits (7.9e-3 off in an audit). Now fp32
    inside, one rounding to the input dtype at the end: within half an ulp of the float64 result of the same
    inputs, plus fp32's own (negligible) error."""
    gen = torch.Generator().manual_seed(seed)
    for dtype, shape in ((torch.float16, (8, 16384)), (torch.bfloat16, (8, 4096))):
        x = (torch.randn(shape, generator=gen) * 2 + 0.5).to(dtype)
        mask = torch.arange(shape[1])[None, :] < torch.randint(shape[1] // 2, shape[1] + 1, (shape[0], 1),
                                                                 generator=gen)
        got = masked_whiten(x, mask)
        want = masked_whiten(x.double(), mask)
        assert got.dtype == dtype and bool(torch.isfinite(got).all())
        half_ulp = torch.finfo(dtype).eps / 2  # the unit roundoff of dtype (eps is the gap above 1)
        err = (got.double() - want).abs()
        assert (err <= half_ulp * want.abs() * 1.01 + 1e-6).all(), (dtype, float((err / want.abs()).max()))


@pytest.mark.parametrize("loss_name", ["policy_loss", "gspo", "cispo"])
def test_a_bf16_logp_gradient_with_a_kl_penalty_is_rounded_once(loss_name, seed):
    """bf16 log-probs with a KL penalty: the surrogate and the KL term each cast logp to fp32, so their gradients
    were each rounded to bf16 and then added in bf16 (9.7% of entries one bf16 step off in the bf16 audit). Now one
    cast: the gradient is the fp32 computation's (fp32 copy of the same logp) rounded once, entry for entry."""
    from pacs_fast.algorithms.policy_loss import policy_loss
    from pacs_fast.algorithms.sequence_losses import cispo_policy_loss, gspo_policy_loss

    fn = {"policy_loss": policy_loss, "gspo": gspo_policy_loss, "cispo": cispo_policy_loss}[loss_name]
    gen = torch.Generator().manual_seed(seed)
    B, T = 8, 512
    base = -3 * torch.rand(B, T, generator=gen)
    old = base + 0.05 * torch.randn(B, T, generator=gen)
    ref = base + 0.05 * torch.randn(B, T, generator=gen)
    adv = torch.randn(B, generator=gen)
    mask = torch.rand(B, T, generator=gen) < 0.9
    grads = {}
    for dtype in (torch.bfloat16, torch.float32):
        logp = base.to(torch.bfloat16).to(dtype).requires_grad_(True)  # the same values
        loss, _ = fn(logp, old, adv, mask, logp_ref=ref, kl_coef=0.05)
        loss.backward()
        grads[dtype] = logp.grad
    assert grads[torch.bfloat16].dtype == torch.bfloat16 and grads[torch.float32].abs().max() > 0
    assert torch.equal(grads[torch.bfloat16], grads[torch.float32].to(torch.bfloat16))
