"""Mixture-of-experts decoders (sweep of 2026-12-03: Qwen3-MoE, Mixtral, DeepSeek-V2 with MLA; transformers 5 fuses
each layer's experts into ``[experts, ...]`` tensors, ``mlp.experts.gate_up_proj`` / ``down_proj``).

- LoRA: PEFT's ``all-linear`` adapts the fused experts (and the router) in place (its ``ParamWrapper``); the merged
  export read ``<layer>.base_layer.weight`` only, so a LoRA run on a MoE model failed writing its first checkpoint
  (``'ParamWrapper' object has no attribute 'weight'``) and its merge left the experts' adapters out.
- The memory model counted one MLP a layer (``intermediate_size``): 3.3B of Qwen3-30B-A3B's 30.5B parameters,
  7.2B of Mixtral-8x7B's 46.7B, so the preflight let runs start that could not hold their weights; the FLOP count
  (MFU) counted one expert of Mixtral's top-2.
"""
import json

import pytest
import torch

from pacs_fast.learner.flops import layer_params, shape_of

FAMILIES = ("qwen3_moe", "mixtral", "deepseek_v2")


def moe_config(family, hidden=64, **changes):
    import transformers as T

    small = dict(vocab_size=128, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
    config, extra = {
        "qwen3_moe": (T.Qwen3MoeConfig, dict(head_dim=hidden // 4, moe_intermediate_size=hidden // 2, num_experts=8,
                                             num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[1])),
        "mixtral": (T.MixtralConfig, dict(num_local_experts=4, num_experts_per_tok=2)),
        "deepseek_v2": (T.DeepseekV2Config, dict(n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                                                 moe_intermediate_size=hidden // 2, first_k_dense_replace=1,
                                                 kv_lora_rank=hidden // 2, q_lora_rank=None, num_key_value_heads=4,
                                                 qk_nope_head_dim=hidden // 4, qk_rope_head_dim=hidden // 4,
                                                 v_head_dim=hidden // 4, head_dim=hidden // 4, topk_method="greedy",
                                                 n_group=1, topk_group=1))}[family]
    return config(**{**small, **extra, **changes})


def moe_model(family, **changes):
    import transformers as T

    torch.manual_seed(1)
    model = T.AutoModelForCausalLM.from_config(moe_config(family, **changes)).float()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.1)
    return model


@pytest.mark.parametrize("family", FAMILIES)
def test_a_lora_merge_holds_the_experts_adapters(family):
    """The merged weights (what the engines load and checkpoints hold) give the adapted model's log-probs: 1e-5 is
    fp32 rounding of ``W + BA`` against ``W x + B A x`` (on the old merge: 1 nat and more, or an AttributeError)."""
    from pacs_fast.learner.lora import add_lora, base_digest, merged_weights

    model = moe_model(family)
    plain = moe_model(family)
    add_lora(model, rank=4, alpha=8, dropout=0.0, target_modules="all-linear")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)  # (PEFT starts B at 0: the adapters would add nothing)
    assert any("experts" in name for name in model.state_dict() if ".lora_" in name)  # (PEFT adapts the experts)
    ids = torch.randint(3, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    merged = merged_weights(model)
    assert set(merged) == set(plain.state_dict())
    base_digest(model)  # (read each adapted tensor: the fused experts too)
    with torch.no_grad():
        want = model(ids).logits.log_softmax(-1)
        before = plain(ids).logits.log_softmax(-1)
        plain.load_state_dict(merged)
        got = plain(ids).logits.log_softmax(-1)
    assert (want - before).abs().max() > 0.1  # (the adapters matter)
    assert (got - want).abs().max() <= 1e-5, family


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("listed", [False, True])
def test_the_dense_mlps_peft_leaves_bare_are_a_warning_line(tmp_path, family, listed):
    """PEFT maps gate_proj / up_proj / down_proj onto the fused experts by name and takes them from a mixture of
    experts' dense MLPs too: Qwen3-MoE's ``mlp_only_layers`` (layer 1 here), DeepSeek-V2's first dense layer and
    its shared experts stay without adapters under all-linear and under each family's usual list (Mixtral's names
    its experts w1..w3, DeepSeek-V2's its MLA projections). The preflight now says so in one warning line naming the
    count (silent before); Mixtral, whose every layer is experts, gets none."""
    from pacs_fast.config import load_config
    from pacs_fast.learner.lora import add_lora, bare_linears, lora_layers
    from pacs_fast.trainer.preflight import check_lora_targets

    usual = {"qwen3_moe": "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
             "mixtral": "q_proj,k_proj,v_proj,o_proj,w1,w2,w3",
             "deepseek_v2": "q_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj,gate_proj,up_proj,down_proj"}[family]
    targets = usual if listed else "all-linear"
    import warnings

    model = moe_model(family)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # (PEFT said the doubled rank of gate_up_proj was ignored)
        add_lora(model, rank=2, alpha=4, dropout=0.0, target_modules=targets)
    ranks = {m.parameter_name: m.r["default"] for m in lora_layers(model).values() if hasattr(m, "parameter_name")}
    assert ranks.get("gate_up_proj", 4) == 4 and ranks.get("down_proj", 2) == 2, ranks  # (doubled: gate and up)
    bare = bare_linears(model, targets)
    dense = {"qwen3_moe": [f"model.layers.1.mlp.{p}" for p in ("gate_proj", "up_proj", "down_proj")],
             "mixtral": [],
             "deepseek_v2": [f"model.layers.{i}.mlp.{s}{p}" for i, s in ((0, ""), (1, "shared_experts."),
                                                                        (2, "shared_experts."))
                             for p in ("gate_proj", "up_proj", "down_proj")]}[family]
    assert sorted(bare) == sorted(dense) and not set(bare) & set(lora_layers(model))
    moe_config(family).save_pretrained(tmp_path)
    lines = check_lora_targets(load_config(None, [f"model.path={tmp_path}", "model.lora_rank=2",
                                                  f"model.lora_target_modules={targets}"]))
    assert len(lines) == (1 if dense else 0), lines
    if dense:
        assert f"PEFT leaves {len(dense)} of the linear layers it names without adapters" in lines[0], lines
        assert dense[0] in lines[0] or bare[0] in lines[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_memory_model_counts_every_expert(tmp_path, family):
    """``model_params`` from ``config.json`` against the built model's parameter count: a lower bound (norms and
    biases left out: under 1% at hidden 256; DeepSeek's MLA low-rank projections are counted as plain attention:
    6% short here, 1% of DeepSeek-V2-Lite's 15.7B), no longer short of all but one MLP a layer (0.16 of the count
    before)."""
    from types import SimpleNamespace

    import transformers as T

    from pacs_fast.trainer.memory_model import model_params, model_shape

    config = moe_config(family, hidden=256)
    config.save_pretrained(tmp_path)
    with torch.device("meta"):
        real = sum(p.numel() for p in T.AutoModelForCausalLM.from_config(config).parameters())
    cfg = SimpleNamespace(model=SimpleNamespace(path=str(tmp_path), dtype="float32"))
    estimate = model_params(model_shape(cfg))
    low = 0.9 if family == "deepseek_v2" else 0.99
    assert low * real <= estimate <= 1.01 * real, (family, estimate, real)


def test_the_flop_count_passes_each_token_through_its_top_k_experts():
    """Mixtral routes each token through 2 of its experts (``num_experts_per_tok``): ``P_layers`` holds 2 expert
    MLPs a layer (it held one: the MFU of a Mixtral update read half), and all experts only for memory."""
    two, one = (shape_of(moe_config("mixtral", num_experts_per_tok=k)) for k in (2, 1))
    H, F, L = 64, 128, 3
    assert layer_params(two) - layer_params(one) == L * 3 * H * F
    dense = shape_of(moe_config("mixtral"))
    dense["moe"] = None
    assert layer_params(dense) == layer_params(one) - L * H * 4  # (one expert: the dense MLP, and the router)
    assert json.dumps(shape_of(moe_config("qwen3_moe"))["moe"]) == json.dumps(
        {"experts": 8, "top_k": 2, "width": 32, "shared": 0, "layers": 2})  # (mlp_only_layers=[1]: dense)


def test_a_router_loss_asked_for_and_not_added_is_a_warning(tmp_path):
    """``output_router_logits: true`` asks transformers' forward (and TRL's GRPOTrainer) to add the router's
    load-balancing loss; the learners' loss leaves it out, which the run's start now says (it said nothing)."""
    from pacs_fast.config import load_config
    from pacs_fast.config.hazards import hazard_warnings

    for ask, coef in ((True, 0.001), (False, 0.001), (True, 0.0)):
        moe_config("qwen3_moe", output_router_logits=ask, router_aux_loss_coef=coef).save_pretrained(tmp_path)
        lines = [w for w in hazard_warnings(load_config(None, [f"model.path={tmp_path}"])) if "router" in w]
        assert len(lines) == (1 if ask and coef else 0), (ask, coef, lines)
    moe_config("qwen3_moe", output_router_logits=True, router_aux_loss_coef=0.01).save_pretrained(tmp_path)
    line, = [w for w in hazard_warnings(load_config(None, [f"model.path={tmp_path}"])) if "router" in w]
    assert "output_router_logits=true (router_aux_loss_coef=0.01)" in line and "is not added" in line, line


@pytest.mark.parametrize("merge_rows", [False, True])
def test_the_hf_engine_decodes_a_model_that_asks_for_its_router_loss(merge_rows):
    """``output_router_logits: true``: transformers' forward added the router's load-balancing loss at each decode
    step, from one step's router logits against the cache's whole attention mask: a RuntimeError (size 4 against
    596) at the first step with padded prompts, in the trainer's first evaluation. The engine's forwards now leave
    it out; the samples equal the same model's without the flag (the loss does not touch the logits)."""
    from pacs_fast.rollout.base import SamplingParams
    from pacs_fast.rollout.hf import HFEngine
    from test_fp32_lm_head import TOK

    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14, 15]]  # (of other lengths: left-padded, with a mask)
    params = SamplingParams(n=2, max_new_tokens=6, seed=3)
    out = []
    for ask in (True, False):
        model = moe_model("qwen3_moe", vocab_size=TOK.vocab_size, output_router_logits=ask)
        got = HFEngine(model, TOK, merge_rows=merge_rows).generate(prompts, params)
        out.append([[c.token_ids for c in row] for row in got])
    assert out[0] == out[1]


@pytest.mark.parametrize("family", FAMILIES)
def test_checkpoints_are_in_the_hubs_layout_and_load_back_in_either(family, tmp_path):
    """transformers 5 fuses these models' experts on load (and renames Mixtral's ``block_sparse_moe`` to ``mlp``).
    The weight export (the engines' sync) keeps every tensor under the model's names (pacs_fast/causal_lm.py
    ``checkpoint_names`` empty: not the router under the hub's and the fused experts under the model's, a mix no
    tool writes); a checkpoint (``save_hf``) holds what transformers' ``save_pretrained`` writes, the hub's layout,
    tensor for tensor (pacs_fast/learner/fused_checkpoint.py; the fused tensors had been written), in one file or a
    block a file (transformers loads those back exactly). A learner on other weights loads each back to the saved
    model's bit for bit, and one written under the model's names too."""
    import transformers as T
    from safetensors.torch import load_file, save_file

    from pacs_fast.causal_lm import checkpoint_names
    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.learner.hf_folder import LazyHFCheckpoint
    from pacs_fast.learner.torch_learner import TorchLearner

    def learner(model):
        return TorchLearner(model, algo=AlgoConfig(name="pacs"), learner=LearnerConfig(), temperature=1.0, horizon=4)

    model = moe_model(family)
    assert checkpoint_names(model, model.state_dict().items()) == {}
    saved = {n: t.clone() for n, t in model.state_dict().items()}
    model.save_pretrained(tmp_path / "hf")
    learner(model).save_hf(tmp_path / "ours")
    hub, ours = (load_file(str(tmp_path / f / "model.safetensors")) for f in ("hf", "ours"))
    assert ours.keys() == hub.keys() and all(torch.equal(ours[n], hub[n]) for n in hub)
    assert not any(n.endswith(("experts.gate_up_proj", "experts.down_proj")) for n in ours)
    (tmp_path / "old").mkdir()
    save_file(saved, str(tmp_path / "old" / "model.safetensors"))
    learner(model).save_hf(tmp_path / "shards", bucket_bytes=1)  # (a unit a file: each block's experts in one)
    index = json.loads((tmp_path / "shards" / "model.safetensors.index.json").read_text())["weight_map"]
    assert index.keys() == hub.keys() and len(set(index.values())) > 3
    loaded = T.AutoModelForCausalLM.from_pretrained(tmp_path / "shards", dtype=torch.float32).state_dict()
    assert all(torch.equal(loaded[n], saved[n]) for n in saved)
    for folder in ("ours", "old", "shards"):
        other = moe_model(family)
        with torch.no_grad():
            for p in other.parameters():
                p.add_(1.0)
        learner(other).load_hf_weights(LazyHFCheckpoint(tmp_path / folder).items())
        assert all(torch.equal(other.state_dict()[n], saved[n]) for n in saved), folder
