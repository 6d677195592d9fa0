"""Packed rows (learner.packing) and token-budget micro-batches (learner.max_tokens_per_micro_batch)
in the torch learner (issue 21, items 1-2 for the torch learner).

Packed vs padded on a Qwen2.5-width model (hidden 896, 14 / 2 heads, 151,936 vocabulary rows, 2
layers) with wildly uneven rows (1 to 300 tokens): per-token log-probs, entropies, the loss and every
parameter's gradient agree to <= 1e-5 relative in fp32 (the same sums on other matmul shapes: the
difference is rounding). A token-budget update equals the one-micro-batch update (the accumulated
gradient the optimiser step gets) for every loss aggregation, PACS and GRPO: in float64 to 1e-12 of its
largest entry (the issue asks 1e-6; the objective scales each micro-batch by the mini-batch's counts,
so only the summation order differs), and no micro-batch holds more tokens than the budget.
"""
import copy
import importlib.util
from types import SimpleNamespace

import pytest
import torch

from pacs_fast.config import AlgoConfig, LearnerConfig, load_config, validate
from pacs_fast.data.tiny import tiny_qwen2_config
from pacs_fast.learner.base import RolloutBatch
from pacs_fast.learner.objective import minibatch_counts, objective
from pacs_fast.learner.packing import (first_fit_decreasing, micro_batch_groups, pack, padded_budget_micro_batches,
                                      padded_slots, shared_prefix_slots, token_budget_micro_batches)
from pacs_fast.learner.torch_learner import TorchLearner

EOS = 2


def uneven_batch(gen, G, groups, vocab, lengths):
    """Right-padded rows: a prompt of 1-12 tokens, then a response, total length from ``lengths``."""
    rows = []
    for k in range(groups * G):
        total = lengths[k]
        prompt = 1 + int(torch.randint(0, min(12, max(total - 1, 1)), (), generator=gen)) if total > 1 else 1
        rows.append((torch.randint(3, vocab, (total,), generator=gen), min(prompt, total)))
    T = max(r.numel() for r, _ in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    att = torch.zeros(len(rows), T, dtype=torch.long)
    resp = torch.zeros(len(rows), T)
    for i, (r, p) in enumerate(rows):
        ids[i, :r.numel()], att[i, :r.numel()], resp[i, p:r.numel()] = r, 1, 1
    rewards = torch.randint(0, 2, (len(rows),), generator=gen).float()
    return RolloutBatch(ids, att, resp, rewards, group_size=G)


def prompted_batch(gen, G, groups, prompt_lengths):
    """Right-padded rows, each group's ``G`` rows sharing one prompt (``prompt_lengths``: its length's range) and
    each row its own response of 1-29 tokens."""
    prompts = [torch.randint(3, 128, (int(torch.randint(*prompt_lengths, (), generator=gen)),), generator=gen)
               for _ in range(groups)]
    rows = [torch.cat([prompts[i // G], torch.randint(3, 128, (int(torch.randint(1, 30, (), generator=gen)),),
                                                      generator=gen)]) for i in range(G * groups)]
    T = max(len(r) for r in rows)
    ids, att = torch.zeros(len(rows), T, dtype=torch.long), torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)], att[i, :len(r)] = r, 1
    return RolloutBatch(ids, att, att.float(), torch.zeros(len(rows)), group_size=G)


def whole_parts(items):
    """A learner's micro-batches (``(group positions, whole)``) as group positions, every group within the budget."""
    assert all(whole for _, whole in items), items
    return [p for p, _ in items]


def grads_of(learner, batch, algo):
    learner.model.zero_grad(set_to_none=True)
    logp, ent, _ = learner._forward(learner.model, batch, entropy=True, values=False)
    loss, _ = objective(algo, batch, logp, None, None, minibatch_counts(batch), horizon=300)
    loss.backward()
    return logp.detach(), ent.detach(), loss.detach(), {n: p.grad.clone() for n, p in learner.model.named_parameters()}


@pytest.fixture(scope="module")
def qwen_width_model():
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = tiny_qwen2_config(151936, hidden_size=896, num_layers=2, num_heads=14, num_kv_heads=2,
                            intermediate_size=1024, max_positions=512)
    return Qwen2ForCausalLM(cfg).float()


def small_model():
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(1)
    return Qwen2ForCausalLM(tiny_qwen2_config(128, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
                                              intermediate_size=128, max_positions=512))


@pytest.mark.parametrize("attention,width", [("short", "qwen2.5"), ("sdpa", "small"), ("eager", "small"),
                                             ("short", "small")])
def test_packed_equals_padded(request, seed, attention, width):
    """Each attention implementation the learner runs on (its boolean or additive mask); the
    Qwen2.5-width model with the CPU default ('short', SDPA above its size limit)."""
    from pacs_fast.ops.short_attention import use_attention

    model = request.getfixturevalue("qwen_width_model") if width == "qwen2.5" else small_model()
    vocab = model.config.vocab_size
    use_attention(model, attention)
    gen = torch.Generator().manual_seed(seed)
    # wildly uneven, the 1-token row has no response token; rows above 32 tokens take SDPA ('short' attention's
    # limit with gradients). The Qwen-width model's are shorter: 151,936 logits per token set its CPU time
    lengths = [1, 300, 7, 45, 2, 180] if width == "small" else [1, 120, 7, 45, 2, 70]
    batch = uneven_batch(gen, 2, 3, vocab, lengths)
    algo = AlgoConfig()
    out = {}
    for packing in ("off", "on"):
        lc = LearnerConfig(packing=packing, shared_prefix=False)
        learner = TorchLearner(model, algo=algo, learner=lc)
        with torch.no_grad():
            old = learner._forward(model, batch, entropy=False, values=False)[0]
        batch.old_logp = batch.ref_logp = old
        out[packing] = grads_of(learner, batch, algo)
    (lp0, e0, l0, g0), (lp1, e1, l1, g1) = out["off"], out["on"]
    m = batch.response_mask > 0
    assert torch.allclose(lp1[m], lp0[m], rtol=1e-5, atol=1e-5 * lp0[m].abs().max())
    assert torch.allclose(e1[m], e0[m], rtol=1e-5, atol=1e-5 * e0[m].abs().max())
    assert abs(float(l1 - l0)) <= 1e-5 * max(abs(float(l0)), 1e-3)
    for name, g in g0.items():
        scale = g.abs().max().clamp(min=1e-12)
        assert (g1[name] - g).abs().max() <= 1e-5 * scale, name


def test_pack_layout():
    ids = torch.tensor([[5, 6, 7, 8, 0, 0], [9, 10, 0, 0, 0, 0], [11, 12, 13, 14, 15, 16], [17, 18, 19, 0, 0, 0]])
    att = (ids > 0).long()
    p = pack(ids, att)
    # fed lengths 3, 1, 5, 2 (last token only a label) in bins of 5: [5], [3, 2] or [3, 1] ...
    assert p.input_ids.shape[1] == 5 and p.input_ids.shape[0] == 3 and padded_slots(att) == 20 and p.slots == 15
    for i, n in enumerate([3, 1, 5, 2]):
        b, s = int(p.row[i]), int(p.start[i])
        assert torch.equal(p.input_ids[b, s:s + n], ids[i, :n])
        assert torch.equal(p.position_ids[b, s:s + n], torch.arange(n))
        seen = p.attention_mask[b, 0, s:s + n, :]
        assert torch.equal(seen[:, s:s + n], torch.ones(n, n, dtype=torch.bool).tril())
        assert int(seen.sum()) == n * (n + 1) // 2  # nothing outside its own sequence
    flash = pack(ids, att, implementation="flash_attention_2")
    assert flash.attention_mask is None and flash.input_ids.shape == (1, 11)


def test_first_fit_decreasing():
    sizes = [5, 1, 4, 2, 3, 3]
    bins = first_fit_decreasing(sizes, 6)
    assert sorted(i for b in bins for i in b) == list(range(6))
    assert all(sum(sizes[i] for i in b) <= 6 for b in bins) and len(bins) == 3
    with pytest.raises(ValueError):
        first_fit_decreasing([7], 6)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                 "seq-mean-token-sum-norm", "token-sum"])
@pytest.mark.parametrize("name", ["pacs", "grpo"])
def test_token_budget_update_equals_one_micro_batch(seed, agg, name):
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed % 1000)
    model = Qwen2ForCausalLM(tiny_qwen2_config(128, hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                                               intermediate_size=128)).double()  # fp64: the bound tests the scaling,
    # not fp32's summation order (other micro-batches sum the tokens in another order: ~1e-6 relative in fp32)
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 40, (24,), generator=gen).tolist()
    batch = uneven_batch(gen, 4, 6, 128, lengths)
    algo = AlgoConfig(name=name, loss_agg=agg)
    params = {}
    for budget, micro in ((0, 6), (2 * max(lengths) * 4, 6)):
        m = copy.deepcopy(model)
        lc = LearnerConfig(mini_batch_prompts=6, micro_batch_prompts=micro, max_tokens_per_micro_batch=budget,
                           shared_prefix=False, grad_clip=0.0)
        learner = TorchLearner(m, algo=algo, learner=lc)
        # the accumulated gradient as the optimiser step sees it (Adam's first step, ~lr * sign(g),
        # would turn the rounding of gradients near 0 into lr-sized differences)
        seen = {}
        learner.optimizer.step = lambda: seen.update({n: p.grad.clone() for n, p in m.named_parameters()})
        if budget:
            tokens = batch.attention_mask.sum(-1).view(6, 4).sum(-1).tolist()
            parts = whole_parts(learner._micro_batches(batch, micro))
            assert len(parts) > 1 and all(sum(tokens[g] for g in p) <= budget for p in parts)
        b = copy.deepcopy(batch)
        learner.update(b, seed=1)
        params[budget] = seen
    one, cut = params[0], params[2 * max(lengths) * 4]
    for n in one:
        assert (cut[n] - one[n]).abs().max() <= 1e-12 * float(one[n].abs().max()), n  # issue: <= 1e-6


def test_a_token_budget_cuts_micro_batches_whatever_micro_batch_prompts_says(seed):
    """With learner.max_tokens_per_micro_batch set, learner.micro_batch_prompts is not read (the help and the
    unused-settings warning say so): 1 or 5 groups (5 does not divide the mini-batch's 6, accepted with a budget)
    give the same forwards and the same gradients, bit for bit (a sweep found the key silently ignored)."""
    model = small_model()
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 40, (24,), generator=gen).tolist()
    batch = uneven_batch(gen, 4, 6, 128, lengths)
    budget = 2 * max(lengths) * 4
    seen, forwards = {}, {}
    for micro in (1, 5):
        m = copy.deepcopy(model)
        lc = LearnerConfig(mini_batch_prompts=6, micro_batch_prompts=micro, max_tokens_per_micro_batch=budget,
                           shared_prefix=False, packing="off", grad_clip=0.0)
        learner = TorchLearner(m, algo=AlgoConfig(), learner=lc)
        learner.optimizer.step = lambda m=m, micro=micro: seen.update(
            {micro: {n: p.grad.clone() for n, p in m.named_parameters()}})
        forwards[micro] = learner.update(copy.deepcopy(batch), seed=1)["forward/padded"]
    assert 1 < forwards[1] == forwards[5] < 6  # the budget's cut: neither 6 single groups nor 2 of up to 5
    assert all(torch.equal(seen[1][n], seen[5][n]) for n in seen[1])
    cfg = load_config(None, ["learner.max_tokens_per_micro_batch=4096", "learner.micro_batch_prompts=5"])
    validate(cfg)  # (without the budget: "must divide learner.mini_batch_prompts=32")
    from pacs_fast.config import unused_settings
    assert unused_settings(cfg) == ["learner.micro_batch_prompts=5 has no effect with "
                                    "learner.max_tokens_per_micro_batch set (micro-batches are cut by tokens)"]
    assert unused_settings(load_config(None, ["train.prompts_per_step=12", "learner.max_tokens_per_micro_batch=4096"]))\
        == []  # the micro-batch size that follows the prompts (12, not 32) was not set by anyone


def test_with_packing_off_the_budget_bounds_the_padded_forwards_token_slots(seed):
    """learner.packing=off pads a micro-batch's rows to its longest, so the budget counts rows x longest, not real
    tokens: on the first H200 run (2026-11-29) a long-tailed batch cut by real tokens (37,578) ran micro-batches of
    up to 8 x 16k padded slots and ran out of memory. Every micro-batch's padded slots stay within the budget, every
    group is in one micro-batch once, and the torch learner cuts this way exactly when it pads."""
    gen = torch.Generator().manual_seed(seed)
    G, groups = 4, 9
    lengths = torch.exp(3 + torch.randn(G * groups, generator=gen)).round().clamp(2, 300).long().tolist()
    batch = uneven_batch(gen, G, groups, 128, lengths)
    longest = batch.attention_mask.sum(-1).view(groups, G).amax(-1)
    budget = int(G * longest.max()) + int(torch.randint(0, 400, (), generator=gen))
    parts = micro_batch_groups(batch, 1, budget, padded=True)
    assert sorted(g for p in parts for g in p) == list(range(groups))
    for p in parts:
        assert padded_slots(batch.groups(p).attention_mask) <= budget, (p, budget)
    assert padded_budget_micro_batches([10, 50, 20, 45], 2, 200) == [[1, 3], [0, 2]]  # 2 x 2 x 50, 2 x 2 x 20
    with pytest.raises(ValueError, match=r"a group of 2 rows padded to 50 tokens \(100 token slots: learner.packing="
                                         r"off pads each row to the longest\) is larger than learner.max_tokens_per_"
                                         r"micro_batch=99"):
        padded_budget_micro_batches([10, 50], 2, 99)
    for packing, shared in (("off", False), ("off", True), ("on", False), ("auto", False)):
        learner = TorchLearner(small_model(), algo=AlgoConfig(),
                               learner=LearnerConfig(packing=packing, shared_prefix=shared,
                                                     max_tokens_per_micro_batch=budget))
        want = micro_batch_groups(batch, 1, budget, padded=packing == "off", shared_prefix=shared)
        assert whole_parts(learner._micro_batches(batch, 1)) == want
    # the shared-prefix forward (packing=off, learner.shared_prefix): each group's common prefix once and the rows'
    # rests padded, which is what a micro-batch is cut by (not rows x longest, which cut them 3-4x too small)
    shared_batch = prompted_batch(gen, G, groups, (20, 60))
    budget = max(shared_prefix_slots(shared_batch.groups([g]).input_ids, shared_batch.groups([g]).attention_mask, G)
                 for g in range(groups)) + 40
    parts = micro_batch_groups(shared_batch, 1, budget, padded=True, shared_prefix=True)
    assert sorted(g for p in parts for g in p) == list(range(groups))
    for p in parts:
        sub = shared_batch.groups(p)
        assert shared_prefix_slots(sub.input_ids, sub.attention_mask, G) <= budget
    with pytest.raises(ValueError, match="rows padded to"):  # each prompt (>= 20 tokens) counted 4 times: > 40 over
        micro_batch_groups(shared_batch, 1, budget, padded=True)
    with pytest.raises(ValueError, match=r"a group of a shared prefix of \d+ tokens and 4 rests padded to \d+"):
        micro_batch_groups(shared_batch, 1, budget // 3, padded=True, shared_prefix=True)


def test_dense_packed_bins_stay_within_the_token_budget(seed):
    """learner.packed_attention=dense packs rows into bins as long as the longest row, so a budget counted in real
    tokens let the bins run over it (a sweep: rows of 22 / 12 / 12 / 12 tokens under a budget of 58 ran 4 bins of 22,
    84 slots, in both learners; the memory check counts the budget). With the dense mask the cut counts the padded
    forward's slots, which no bin layout and no forward `auto` may pick instead exceeds; varlen keeps the real-token
    cut (its one row holds exactly the real tokens)."""
    gen = torch.Generator().manual_seed(seed)
    G, groups = 4, 9
    lengths = torch.exp(3 + torch.randn(G * groups, generator=gen)).round().clamp(2, 300).long().tolist()
    batch = uneven_batch(gen, G, groups, 128, lengths)
    longest = batch.attention_mask.sum(-1).view(groups, G).amax(-1)
    budget = int(G * longest.max()) + int(torch.randint(0, 400, (), generator=gen))
    for packing in ("on", "auto"):
        for attention in ("dense", "varlen"):
            cfg = LearnerConfig(packing=packing, packed_attention=attention, shared_prefix=True,
                                max_tokens_per_micro_batch=budget)
            learner = TorchLearner(small_model(), algo=AlgoConfig(), learner=cfg)
            parts = whole_parts(learner._micro_batches(batch, 1))
            assert sorted(g for p in parts for g in p) == list(range(groups))
            for p in parts:
                sub = batch.groups(p)
                slots = pack(sub.input_ids, sub.attention_mask, varlen=attention == "varlen").slots
                assert slots <= budget, (packing, attention, p, slots, budget)
    # the sweep's batch, through the learner: its forwards' slots within the budget
    rows = uneven_batch(gen, 2, 2, 128, [22, 12, 12, 12])
    real = int(rows.attention_mask.sum())
    learner = TorchLearner(small_model(), algo=AlgoConfig(),
                           learner=LearnerConfig(packing="on", packed_attention="dense", shared_prefix=False,
                                                 micro_batch_prompts=2, max_tokens_per_micro_batch=real))
    for p in whole_parts(learner._micro_batches(rows, 2)):
        assert pack(rows.groups(p).input_ids, rows.groups(p).attention_mask).slots <= real
    learner.compute_logprobs(rows)
    # one forward per group (cut by real tokens, both ran in one forward of 3 bins x 21 = 63 slots)
    assert learner.forwards["packed"] == 2, dict(learner.forwards)
    if importlib.util.find_spec("megatron") is not None:  # the megatron learner: each micro-batch's forward fits
        from pacs_fast.learner.megatron.forward import _packed_or_none, left_align
        from pacs_fast.learner.megatron.learner import MegatronLearner

        for packing, attention in (("on", "dense"), ("auto", "dense"), ("on", "varlen"), ("off", "auto")):
            cfg = LearnerConfig(packing=packing, packed_attention=attention, max_tokens_per_micro_batch=budget)
            parts = whole_parts(MegatronLearner._micro_batches(SimpleNamespace(cfg=cfg), batch))
            assert sorted(g for p in parts for g in p) == list(range(groups))
            for p in parts:  # what megatron's forward runs on it (tokens_logprobs: packed bins / THD row, or padded)
                ids_l, att_l, _, _ = left_align(batch.groups(p).input_ids, batch.groups(p).attention_mask)
                packed = _packed_or_none(ids_l, att_l, packing, attention != "dense", budget)
                slots = packed.slots if packed is not None else padded_slots(att_l)
                assert slots <= budget, (packing, attention, p, slots, budget)
    with pytest.raises(ValueError, match=r"learner.packed_attention=dense packs rows into bins as long as the longest "
                                         r"row\) is larger than learner.max_tokens_per_micro_batch=30: raise the "
                                         r"budget or use learner.packed_attention=varlen"):
        micro_batch_groups(rows, 1, 30, dense=True)


def test_recorded_token_slots_are_what_the_decoder_ran(seed):
    """Each step's learner/forward/token_slots is the number of token positions the decoder ran, for every forward (a
    sweep found the shared-prefix count one slot per row too high: it counted the rest's last column, only ever a
    label, and not the prefixes' padding to the longest), and the budget cut bounds exactly that."""
    gen = torch.Generator().manual_seed(seed)
    G, groups = 4, 5
    batch = prompted_batch(gen, G, groups, (3, 40))
    model = small_model()
    fed = []
    hook = model.model.register_forward_hook(lambda m, a, kw, out: fed.append(kw["input_ids"].numel()),
                                             with_kwargs=True)
    try:
        for packing, shared, kind in (("off", True, "shared_prefix"), ("off", False, "padded"), ("on", True, "packed")):
            fed.clear()
            learner = TorchLearner(model, algo=AlgoConfig(),
                                   learner=LearnerConfig(packing=packing, shared_prefix=shared))
            learner.compute_logprobs(batch)
            assert learner.forwards[kind] == 1 and learner.forwards["token_slots"] == sum(fed), (kind, fed)
            if kind != "packed":  # the cut with a budget of exactly one micro-batch's slots keeps one
                assert micro_batch_groups(batch, 1, sum(fed), padded=True, shared_prefix=shared) == [
                    list(range(groups))]
                assert len(micro_batch_groups(batch, 1, sum(fed) - 1, padded=True, shared_prefix=shared)) > 1
        # a step's record counts its log-prob passes before the update too (a sweep: the old-log-prob forwards
        # at temperature != 1 were missing), and the next update only what ran since
        learner = TorchLearner(model, algo=AlgoConfig(), learner=LearnerConfig(packing="off", shared_prefix=False,
                                                                               micro_batch_prompts=groups))
        fed.clear()
        learner.compute_logprobs(batch)
        learner.compute_logprobs(batch, return_entropy=True)
        first = learner.update(batch, seed=0)
        n = len(fed)
        assert first["forward/padded"] == n == 2 + first["optimizer_steps"] and first["forward/token_slots"] == sum(fed)
        second = learner.update(batch, seed=1)
        assert second["forward/padded"] == len(fed) - n == second["optimizer_steps"]
    finally:
        hook.remove()


def test_a_group_without_a_common_prefix_is_cut_as_the_padded_forward_it_runs(seed):
    """The shared-prefix forward needs a common prefix in every group of its micro-batch, else the padded forward runs:
    the budget cut counts that (a review: a 100-token prefix group and a group whose rows differ at their first token,
    under a budget of 204, were cut into one micro-batch whose padded forward ran 400 slots)."""
    gen = torch.Generator().manual_seed(seed)
    shared = torch.randint(3, 128, (100,), generator=gen)
    ids = torch.zeros(4, 101, dtype=torch.long)
    att = torch.zeros(4, 101, dtype=torch.long)
    ids[0, :100], ids[1, :100], ids[0, 100], ids[1, 100] = shared, shared, 5, 6
    att[:2] = 1
    ids[2, :2], ids[3, :2], att[2:, :2] = torch.tensor([7, 8]), torch.tensor([9, 10]), 1
    batch = RolloutBatch(ids, att, att.float(), torch.zeros(4), group_size=2)
    parts = micro_batch_groups(batch, 1, 204, padded=True, shared_prefix=True)
    assert parts == [[0], [1]]
    learner = TorchLearner(small_model(), algo=AlgoConfig(),
                           learner=LearnerConfig(packing="off", shared_prefix=True, max_tokens_per_micro_batch=204))
    assert whole_parts(learner._micro_batches(batch, 1)) == parts
    for p in parts:
        before = learner.forwards["token_slots"]
        learner.compute_logprobs(batch.groups(p))
        assert learner.forwards["token_slots"] - before <= 204
    assert learner.forwards["shared_prefix"] == 1 and learner.forwards["padded"] == 1


def test_auto_packs_where_the_padded_forward_would_exceed_the_token_budget(seed):
    """learner.packing=auto keeps the padded forward unless packing saves >= 20% of its slots, but a token budget
    cut these rows by real tokens: where the padded slots exceed it, it packs (a sweep found one group of 100 + 61
    tokens under a budget of 161 run padded in 198 slots, 23% over)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 128, (2, 100), generator=gen)
    att = torch.zeros(2, 100, dtype=torch.long)
    att[0], att[1, :61] = 1, 1
    resp = att.float().clone()
    resp[:, :5] = 0
    batch = RolloutBatch(ids * att, att, resp, torch.tensor([0.0, 1.0]), group_size=2)
    for budget, kind in ((161, "packed"), (200, "padded"), (0, "padded")):
        learner = TorchLearner(small_model(), algo=AlgoConfig(),
                               learner=LearnerConfig(packing="auto", shared_prefix=False,
                                                     max_tokens_per_micro_batch=budget))
        learner.compute_logprobs(batch)
        assert learner.forwards[kind] == 1, (budget, dict(learner.forwards))
        assert not budget or learner.forwards["token_slots"] <= budget


def test_token_budget_errors():
    with pytest.raises(ValueError, match=r"a group of 50 tokens is larger than learner.max_tokens_per_micro_batch=40"):
        token_budget_micro_batches([10, 50], 40)
    with pytest.raises(ValueError, match=r"learner.max_tokens_per_micro_batch=100 cannot hold a group of full-length "
                                         r"responses: rollout.n=8 x \(a prompt of at least 1 token \+ "
                                         r"rollout.max_new_tokens=12\) = 104 tokens"):
        validate(load_config(None, ["learner.max_tokens_per_micro_batch=100", "learner.split_groups=off"]))
    # the budget is checked against the real prompts (before, against data.max_prompt_tokens=512: a budget
    # that fits the data was refused, issue 41); with learner.split_groups=auto (the default) against one row:
    # tests/test_long_groups.py
    from pacs_fast.trainer.problems import check_token_budget
    cfg = load_config(None, ["learner.max_tokens_per_micro_batch=1000", "learner.split_groups=off"])
    validate(cfg)
    problems = [{"id": "a", "prompt_ids": [1] * 30}, {"id": "b", "prompt_ids": [1] * 114}]
    check_token_budget(cfg, "data.dataset", problems[:1])  # 8 x (30 + 12) = 336 fits
    with pytest.raises(ValueError, match=r"learner.max_tokens_per_micro_batch=1000 cannot hold the largest group of "
                                         r"data.dataset: rollout.n=8 x \(its longest prompt, problem 'b', 114 tokens \+ "
                                         r"rollout.max_new_tokens=12\) = 1008 tokens; raise it to 1008, or lower "
                                         r"data.max_prompt_tokens to drop the long prompts, or set "
                                         r"learner.split_groups=auto"):
        check_token_budget(cfg, "data.dataset", problems)
    with pytest.raises(ValueError, match="learner.packing"):
        validate(load_config(None, ["learner.packing=maybe"]))


def test_auto_packing_replaces_the_shared_prefix_forward_where_it_runs_fewer_slots(seed):
    """Shared prefix on: on wildly uneven rows `auto` packs (fewer token slots than the prefix once
    plus every rest padded to the longest) and gives the shared-prefix forward's results."""
    from pacs_fast.learner.packing import shared_prefix_slots
    model = small_model()
    gen = torch.Generator().manual_seed(seed)
    batch = uneven_batch(gen, 2, 3, 128, [1, 300, 7, 45, 2, 180])
    algo = AlgoConfig()
    ids, att = batch.input_ids, batch.attention_mask
    assert pack(ids, att).slots < 0.8 * shared_prefix_slots(ids, att, 2)  # the case auto should pack
    out = {}
    for packing in ("off", "auto"):
        learner = TorchLearner(model, algo=algo, learner=LearnerConfig(packing=packing, shared_prefix=True))
        assert (learner._packed(model, ids, att, shared_prefix_slots(ids, att, 2)) is not None) == (packing == "auto")
        with torch.no_grad():
            batch.old_logp = batch.ref_logp = learner._forward(model, batch, entropy=False, values=False)[0]
        out[packing] = grads_of(learner, batch, algo)
    (lp0, e0, l0, g0), (lp1, e1, l1, g1) = out["off"], out["auto"]
    m = batch.response_mask > 0
    assert torch.allclose(lp1[m], lp0[m], rtol=1e-5, atol=1e-5 * lp0[m].abs().max())
    assert abs(float(l1 - l0)) <= 1e-5 * max(abs(float(l0)), 1e-3)
    for name, g in g0.items():
        assert (g1[name] - g).abs().max() <= 1e-5 * g.abs().max().clamp(min=1e-12), name


def test_packing_on_packs_with_the_shared_prefix_on_and_the_update_says_which_forward_ran(seed):
    """``learner.packing=on`` with ``learner.shared_prefix=true`` (the default) packs, on rows where
    ``auto`` keeps the shared-prefix forward (long shared prompts, equal lengths); the update's
    metrics name the forward that ran and its token slots. Before, ``on`` never packed while the
    shared prefix was on, with no word of it (issue 41)."""
    from pacs_fast.learner.packing import shared_prefix_slots

    gen = torch.Generator().manual_seed(seed)
    G, groups, prompt, resp = 4, 2, 40, 6
    rows = []
    for g in range(groups):
        p = torch.randint(3, 128, (prompt,), generator=gen)
        rows += [torch.cat([p, torch.randint(3, 128, (resp,), generator=gen)]) for _ in range(G)]
    ids = torch.stack(rows)
    att = torch.ones_like(ids)
    mask = torch.zeros(ids.shape)
    mask[:, prompt:] = 1
    batch = RolloutBatch(ids, att, mask, torch.randint(0, 2, (len(rows),), generator=gen).float(), group_size=G)
    assert pack(ids, att).slots > 0.8 * shared_prefix_slots(ids, att, G)  # auto keeps the shared prefix here
    ran = {}
    for packing in ("auto", "on", "off"):
        learner = TorchLearner(small_model(), algo=AlgoConfig(),
                               learner=LearnerConfig(packing=packing, shared_prefix=True, mini_batch_prompts=2,
                                                     micro_batch_prompts=1))
        out = learner.update(batch, seed=0)
        ran[packing] = {k: out[f"forward/{k}"] for k in ("packed", "shared_prefix", "padded")}
        assert out["forward/token_slots"] > 0
    assert ran["auto"]["packed"] == 0 and ran["auto"]["shared_prefix"] > 0
    assert ran["on"]["packed"] > 0 and ran["on"]["shared_prefix"] == 0 == ran["on"]["padded"]
    assert ran["off"]["packed"] == 0 and ran["off"]["shared_prefix"] > 0
