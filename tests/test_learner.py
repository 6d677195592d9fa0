"""TorchLearner: log-probs from hidden states, exact micro-batch accumulation, checkpoint state,
Hugging Face export, reference reset."""
import copy
import random

import pytest
import torch

from pacs_fast.config import AlgoConfig, LearnerConfig
from pacs_fast.learner import RolloutBatch, TorchLearner, minibatch_counts, objective
from pacs_fast.trainer.batch import build_batch


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pacs_fast.data.tiny import make_tiny_model
    path = make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0, hidden_size=64, num_layers=1, num_heads=2,
                           num_kv_heads=1, intermediate_size=96)
    return path, AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def fresh(tiny, seed):
    _, model, _ = tiny
    m = copy.deepcopy(model)
    torch.manual_seed(seed)
    with torch.no_grad():  # move away from the shared initialisation so every test sees new weights
        for p in m.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return m


def random_batch(seed, groups=4, G=4, vocab=90):
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(2, 6))] for _ in range(groups)]
    responses = [[[rng.randrange(3, vocab) for _ in range(rng.randint(1, 7))] for _ in range(G)] for _ in range(groups)]
    rewards = [float(rng.random() < 0.5) for _ in range(groups * G)]
    if G > 1 and all(len(set(rewards[g * G:(g + 1) * G])) == 1 for g in range(groups)):
        rewards[0] = 1.0 - rewards[0]  # one group with both labels: a batch of uniform groups trains nothing (1 draw
        # in 10,000: CI seed 3567359197 moved no parameter, and "the steps did something" failed)
    return build_batch(prompts, responses, rewards, pad_id=0)


def make_learner(model, algo="pacs", mini=4, micro=4, **algo_kw):
    return TorchLearner(model, algo=AlgoConfig(name=algo, **algo_kw),
                        learner=LearnerConfig(lr=1e-2, mini_batch_prompts=mini, micro_batch_prompts=micro),
                        temperature=1.0, horizon=8)


def prepare(learner, batch):
    batch.old_logp = learner.compute_logprobs(batch)
    if learner.needs_ref:
        batch.ref_logp = (learner.compute_logprobs(batch, reference=True) if learner.ref_model is not None
                          else batch.old_logp)
    if learner.has_value_head:
        from pacs_fast.algorithms import gae
        from pacs_fast.trainer.batch import outcome_token_rewards
        batch.old_values = learner.compute_values(batch)
        batch.advantages, batch.returns = gae(outcome_token_rewards(batch), batch.old_values, batch.response_mask)
    return batch


def test_logprobs_and_entropy_match_full_logits(tiny, seed):
    model = fresh(tiny, seed)
    learner = make_learner(model, micro=2)
    batch = random_batch(seed)
    logp, ent = learner.compute_logprobs(batch, return_entropy=True)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids).logits.double()
    lsm = torch.log_softmax(logits[:, :-1], -1)
    ref = torch.zeros_like(logp, dtype=torch.float64)
    ref[:, 1:] = lsm.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    ref_ent = torch.zeros_like(ref)
    ref_ent[:, 1:] = -(lsm.exp() * lsm).sum(-1)
    m = batch.response_mask.bool()
    assert torch.allclose(logp[m].double(), ref[m], atol=1e-5)
    assert torch.allclose(ent[m].double(), ref_ent[m], atol=1e-5)
    assert (logp[~m] == 0).all() and (ent[~m] == 0).all()


@pytest.mark.parametrize("algo, kw", [("pacs", {}), ("pacs", {"score": "grpo", "weight": "none"}),
                                      ("grpo", {}), ("dr_grpo", {}), ("rloo", {"kl_coef": 0.1}), ("ppo", {})])
def test_micro_batches_accumulate_to_the_mini_batch_gradient(tiny, seed, algo, kw):
    batch = random_batch(seed)
    base = fresh(tiny, seed)
    noise = 0.1 * torch.randn(batch.input_ids.shape) * batch.response_mask
    results = []
    for micro in (4, 1):
        learner = make_learner(copy.deepcopy(base), algo=algo, mini=4, micro=micro, **kw)
        # plain SGD (lr 1): the parameter change is exactly the accumulated gradient
        learner.optimizer = torch.optim.SGD(learner._params(), lr=1.0)
        learner.cfg.grad_clip = 0.0
        b = prepare(learner, copy.deepcopy(batch))
        if learner.needs_ref and algo == "pacs":  # a non-trivial reference so the proxy is not 0
            b.ref_logp = b.old_logp + noise
        metrics = learner.update(b, seed=seed)
        assert metrics["grad_norm"] > 0
        results.append(([p.detach().clone() for p in learner._params()], metrics))
    (p1, m1), (p2, m2) = results
    # every logged metric (loss, clip fractions, KL estimates, the advantages' means) is the
    # mini-batch's, whatever its micro-batches: the rows have 2..13 tokens, so weighting a per-row
    # mean by the micro-batch's token share (not its row share) moved it by 0.3-4% (seeds 1-3)
    assert set(m1) == set(m2)
    for k in m1:
        if k != "grad_norm" and not k.startswith("forward/"):  # forward/*: how many forwards ran, by design not
            assert m1[k] == pytest.approx(m2[k], rel=1e-4, abs=1e-6), k
    start = [p.detach() for p in base.parameters()]
    for a, b, s in zip(p1, p2, start):
        # fp32: one micro-batch or four run other shapes (and learner.packing=auto may pack one and not
        # the other), so the sums round differently; grpo's 1/std amplifies that (measured 3e-5 of a
        # tensor's largest change for one seed), so the absolute part follows that largest change
        assert torch.allclose(a - s, b - s, atol=max(1e-6, 1e-4 * float((b - s).abs().max())), rtol=1e-4)
    assert any(not torch.equal(a, s) for a, s in zip(p1, start))


def test_objective_is_the_pacs_loss_on_one_micro_batch(tiny, seed):
    from pacs_fast.algorithms import pacs_loss
    model = fresh(tiny, seed)
    learner = make_learner(model)
    batch = prepare(learner, random_batch(seed))
    logp = batch.old_logp + 0.05 * torch.randn_like(batch.old_logp)
    algo = AlgoConfig(beta=0.7)
    loss, metrics = objective(algo, batch, logp, None, None, minibatch_counts(batch), horizon=8)
    want = pacs_loss(logp, batch.ref_logp, batch.response_mask, batch.rewards, group_size=4, beta=0.7)
    assert torch.allclose(loss, want)
    assert metrics["psi"].shape == (batch.num_rows,)
    # half the groups, scaled by their share, plus the other half == the whole
    parts = [objective(algo, batch.groups(g), logp[torch.as_tensor(g).repeat_interleave(4) * 4
                                                   + torch.arange(4).repeat(len(g))][:, :batch.groups(g).input_ids.shape[1]],
                       None, None, minibatch_counts(batch), horizon=8)[0] for g in ([0, 1], [2, 3])]
    assert torch.allclose(sum(parts), want, atol=1e-6)


def test_groups_keep_whole_groups_and_trim(seed):
    batch = random_batch(seed, groups=5, G=3)
    sub = batch.groups([4, 1])
    assert sub.num_rows == 6 and sub.group_size == 3
    assert torch.equal(sub.rewards, torch.cat([batch.rewards[12:15], batch.rewards[3:6]]))
    assert sub.input_ids.shape[1] == int(sub.attention_mask.sum(-1).max())
    with pytest.raises(ValueError, match="group_size"):
        RolloutBatch(batch.input_ids, batch.attention_mask, batch.response_mask, batch.rewards, group_size=4)


def test_state_dict_resumes_identically_and_hf_export_loads(tiny, seed, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    path, _, tok = tiny
    b1, b2 = random_batch(seed), random_batch(seed + 1)
    a = make_learner(fresh(tiny, seed))
    a.update(prepare(a, b1), seed=1)
    a.save_hf(tmp_path / "ck")
    state = copy.deepcopy(a.state_dict())
    a.update(prepare(a, copy.deepcopy(b2)), seed=2)

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ck")  # transformers reads the export
    b = make_learner(loaded)
    b.load_hf_weights(load_file(str(tmp_path / "ck" / "model.safetensors")).items())
    b.load_state_dict(state)
    b.update(prepare(b, copy.deepcopy(b2)), seed=2)
    for (n1, t1), (n2, t2) in zip(a.export_hf_weights(), b.export_hf_weights()):
        assert n1 == n2 and torch.equal(t1, t2), n1
    names = [n for n, _ in a.export_hf_weights()]
    assert "lm_head.weight" not in names and len(names) == len(set(names))  # tied head exported once


def test_fixed_reference_reset(tiny, seed):
    learner = make_learner(fresh(tiny, seed), algo="pacs", ref="fixed")
    assert learner.ref_model is not None and learner.needs_ref
    batch = prepare(learner, random_batch(seed))
    learner.update(batch, seed=0)
    ref_sd, pol_sd = learner.ref_model.state_dict(), learner.model.state_dict()
    assert any(not torch.equal(ref_sd[k], pol_sd[k]) for k in pol_sd)
    assert len(learner.optimizer.state) > 0
    learner.reset_reference(reset_optimizer=True)
    assert all(torch.equal(learner.ref_model.state_dict()[k], pol_sd[k]) for k in pol_sd)
    assert len(learner.optimizer.state) == 0
    lp = learner.compute_logprobs(batch)
    assert torch.equal(lp, learner.compute_logprobs(batch, reference=True))


def test_rollout_reference_keeps_no_model(tiny, seed):
    learner = make_learner(fresh(tiny, seed))
    assert learner.ref_model is None and learner.needs_ref
    with pytest.raises(ValueError, match="keeps no reference model"):
        learner.compute_logprobs(random_batch(seed), reference=True)


@pytest.mark.parametrize("algo", ["pacs", "grpo"])
def test_updates_favour_rewarded_responses(tiny, seed, algo):
    """The policy moves towards the responses the verifier rewarded (and away from the others)."""
    learner = make_learner(fresh(tiny, seed), algo=algo)
    batch = random_batch(seed)
    batch.rewards = (torch.arange(batch.num_rows) % 2).float()  # mixed labels in every group
    good = batch.rewards > 0.5

    def gap():
        s = learner.compute_logprobs(batch).sum(-1)
        return float(s[good].mean() - s[~good].mean())

    before = gap()
    for i in range(3):
        learner.update(prepare(learner, batch), seed=i)
    assert gap() > before + 0.5


@pytest.mark.parametrize("algo, kw, mini, micro, epochs", [
    ("pacs", {}, 4, 2, 1),                        # one mini-batch: every old log-prob from the update's forward
    ("pacs", {"score": "grpo"}, 2, 1, 2),         # later mini-batches and a second epoch use the no-grad pass
    ("pacs", {"ref": "fixed"}, 3, 3, 1),          # fixed reference: only the old log-probs fuse
    ("grpo", {"clip_low": 0.1}, 4, 4, 1),
    ("rloo", {"kl_coef": 0.1}, 2, 2, 1),
])
def test_fused_old_logprobs_equal_a_separate_pass(tiny, seed, algo, kw, mini, micro, epochs):
    """update() with old_logp=None (filled from the first mini-batch's forward) takes the same steps
    and fills the same old / reference log-probs and entropies as the separate no-grad pass."""
    runs = {}
    for fused in (False, True):
        model = fresh(tiny, seed)
        # eps >> |grad|: Adam's step is ~ (lr / eps) * grad, linear, so float rounding in the gradients
        # is not amplified the way Adam's sign-like first step amplifies it for near-zero components
        learner = TorchLearner(model, algo=AlgoConfig(name=algo, **kw),
                               learner=LearnerConfig(lr=10.0, eps=1e3, mini_batch_prompts=mini,
                                                     micro_batch_prompts=micro, epochs=epochs),
                               temperature=1.0, horizon=8)
        assert learner.fuses_old_logprobs
        batch = random_batch(seed)
        if fused:
            if learner.ref_model is not None:
                batch.ref_logp = learner.compute_logprobs(batch, reference=True)
        else:
            prepare(learner, batch)
            batch.old_entropy = learner.compute_logprobs(batch, return_entropy=True)[1]
        metrics = learner.update(batch, seed=seed)
        runs[fused] = (batch, metrics, [p.detach().clone() for p in model.parameters()])
    (b0, m0, p0), (b1, m1, p1) = runs[False], runs[True]
    assert b1.old_logp is not None and b1.old_entropy is not None
    assert torch.allclose(b1.old_logp, b0.old_logp, atol=1e-5)
    assert torch.allclose(b1.old_entropy, b0.old_entropy, atol=1e-5)
    assert float(b1.old_entropy[b1.response_mask > 0].abs().sum()) > 0
    if algo == "pacs" and kw.get("ref") != "fixed":
        assert b1.ref_logp is b1.old_logp
    else:
        assert b1.ref_logp is None or torch.allclose(b1.ref_logp, b0.ref_logp)
    assert m1["optimizer_steps"] == m0["optimizer_steps"] == epochs * -(-4 // mini)
    assert m1["loss"] == pytest.approx(m0["loss"], abs=1e-5)
    start = [p.detach() for p in fresh(tiny, seed).parameters()]
    moved = max(float((a - b).abs().max()) for a, b in zip(p0, start))
    assert moved > 1e-5  # the steps did something
    assert max(float((a - b).abs().max()) for a, b in zip(p0, p1)) < 1e-3 * moved


def test_no_fusion_with_dropout_or_ppo(tiny, seed):
    """Train and eval forwards differ under dropout (and PPO needs values first): those learners keep the
    separate pass and reject a batch without old_logp with a clear error."""
    model = fresh(tiny, seed)
    model.config.attention_dropout = 0.1
    learner = make_learner(model)
    assert not learner.fuses_old_logprobs
    with pytest.raises(ValueError, match="old_logp is None"):
        learner.update(random_batch(seed), seed=0)
    assert not make_learner(fresh(tiny, seed), algo="ppo").fuses_old_logprobs


@pytest.mark.parametrize("shares", [1, 2, 3])
def test_by_length_sorts_and_deals_balanced_shares(seed, shares):
    from pacs_fast.learner.base import by_length, dealt_rows_to_sorted
    batch = random_batch(seed, groups=6 * shares, G=3)
    ids = torch.randperm(batch.num_groups, generator=torch.Generator().manual_seed(seed))
    longest = batch.attention_mask.sum(-1).view(-1, 3).max(-1).values
    plain = by_length(ids, batch)
    assert sorted(plain.tolist()) == sorted(ids.tolist())
    assert bool((longest[plain].diff() >= 0).all())
    dealt = by_length(ids, batch, shares=shares)
    k = len(ids) // shares
    for r in range(shares):  # each contiguous share: sorted, and every shares-th group of the sorted list
        assert torch.equal(dealt[r * k:(r + 1) * k], plain[r::shares])
    # per-row values laid out in the dealt order come back in the sorted order
    rows_dealt = (dealt[:, None] * 3 + torch.arange(3)).reshape(-1)
    rows_sorted = (plain[:, None] * 3 + torch.arange(3)).reshape(-1)
    values = torch.randn(batch.num_rows)
    assert torch.equal(values[rows_dealt][dealt_rows_to_sorted(len(ids), shares, 3)], values[rows_sorted])
    key = torch.randn(batch.num_groups)  # any other sort key (the learner's: length past the shared prefix)
    assert bool((key[by_length(ids, batch, lengths=key)].diff() >= 0).all())


def test_micro_batches_sorted_by_length_past_the_common_prefix(tiny, seed):
    """The shared-prefix learner's sort key: each group's longest row minus its rows' longest
    common prefix (checked by brute force)."""
    batch = random_batch(seed, groups=5, G=3)
    batch.input_ids[4, :] = batch.input_ids[3, :]  # identical rows: a common prefix into the responses
    batch.attention_mask[4] = batch.attention_mask[3]
    batch.response_mask[4] = batch.response_mask[3]
    key = make_learner(fresh(tiny, seed), algo="pacs")._rest_lengths(batch)
    lengths = batch.attention_mask.sum(-1).long().tolist()
    for k in range(5):
        rows = [batch.input_ids[i, :lengths[i]].tolist() for i in range(3 * k, 3 * k + 3)]
        p = 0
        while p < min(map(len, rows)) and len({r[p] for r in rows}) == 1:
            p += 1
        assert int(key[k]) == max(map(len, rows)) - p


def _correct_with(is_level, cap):
    """A ``correct=`` for update(): truncated IS weights at ``is_level`` (no rejection), in place."""
    from pacs_fast.algorithms.off_policy import off_policy_correction

    def correct(rows, proximal):
        w, kept, _ = off_policy_correction(proximal.float().cpu(), rows.behaviour_logp.float().cpu(),
                                           rows.response_mask.cpu() > 0, is_level=is_level, is_cap=cap)
        rows.is_weights, rows.kept_mask = w.to(rows.response_mask), kept.to(rows.response_mask)
    return correct


def _behaviour(learner, batch, seed):
    """Engine-like log-probs: the learner's own, shifted by noise per token, with row 0 well below
    (its weights exceed any cap >= 1 < e^0.2): weights spread around 1 and some are truncated."""
    gen = torch.Generator().manual_seed(seed)
    noise = 0.4 * torch.randn(batch.response_mask.shape, generator=gen)
    noise[0] = -noise[0].abs() - 0.2
    return (learner.compute_logprobs(batch) + noise) * batch.response_mask


@pytest.mark.parametrize("algo, is_level, mini, micro, epochs", [
    ("pacs", "sequence", 4, 2, 1),   # one mini-batch of two micro-batches: every weight from the update's forward
    ("pacs", "sequence", 2, 1, 2),   # later mini-batches and a second epoch: the no-grad pass's weights, kept
    ("grpo", "token", 4, 4, 1),
    ("rloo", "sequence", 2, 2, 2),
])
def test_fused_correction_equals_a_separate_pass(tiny, seed, algo, is_level, mini, micro, epochs):
    """update(correct=...) sets each row's IS weights from the update's own first forward (the proximal
    policy) and takes the same steps as weights set from a separate no-grad pass before the update.
    Bounds: the two forwards differ only by float32 summation order (micro-batch shapes), ~1e-6 in a
    log-prob, so ~1e-5 in a weight <= cap; the step bound is the one of the fused old log-probs above."""
    runs = {}
    for fused in (False, True):
        model = fresh(tiny, seed)
        learner = TorchLearner(model, algo=AlgoConfig(name=algo),
                               learner=LearnerConfig(lr=10.0, eps=1e3, mini_batch_prompts=mini,
                                                     micro_batch_prompts=micro, epochs=epochs),
                               temperature=1.0, horizon=8)
        assert learner.fuses_correction
        batch = random_batch(seed)
        batch.behaviour_logp = _behaviour(learner, batch, seed)
        correct = _correct_with(is_level, cap=1.2)
        if fused:
            metrics = learner.update(batch, seed=seed, correct=correct)
        else:
            prepare(learner, batch)
            correct(batch, batch.old_logp)
            metrics = learner.update(batch, seed=seed)
        runs[fused] = (batch, metrics, [p.detach().clone() for p in model.parameters()])
    (b0, m0, p0), (b1, m1, p1) = runs[False], runs[True]
    resp = b0.response_mask > 0
    assert float(b0.is_weights[resp].std()) > 0.01 and bool((b0.is_weights[resp] == 1.2).any())  # non-trivial
    assert torch.allclose(b1.is_weights, b0.is_weights, atol=1e-5)
    assert torch.equal(b1.kept_mask, b0.kept_mask)
    assert m1["loss"] == pytest.approx(m0["loss"], abs=1e-5)
    start = [p.detach() for p in fresh(tiny, seed).parameters()]
    moved = max(float((a - b).abs().max()) for a, b in zip(p0, start))
    assert moved > 1e-5
    assert max(float((a - b).abs().max()) for a, b in zip(p0, p1)) < 1e-3 * moved


def test_fused_correction_refuses_rejection_and_a_given_old_logp(tiny, seed):
    """Rejection changes the mini-batch's denominators, counted before the fused forwards: refused;
    so is correct= with old_logp already given (the caller corrects then)."""
    from pacs_fast.algorithms.off_policy import off_policy_correction
    learner = make_learner(fresh(tiny, seed))
    batch = random_batch(seed)
    batch.behaviour_logp = _behaviour(learner, batch, seed)

    def rejecting(rows, proximal):
        w, kept, _ = off_policy_correction(proximal.float(), rows.behaviour_logp, rows.response_mask > 0,
                                           is_level="sequence", rs_level="sequence", rs_low=0.9, rs_high=1.1)
        rows.is_weights, rows.kept_mask = w, kept.float()
    with pytest.raises(ValueError, match="rejected tokens"):
        learner.update(batch, seed=0, correct=rejecting)
    with pytest.raises(ValueError, match="correct= is for the fused old log-probs"):
        learner.update(prepare(learner, random_batch(seed)), seed=0, correct=_correct_with("sequence", 2.0))


@pytest.mark.parametrize("rs,fused", [("none", "true"), ("sequence", "true"), ("none", "false")])
def test_learn_fuses_the_correction_at_temperature_one_without_rejection(tiny, seed, rs, fused):
    """trainer.step.learn: with correction.is_level on, temperature 1 and no rejection, the update
    corrects from its own forward (no compute_logprobs before it); with rejection on (bounds so wide
    that nothing is rejected), or with correction.fused=false, the separate pass runs. Either way the
    batch ends with the weights of its old log-probs and the record's metrics are theirs (1e-6: the
    same float32 numbers); ``correction/fused`` says which pass ran."""
    from types import SimpleNamespace

    from pacs_fast.algorithms.off_policy import off_policy_correction
    from pacs_fast.config import load_config
    from pacs_fast.trainer.step import learn

    cfg = load_config(None, ["correction.is_level=sequence", f"correction.rs_level={rs}", "correction.rs_low=1e-6",
                             "correction.rs_high=1e6", "learner.mini_batch_prompts=4", f"correction.fused={fused}"])
    learner = make_learner(fresh(tiny, seed))
    batch = random_batch(seed)
    batch.behaviour_logp = _behaviour(learner, batch, seed)
    calls = []
    forward = learner.compute_logprobs
    learner.compute_logprobs = lambda *a, **k: calls.append(k) or forward(*a, **k)
    comps = [[SimpleNamespace(logprobs=None)] * batch.group_size] * batch.num_groups  # no mismatch metrics
    _, correction = learn(cfg, learner, batch, None, comps, seed=seed, diagnostic=False, timings={})
    one_pass = rs == "none" and fused == "true"
    assert len(calls) == (0 if one_pass else 1)
    assert correction["correction/fused"] == float(one_pass)
    resp = batch.response_mask > 0
    ref, _, _ = off_policy_correction(batch.old_logp, batch.behaviour_logp, resp, is_level="sequence")
    assert torch.allclose(batch.is_weights[resp], ref[resp], atol=1e-6)
    assert correction["correction/is_weight_max"] > 1.0
    assert correction["correction/is_weight_mean"] == pytest.approx(float(ref[resp].double().mean()), rel=1e-6)


def test_ppo_values_of_a_bf16_model_are_computed_in_fp32(tiny, seed):
    """The value head of a bf16 model is fp32 and takes the bf16 hidden states upcast: a bf16 head computed
    each value with 3 digits (7.8e-3 off at |v| ~ 1 for H = 896 in the bf16 audit, against 5.6e-7 in fp32).
    The head's outputs within fp32 rounding of float64 on the same inputs, and they are the values returned."""
    model = fresh(tiny, seed % 1000).to(torch.bfloat16)
    learner = make_learner(model, algo="ppo")
    head = learner.value_head
    assert head.weight.dtype == torch.float32
    with torch.no_grad():
        head.weight.normal_(0, 0.5)
        head.bias.fill_(0.3)
    seen = []
    hook = head.register_forward_hook(lambda m, args, out: seen.append((args[0].detach(), out.detach())))
    batch = random_batch(seed)
    values = learner.compute_values(batch)
    hook.remove()
    h, out = seen[0]
    assert h.dtype == out.dtype == torch.float32
    want = torch.nn.functional.linear(h.double(), head.weight.double(), head.bias.double())
    assert float((out.double() - want).abs().max()) <= 1e-5 * float(want.abs().max())
    got = values[batch.response_mask > 0]
    assert got.abs().max() > 0.1 and bool(torch.isin(got, out.float().reshape(-1)).all())  # the head's own values
