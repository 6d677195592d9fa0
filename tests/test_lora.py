"""``model.lora_rank``: LoRA adapters in the torch learner (pacs_fast/learner/lora.py, PEFT's injection).

- Only the adapters train: the base weights stay bit-identical through updates, the optimiser holds the adapters
  (and PPO's value head) alone, and the adapters start at B = 0 (the base model's log-probs exactly).
- What leaves the learner is the merged model under plain Hugging Face names: PEFT's own merge of the same layers
  (float32: the same product, 1e-6), and a fresh model loaded with it gives the learner's log-probs.
- A resume continues the same adapters exactly (weights and records equal the uninterrupted run's), and refuses a
  checkpoint of the other kind or a base that changed since.
- Settings it cannot take are one line each before any model loads.
"""
import copy
import json

import pytest
import torch

pytest.importorskip("peft", reason="PEFT (the lora extra) is not installed")

from pacs_fast.config import AlgoConfig, LearnerConfig, load_config, unused_settings, validate  # noqa: E402
from pacs_fast.data.tiny import make_tiny_model  # noqa: E402
from pacs_fast.learner.base import RolloutBatch  # noqa: E402
from pacs_fast.learner.lora import add_lora, lora_layers, merged_weights  # noqa: E402
from pacs_fast.learner.torch_learner import TorchLearner  # noqa: E402

from test_run_safety import cli  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("lora") / "m", seed=3, tie_word_embeddings=False)


def _model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _batch(gen, G=4, P=2, vocab=128):
    from rollout_rows import rollout_rows

    ids, am, rm = rollout_rows(gen, [int(x) for x in torch.randint(14, 22, (G * P,), generator=gen)], vocab,
                               left_pad=False)
    rewards = torch.tensor([1.0, 0.0] * (G * P // 2))[torch.randperm(G * P, generator=gen)]
    rewards.view(P, G)[:, 0], rewards.view(P, G)[:, 1] = 1.0, 0.0  # (every group mixed: no zero advantages)
    return RolloutBatch(ids, am, rm, rewards, group_size=G)


def _learner(model, name="grpo", **kw):
    return TorchLearner(model, algo=AlgoConfig(name=name), horizon=10,
                        learner=LearnerConfig(lr=5e-2, mini_batch_prompts=2, micro_batch_prompts=1,
                                              logprob_backend="torch", **kw))


def _update(learner, batch, seed=0):
    batch = copy.deepcopy(batch)
    batch.old_logp = learner.compute_logprobs(batch)
    batch.ref_logp = batch.old_logp
    return learner.update(batch, seed=seed)


@pytest.mark.parametrize("name", ["grpo", "pacs"])
def test_only_the_adapters_train_and_they_start_at_the_base(tiny, seed, name):
    gen = torch.Generator().manual_seed(seed)
    batch = _batch(gen)
    base = _learner(_model(tiny), name)
    model = _model(tiny)
    trained = add_lora(model, rank=4, alpha=8, dropout=0.0, target_modules="all-linear")
    frozen = {n: t.clone() for n, t in model.state_dict().items() if ".lora_" not in n}
    learner = _learner(model, name)
    assert torch.equal(learner.compute_logprobs(batch), base.compute_logprobs(batch))  # B = 0: the base model
    in_optimizer = sum(p.numel() for g in learner.optimizer.param_groups for p in g["params"])
    head = sum(p.numel() for p in learner.value_head.parameters()) if learner.value_head is not None else 0
    assert in_optimizer == trained + head and 0 < trained < 0.5 * sum(t.numel() for t in frozen.values())
    for step in range(2):
        _update(learner, batch, seed=step)
    after = model.state_dict()
    assert all(torch.equal(after[n], t) for n, t in frozen.items())  # the base, bit for bit
    assert any(float(m.lora_B["default"].weight.detach().abs().max()) > 0 for m in lora_layers(model).values())
    assert float((learner.compute_logprobs(batch) - base.compute_logprobs(batch)).abs().max()) > 1e-4


def test_the_merged_export_is_peft_merge_under_plain_names(tiny, seed):
    gen = torch.Generator().manual_seed(seed)
    batch = _batch(gen)
    model = _model(tiny)
    names = set(model.state_dict())
    add_lora(model, rank=4, alpha=16, dropout=0.0, target_modules="q_proj,v_proj,down_proj")
    learner = _learner(model)
    _update(learner, batch)
    exported = dict(learner.export_hf_weights())
    assert set(exported) == names  # plain Hugging Face names, no adapter tensors
    merged = copy.deepcopy(model)
    for layer in lora_layers(merged).values():
        layer.merge()  # PEFT's own merge of the same adapters
    want = {n.replace(".base_layer", ""): t for n, t in merged.state_dict().items() if ".lora_" not in n}
    assert max(float((exported[n] - want[n]).abs().max()) for n in names) <= 1e-6
    changed = [n for n in names if not torch.equal(exported[n], _model(tiny).state_dict()[n])]
    assert changed and all(any(k in n for k in ("q_proj", "v_proj", "down_proj")) for n in changed)
    fresh = _model(tiny)
    fresh.load_state_dict(exported)
    plain = _learner(fresh)
    assert float((plain.compute_logprobs(batch) - learner.compute_logprobs(batch)).abs().max()) <= 1e-5


def test_the_export_merges_a_layer_as_it_is_asked_for(tiny, monkeypatch):
    """The export streams: a merge is made when its tensor is asked for, so the vLLM engine's bucketed weight sync
    and a checkpoint's shards hold one merged layer at a time. It merged every adapted weight before yielding the
    first (a 7B model's all-linear LoRA: ~13 GB of bf16 merges at once, at every weight sync; review of 2026-12-03)."""
    import pacs_fast.learner.lora as lora

    model = _model(tiny)
    add_lora(model, rank=4, alpha=16, dropout=0.0, target_modules="all-linear")
    learner = _learner(model)
    merges, real = [], lora._delta
    monkeypatch.setattr(lora, "_delta", lambda layer, adapter: merges.append(layer) or real(layer, adapter))
    seen = 0
    for name, t in learner.export_hf_weights():
        seen += 1
        # the merges so far are those of the tensors handed out so far (q/k/v/o, gate/up/down of each layer)
        assert len(merges) <= seen, (name, len(merges), seen)
    assert len(merges) == len(lora_layers(model)) > 7


def test_a_checkpoint_merges_each_adapted_layer_once(tiny, tmp_path, monkeypatch):
    """``save_hf`` counted its files with one pass of the export and wrote them with a second: each adapted layer was
    merged twice per checkpoint (an fp32 matmul per linear layer of the model, twice). It counts them from
    ``hf_weight_layout`` (names, shapes, dtypes: no merge) now: one merge per adapted layer. The files are the
    two-pass save's, byte for byte (rebuilt here as it counted and wrote them, from the merged export)."""
    import pacs_fast.learner.lora as lora
    from pacs_fast.learner import hf_folder

    model = _model(tiny)
    add_lora(model, rank=4, alpha=16, dropout=0.0, target_modules="all-linear")
    with torch.no_grad():  # (B starts at 0: adapters of their own, so that a merge changes the bytes)
        gen = torch.Generator().manual_seed(0)
        for n, p in model.named_parameters():
            if ".lora_" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    learner = _learner(model)
    exported = [(n, t.clone()) for n, t in learner.export_hf_weights()]
    layer = sum(t.numel() * t.element_size() for n, t in exported if n.startswith("model.layers.0."))
    merges, real = [], lora._delta
    monkeypatch.setattr(lora, "_delta", lambda layer, adapter: merges.append(layer) or real(layer, adapter))
    learner.save_hf(tmp_path / "new", bucket_bytes=layer)
    assert len(merges) == len(lora_layers(model)) > 7  # (one adapter per layer: 2x before)

    ref = tmp_path / "two_pass"
    ref.mkdir()
    size = lambda t: t.numel() * t.element_size()  # noqa: E731
    n = sum(1 for _ in hf_folder.whole_unit_buckets(((k, size(t)) for k, t in exported), layer, int))
    weight_map, total = {}, 0
    for i, bucket in enumerate(hf_folder.whole_unit_buckets(exported, layer, size)):
        total += hf_folder.write_shard(ref, hf_folder.shard_name(i, n), {k: t.contiguous() for k, t in bucket})
        weight_map.update(dict.fromkeys((k for k, _ in bucket), hf_folder.shard_name(i, n)))
    hf_folder.finish_weights(ref, weight_map, total)
    files = sorted(p.name for p in ref.iterdir())
    assert n >= 3 and files == sorted(p.name for p in (tmp_path / "new").glob("model*"))
    assert all((ref / f).read_bytes() == (tmp_path / "new" / f).read_bytes() for f in files)
    assert list(learner.hf_weight_layout()) == [(n, tuple(t.shape), t.dtype) for n, t in exported]


def test_a_checkpoint_round_trip_and_what_it_refuses(tiny, seed):
    gen = torch.Generator().manual_seed(seed)
    batch = _batch(gen)

    def lora_learner():
        model = _model(tiny)
        add_lora(model, rank=4, alpha=8, dropout=0.0, target_modules="all-linear")
        return _learner(model)

    a = lora_learner()
    _update(a, batch)
    weights, state = list(a.export_hf_weights()), copy.deepcopy(a.state_dict())
    b = lora_learner()
    b.load_hf_weights(weights)
    b.load_state_dict(copy.deepcopy(state))
    assert torch.equal(b.compute_logprobs(batch), a.compute_logprobs(batch))
    _update(a, batch, seed=1)
    _update(b, batch, seed=1)
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a.export_hf_weights(), b.export_hf_weights()))
    # a base that changed since (model.path's weights edited): refused
    c = lora_learner()
    with torch.no_grad():
        next(p for n, p in c.model.named_parameters() if "base_layer" in n).add_(0.5)
    c.load_hf_weights(weights)
    with pytest.raises(ValueError, match=r"model.path's weights are not the base the checkpoint's LoRA adapters"):
        c.load_state_dict(copy.deepcopy(state))
    c.load_hf_weights(weights)  # a checkpoint written before the base's digest was recorded: the merge is compared
    with pytest.raises(ValueError, match=r"model.path's weights \(or the run's model.lora_\* settings\) changed since"):
        c.load_state_dict({k: v for k, v in copy.deepcopy(state).items() if k != "lora_base"})
    # the other kind of checkpoint
    with pytest.raises(ValueError, match="trained LoRA adapters .* but this run trains the whole model"):
        _learner(_model(tiny)).load_state_dict(copy.deepcopy(state))
    with pytest.raises(ValueError, match="has no LoRA adapters but this run trains some"):
        lora_learner().load_state_dict(_learner(_model(tiny)).state_dict())


@pytest.mark.parametrize("overrides,message", [
    (["model.lora_rank=-1"], "model.lora_rank must be >= 0"),
    (["model.lora_rank=8", "learner.backend=megatron"], "trains LoRA adapters in the torch learner"),
    (["model.lora_rank=8", "model.lora_dropout=1"], r"model.lora_dropout must be in \[0, 1\)"),
    (["model.lora_rank=8", "model.lora_target_modules=,"], "model.lora_target_modules is empty"),
    (["model.lora_rank=8", "model.lora_alpha=-2"], "model.lora_alpha"),
])
def test_settings_it_cannot_take(overrides, message):
    with pytest.raises(ValueError, match=message):
        validate(load_config(None, overrides))


def test_the_lora_keys_are_named_unused_without_a_rank():
    cfg = load_config(None, ["model.lora_alpha=32", "model.lora_target_modules=q_proj"])
    named = " ".join(unused_settings(cfg))
    assert "model.lora_alpha" in named and "model.lora_target_modules" in named


def test_target_modules_this_model_lacks_is_one_line(tiny):
    with pytest.raises(ValueError, match="model.lora_target_modules='w_qkv'.*not found"):
        add_lora(_model(tiny), rank=4, alpha=8, dropout=0.0, target_modules="w_qkv")


def test_the_memory_estimate_counts_the_adapters_not_the_base():
    from pacs_fast.trainer.memory_model import learner_memory, lora_params, model_shape

    full = load_config(None, ["model.dtype=bfloat16"])
    lora = load_config(None, ["model.dtype=bfloat16", "model.lora_rank=16"])
    shape = model_shape(full)
    a, b = learner_memory(full, shape, tokens=4096, device="cpu"), learner_memory(lora, shape, tokens=4096,
                                                                                   device="cpu")
    adapters = lora_params(shape, 16)
    assert b["gradients"] == adapters * 4 and b["optimizer"] == 2 * adapters * 4  # fp32 masters' moments
    assert b["tied_gradient"] == 0 and b["total"] < a["total"] and b["activations"] == a["activations"]


def test_a_run_trains_adapters_saves_plain_checkpoints_and_resumes_exactly(tmp_path, warm_cache, capsys):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from pacs_fast.trainer.metrics import deterministic_view, read_jsonl
    from test_train import TINY

    # (with dropout: the split run's extra held-out evaluation at its step 2 draws from torch's generators, which
    # the update's dropout masks drew from too: its step 3 trained on other masks than the uninterrupted run's)
    common = TINY + [f"warmup.cache_dir={warm_cache}", f"train.out_dir={tmp_path}", "model.lora_rank=4",
                     "model.lora_dropout=0.2", "learner.lr=1e-2", "train.save_every=1",
                     "reward.fn=test_reinforce_pp:even_length", "train.tensorboard=false", "train.eval_every=3"]
    code, out, err = cli(common + ["train.steps=3", "train.run_name=full"], capsys)
    assert code == 0, err
    assert "LoRA: rank 4 on all-linear" in out + err
    code, _, err = cli(common + ["train.steps=2", "train.run_name=split"], capsys)
    assert code == 0, err
    code, _, err = cli(["--resume", str(tmp_path / "split"), "train.steps=3"], capsys)
    assert code == 0, err
    full, split = (tmp_path / name / "checkpoints" / "step_000003" for name in ("full", "split"))
    a, b = load_file(str(full / "model.safetensors")), load_file(str(split / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # the same adapters, continued
    assert not any(".lora_" in k or "base_layer" in k for k in a)
    recs = [deterministic_view(read_jsonl(tmp_path / name / "metrics.jsonl")) for name in ("full", "split")]
    assert [r for r in recs[0] if r["step"] == 3] == [r for r in recs[1] if r["step"] == 3]
    model = AutoModelForCausalLM.from_pretrained(full)  # a plain Hugging Face folder
    assert set(model.state_dict()) >= set(a)
    state = torch.load(full / "learner.pt", weights_only=False)
    assert state["lora"] and all(".lora_" in k for k in state["lora"])
    json.dumps(list(state["lora"]))
    # the adapters as a PEFT adapter folder: PEFT loads them on the run's base, and the result is the merged model
    from peft import PeftModel

    adapter = json.loads((full / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["peft_type"] == "LORA" and adapter["base_model_name_or_path"]
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(adapter["base_model_name_or_path"]),
                                     full / "adapter").eval()
    ids = torch.randint(3, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = model.eval()(ids).logits, peft(ids).logits
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())  # (the merge's fp32 rounding)
    assert not torch.equal(got, AutoModelForCausalLM.from_pretrained(adapter["base_model_name_or_path"])(ids).logits)


def test_a_checkpoint_copy_given_as_the_base_is_refused(tiny, seed):
    """model.path moved, and a checkpoint's copy given as model.path (what the hint for a full-model run says):
    its weights are the merge, so the adapters applied twice. At an RL learning rate the doubled update is far
    inside the merge check's tolerance (1e-5 of the largest weight): the base's digest, recorded in the checkpoint,
    is compared exactly."""
    from pacs_fast.learner.lora import check_same_merge, load_adapter_state

    gen = torch.Generator().manual_seed(seed)
    batch = _batch(gen)

    def lora_learner(model):
        add_lora(model, rank=4, alpha=8, dropout=0.0, target_modules="all-linear")
        return TorchLearner(model, algo=AlgoConfig(name="grpo"), horizon=10,
                            learner=LearnerConfig(lr=1e-6, mini_batch_prompts=2, micro_batch_prompts=1,
                                                  logprob_backend="torch"))

    a = lora_learner(_model(tiny))
    _update(a, batch)
    weights, state = list(a.export_hf_weights()), copy.deepcopy(a.state_dict())
    copied = _model(tiny)  # (a checkpoint's copy as model.path: the merged weights)
    missing, unexpected = copied.load_state_dict(dict(weights), strict=False)
    assert not unexpected and not [n for n in missing if n.endswith("weight")]
    c = lora_learner(copied)
    c.load_hf_weights(weights)
    with pytest.raises(ValueError, match="model.path's weights are not the base the checkpoint's LoRA adapters"):
        c.load_state_dict(copy.deepcopy(state))
    load_adapter_state(c.model, state["lora"])  # what went on before: the adapters applied twice ...
    assert any(not torch.equal(x, y) for (_, x), (_, y) in zip(c.export_hf_weights(), weights))
    check_same_merge(c.model, dict(weights))  # ... within the merge check's tolerance
    b = lora_learner(_model(tiny))  # the real base
    b.load_hf_weights(weights)
    b.load_state_dict(copy.deepcopy(state))


def test_the_moved_model_hint_of_a_lora_run_asks_for_the_base(tmp_path):
    """A full-model run continues from a checkpoint's copy; a LoRA run's checkpoints hold merged weights."""
    from pacs_fast.trainer.run_folder import check_moved_files

    for rank, want in ((4, "the run's LoRA adapters train on that base model"), (0, "copy one out (cp -r")):
        cfg = load_config(None, [f"model.path={tmp_path / 'gone'}", f"model.lora_rank={rank}"])
        with pytest.raises(ValueError, match=r"no longer exists") as e:
            check_moved_files(tmp_path / "run", cfg, tmp_path / "run" / "checkpoints" / "step_000001")
        assert want in str(e.value)


@pytest.mark.parametrize("targets", ["lm_head", "q_proj,embed_tokens"])
def test_the_head_and_the_embedding_take_no_adapters(tiny, targets):
    """The log-prob op reads the LM head's weight (an adapter there would be left out of the learner's log-probs
    while the engines got it merged); an embedding's would reach a tied head only through the merge."""
    with pytest.raises(ValueError, match="adapters go on the linear layers of the decoder"):
        add_lora(_model(tiny), rank=4, alpha=8, dropout=0.0, target_modules=targets)


@pytest.mark.parametrize("targets,message", [
    ("q_proj,v_prj", "v_prj matched no layer of this model"),
    ("all-linear,q_proj", "all-linear stands alone"),
    ("mlp", "names a module that is not a linear layer"),
])
def test_target_names_that_would_train_less_than_asked_are_refused(tiny, targets, message):
    """PEFT trains the names that match and drops a typo beside them (q_proj,v_prj trained q_proj alone), and read
    all-linear inside a list as a module name."""
    with pytest.raises(ValueError, match=message):
        add_lora(_model(tiny), rank=4, alpha=8, dropout=0.0, target_modules=targets)
    assert add_lora(_model(tiny), rank=4, alpha=8, dropout=0.0, target_modules="ALL-LINEAR") > 0


def test_a_bf16_merge_rounds_once(tiny, seed):
    """W + delta in fp32, then one rounding to bf16 (a bf16 sum rounded the delta first, then the sum)."""
    model = _model(tiny).to(torch.bfloat16)
    add_lora(model, rank=4, alpha=8, dropout=0.0, target_modules="q_proj")
    gen = torch.Generator().manual_seed(seed)
    for layer in lora_layers(model).values():
        with torch.no_grad():
            layer.lora_B["default"].weight.copy_(1e-3 * torch.randn(layer.lora_B["default"].weight.shape,
                                                                      generator=gen))
    merged = merged_weights(model)
    for name, layer in lora_layers(model).items():
        delta = layer.lora_B["default"].weight.double() @ layer.lora_A["default"].weight.double()
        want = (layer.base_layer.weight.double() + layer.scaling["default"] * delta).to(torch.bfloat16)
        got = merged[name + ".weight"]
        # one rounding of the fp32 sum: the float64 sum's bf16 value, but where the sum lies within fp32's error of
        # a bf16 rounding boundary (1 ulp of bf16 at most; PEFT's delta, rounded to bf16 first, missed it widely)
        ulp = torch.finfo(torch.bfloat16).eps * want.float().abs().clamp_min(torch.finfo(torch.bfloat16).tiny)
        assert float(((got.float() - want.float()).abs() / ulp).max()) <= 1.0
        assert float((got != want).float().mean()) < 1e-3


def test_a_rank_whose_adapters_outgrow_the_model_warns(tiny):
    from transformers import AutoTokenizer

    from pacs_fast.trainer.build import build_learner

    tok = AutoTokenizer.from_pretrained(tiny)
    for rank, warned in ((4, False), (1000, True)):
        cfg = load_config(None, [f"model.path={tiny}", f"model.lora_rank={rank}", "learner.fused_layers=off"])
        learner, _ = build_learner(cfg, tiny, "cpu", tok)
        assert learner.lora_line.startswith(f"LoRA: rank {rank} on all-linear")
        assert ("warning: model.lora_rank=1000: the adapters hold" in learner.lora_line) == warned


@pytest.mark.parametrize("name,algo", [("pacs", dict(ref="fixed")), ("grpo", dict(kl_coef=0.1))])
def test_a_fixed_reference_is_a_copy_of_the_adapters_on_the_shared_base(tiny, seed, name, algo):
    """The reference policy under LoRA is the policy's model with a copy of the adapters swapped in: no second
    model; its log-probs are the base's (B = 0) bit for bit through updates, the policy's after a reset; the
    policy's own adapters (the same tensors the optimiser steps) come back after each reference forward, also
    after an error in it; a checkpoint carries the reference adapters."""
    gen = torch.Generator().manual_seed(seed)
    batch = _batch(gen)
    base = _learner(_model(tiny), name)  # (no reference needed: the base model's log-probs)
    model = _model(tiny)
    trained = add_lora(model, rank=4, alpha=8, dropout=0.0, target_modules="all-linear")

    def make():
        m = _model(tiny)
        add_lora(m, rank=4, alpha=8, dropout=0.0, target_modules="all-linear")
        return TorchLearner(m, algo=AlgoConfig(name=name, **algo), horizon=10,
                            learner=LearnerConfig(lr=5e-2, mini_batch_prompts=2, micro_batch_prompts=1,
                                                  logprob_backend="torch"))

    learner = make()
    learner.model.load_state_dict(model.state_dict())
    assert learner.ref_model is None and learner.holds_reference
    assert sum(t.numel() for t in learner.ref_adapters.values()) == trained  # the adapters, not the model
    own = [p for g in learner.optimizer.param_groups for p in g["params"]]

    def update(seed):
        b = copy.deepcopy(batch)
        b.old_logp = learner.compute_logprobs(b)
        b.ref_logp = learner.compute_logprobs(b, reference=True)
        return learner.update(b, seed=seed)

    for step in range(2):
        update(step)
    want = base.compute_logprobs(batch)
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters() if ".lora_" in n}
    assert torch.equal(learner.compute_logprobs(batch, reference=True), want)
    policy = learner.compute_logprobs(batch)
    assert float((policy - want).abs().max()) > 1e-4  # (the adapters moved: the reference is not the policy)
    after = dict(learner.model.named_parameters())
    assert all(torch.equal(after[n], t) for n, t in before.items())
    assert [p for g in learner.optimizer.param_groups for p in g["params"]] == own
    assert all(p.requires_grad for n, p in after.items() if ".lora_" in n)

    def broken(*a, **k):
        raise RuntimeError("a forward that fails")

    forward, learner._forward = learner._forward, broken
    with pytest.raises(RuntimeError, match="a forward that fails"):
        learner.compute_logprobs(batch, reference=True)
    learner._forward = forward
    assert torch.equal(learner.compute_logprobs(batch), policy)  # the policy's adapters are back

    learner.reset_reference(reset_optimizer=False)
    assert torch.equal(learner.compute_logprobs(batch, reference=True), policy)
    update(2)
    assert torch.equal(learner.compute_logprobs(batch, reference=True), policy)  # fixed until the next reset
    assert not torch.equal(learner.compute_logprobs(batch), policy)

    weights, state = list(learner.export_hf_weights()), copy.deepcopy(learner.state_dict())
    assert state["ref_model"] is None and set(state["ref_adapters"]) == set(state["lora"])
    again = make()
    again.load_hf_weights(weights)
    again.load_state_dict(copy.deepcopy(state))
    assert torch.equal(again.compute_logprobs(batch, reference=True), policy)
    with pytest.raises(ValueError, match="has no reference adapters but this run needs them"):
        make().load_state_dict(dict(copy.deepcopy(state), ref_adapters=None))


def test_the_memory_estimate_counts_a_fixed_reference_as_adapters_under_lora():
    from pacs_fast.trainer.memory_model import learner_memory, lora_params, model_params, model_shape

    fixed = ["model.dtype=bfloat16", "algo.name=pacs", "algo.ref=fixed"]
    full, lora = load_config(None, fixed), load_config(None, fixed + ["model.lora_rank=16"])
    shape = model_shape(full)
    a, b = learner_memory(full, shape, tokens=4096, device="cpu"), learner_memory(lora, shape, tokens=4096,
                                                                                   device="cpu")
    assert a["reference"] == model_params(shape) * 2 and b["reference"] == lora_params(shape, 16) * 2
    rollout = load_config(None, ["model.dtype=bfloat16", "model.lora_rank=16"])  # ref=rollout: none held
    assert learner_memory(rollout, shape, tokens=4096, device="cpu")["reference"] == 0


def test_dropout_masks_are_the_steps_whatever_ran_before(tiny, seed):
    """An update with active dropout (model.lora_dropout) draws its masks from generators seeded with its step's
    seed and leaves torch's own as they were: the same update after other draws gives the same adapters, another
    step's seed other ones."""
    gen = torch.Generator().manual_seed(seed)
    batch = _batch(gen)

    def trained(update_seed, draws):
        torch.manual_seed(123)
        model = _model(tiny)
        add_lora(model, rank=4, alpha=8, dropout=0.3, target_modules="all-linear")
        learner = _learner(model)
        assert learner.has_dropout and not learner.fuses_old_logprobs
        _update(learner, batch)  # (moves B off 0: dropout then changes the forward)
        torch.rand(draws)  # whatever ran between (a held-out evaluation's sampling)
        state = torch.random.get_rng_state()
        _update(learner, batch, seed=update_seed)
        assert torch.equal(torch.random.get_rng_state(), state)  # torch's generators as they were
        return [t.clone() for n, t in model.state_dict().items() if ".lora_" in n]

    a, b, c = trained(7, 0), trained(7, 1000), trained(8, 0)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert any(not torch.equal(x, y) for x, y in zip(a, c))


def test_eval_of_a_checkpoints_adapter_folder_names_the_checkpoint(tiny, tmp_path, capsys):
    """--model <checkpoint>/adapter (a LoRA run's PEFT adapter folder) had been "not a Hugging Face model folder"."""
    import shutil

    from pacs_fast import eval as ev

    ckpt = tmp_path / "step_000003"
    shutil.copytree(tiny, ckpt)
    (ckpt / "adapter").mkdir()
    (ckpt / "adapter" / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    assert ev.main(["--model", str(ckpt / "adapter"), "--benchmarks", "amc23", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a PEFT adapter folder" in err and f"merged weights, {ckpt}" in err, err


def test_a_resume_on_a_checkpoint_copy_stops_with_one_line_and_skips_nothing(tmp_path, warm_cache, capsys):
    """The same refusal through --resume: a base mismatch is the run's settings, not a damaged checkpoint (it had
    been reported as 'skipping checkpoint' for every checkpoint, then 'no usable checkpoint')."""
    import shutil

    from test_train import TINY

    base = tmp_path / "base"
    shutil.copytree(make_tiny_model(tmp_path / "tiny", seed=3, tie_word_embeddings=False), base)
    code, _, err = cli(TINY + [f"warmup.cache_dir={warm_cache}", f"train.out_dir={tmp_path}", "train.run_name=r",
                              f"model.path={base}", "model.lora_rank=4", "learner.lr=1e-3", "train.steps=2",
                              "train.save_every=1", "train.tensorboard=false", "reward.noise_fp=0.4"], capsys)
    assert code == 0, err
    run = tmp_path / "r"
    from safetensors.torch import load_file

    merged, own = (load_file(str(f / "model.safetensors")) for f in (run / "checkpoints" / "step_000002", base))
    assert any(not torch.equal(merged[k], own[k]) for k in merged)  # (the adapters moved: the copy is not the base)
    kept = {p: p.read_bytes() for p in (run / "checkpoints").rglob("*") if p.is_file()}
    shutil.move(base, tmp_path / "moved")
    shutil.copytree(run / "checkpoints" / "step_000002", tmp_path / "copy")
    code, out, err = cli(["--resume", str(run), "train.steps=3", f"model.path={tmp_path / 'copy'}"], capsys)
    errors = [x for x in err.splitlines() if x.startswith("error: ")]  # (after the model loaded: the base's digest)
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert "model.path's weights are not the base the checkpoint's LoRA adapters" in errors[0]
    assert "skipping checkpoint" not in out + err
    assert {p: p.read_bytes() for p in (run / "checkpoints").rglob("*") if p.is_file()} == kept
    code, _, err = cli(["--resume", str(run), "train.steps=3", f"model.path={tmp_path / 'moved'}"], capsys)
    assert code == 0, err


def test_the_adapter_config_is_the_same_file_in_every_process(tiny, tmp_path):
    """all-linear's target modules are a set (PEFT's), in string-hash order, which differs per process: two runs of the
    same settings (and a resumed run against its uninterrupted twin) wrote adapter_config.json files that differed
    before 2026-12-03. Saved in two processes of different PYTHONHASHSEED now, the files are byte-identical."""
    import os
    import subprocess
    import sys

    script = ("import sys, torch\nfrom transformers import AutoModelForCausalLM\n"
              "from pacs_fast.learner.lora import add_lora, save_adapter\n"
              "m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)\n"
              "add_lora(m, rank=4, alpha=8, dropout=0.0, target_modules='all-linear')\n"
              "save_adapter(m, sys.argv[2], base=sys.argv[1])\n")
    files = []
    for seed in ("1", "2"):
        out = tmp_path / f"adapter{seed}"
        proc = subprocess.run([sys.executable, "-c", script, str(tiny), str(out)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "PYTHONHASHSEED": seed, "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stderr[-2000:]
        files.append((out / "adapter_config.json").read_text())
    assert files[0] == files[1]
    targets = json.loads(files[0])["target_modules"]
    assert len(targets) == 7 * 2 and targets == sorted(targets)  # (q k v o gate up down of the tiny model's 2 layers)
