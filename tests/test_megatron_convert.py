"""HF <-> megatron weight conversion and the batch alignment helpers (single process, no model)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from pacs_fast.learner.megatron.convert import conversion_rules, hf_to_megatron, megatron_to_hf  # noqa: E402
from pacs_fast.learner.megatron.forward import PAD_LOGIT, left_align, pad_bias, unalign  # noqa: E402
from pacs_fast.learner.megatron.model import padded_vocab_size, transformer_config_from_hf  # noqa: E402

pytestmark = pytest.mark.megatron


def _config(kind="qwen2", *, vocab=130, tied=True, heads=4, kv=2, head_dim=8):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    cls = {"qwen2": Qwen2Config, "qwen3": Qwen3Config, "llama": LlamaConfig}[kind]
    # Qwen3: a head_dim of its own (2x hidden / heads here), as Qwen3-0.6B's 128 against 1,024 / 16
    extra = {"head_dim": 2 * head_dim} if kind == "qwen3" else {}
    return cls(vocab_size=vocab, hidden_size=heads * head_dim, intermediate_size=24, num_hidden_layers=2,
               num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=tied,
               max_position_embeddings=64, **extra)


def _random_hf_state(cfg, gen):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(cfg)
    state = {k: torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


@pytest.mark.parametrize("kind,tied", [("qwen2", True), ("qwen2", False), ("llama", False), ("qwen3", True)])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_round_trip(seed, kind, tied, tp):
    cfg = _config(kind, tied=tied, heads=8, kv=4)
    state = _random_hf_state(cfg, torch.Generator().manual_seed(seed))
    shards = [hf_to_megatron(state, cfg, tp_size=tp, tp_rank=r) for r in range(tp)]
    back = megatron_to_hf(shards, cfg)
    expect = {k: v for k, v in state.items() if not (tied and k == "lm_head.weight")}
    assert set(back) == set(expect)
    for k in expect:
        assert torch.equal(back[k], expect[k]), k
    # every rank holds equal shards; vocabulary padded to a multiple of tp with zero rows
    emb = [s["embedding.word_embeddings.weight"] for s in shards]
    assert all(e.shape == (padded_vocab_size(cfg.vocab_size, tp) // tp, cfg.hidden_size) for e in emb)
    pad = torch.cat(emb)[cfg.vocab_size:]
    assert pad.numel() == 0 or not pad.any()
    assert ("output_layer.weight" in shards[0]) == (not tied)


def test_qkv_and_fc1_layout(seed):
    """Rank r's fused QKV rows are [q heads of its groups | k | v] per group; fc1 is [gate_r; up_r]."""
    cfg = _config("qwen2", heads=8, kv=4, head_dim=8)
    state = _random_hf_state(cfg, torch.Generator().manual_seed(seed))
    tp, d, qpg = 2, 8, 2
    pre = "model.layers.1."
    for r in range(tp):
        sd = hf_to_megatron(state, cfg, tp_size=tp, tp_rank=r)
        qkv = sd["decoder.layers.1.self_attention.linear_qkv.weight"]
        bias = sd["decoder.layers.1.self_attention.linear_qkv.bias"]
        rows = []
        for g in range(r * 2, (r + 1) * 2):  # 4 kv groups over 2 ranks
            rows += [state[pre + "self_attn.q_proj.weight"][g * qpg * d:(g + 1) * qpg * d],
                     state[pre + "self_attn.k_proj.weight"][g * d:(g + 1) * d],
                     state[pre + "self_attn.v_proj.weight"][g * d:(g + 1) * d]]
        assert torch.equal(qkv, torch.cat(rows))
        assert bias.shape == (qkv.shape[0],)
        fc1 = sd["decoder.layers.1.mlp.linear_fc1.weight"]
        half = cfg.intermediate_size // tp
        assert torch.equal(fc1, torch.cat([state[pre + "mlp.gate_proj.weight"][r * half:(r + 1) * half],
                                           state[pre + "mlp.up_proj.weight"][r * half:(r + 1) * half]]))
        fc2 = sd["decoder.layers.1.mlp.linear_fc2.weight"]
        assert torch.equal(fc2, state[pre + "mlp.down_proj.weight"][:, r * half:(r + 1) * half])


def test_rules_cover_llama_without_bias():
    rules = conversion_rules(_config("llama", tied=False))
    assert not any(k.endswith("linear_qkv.bias") for k in rules)
    assert "output_layer.weight" in rules


def test_rules_cover_qwen3s_query_and_key_norms():
    rules = conversion_rules(_config("qwen3"))
    assert not any(k.endswith("linear_qkv.bias") for k in rules)
    for i in range(2):  # replicated on every tensor-parallel rank
        assert rules[f"decoder.layers.{i}.self_attention.q_layernorm.weight"] == (
            "rep", [f"model.layers.{i}.self_attn.q_norm.weight"])
        assert rules[f"decoder.layers.{i}.self_attention.k_layernorm.weight"] == (
            "rep", [f"model.layers.{i}.self_attn.k_norm.weight"])


def test_bad_inputs_raise(seed):
    cfg = _config()
    state = _random_hf_state(cfg, torch.Generator().manual_seed(seed))
    with pytest.raises(ValueError, match="tp_rank"):
        hf_to_megatron(state, cfg, tp_size=2, tp_rank=2)
    del state["model.norm.weight"]
    with pytest.raises(ValueError, match="model.norm.weight"):
        hf_to_megatron(state, cfg)
    with pytest.raises(ValueError, match="model_type"):
        conversion_rules(type("C", (), {"model_type": "gpt2"})())
    bad = _config()
    bad.hidden_act = "gelu"
    with pytest.raises(ValueError, match="hidden_act"):
        conversion_rules(bad)
    pytest.importorskip("megatron.core")
    with pytest.raises(ValueError, match="tp_size"):
        transformer_config_from_hf(_config(heads=4, kv=2), tp_size=4)


def test_left_align_round_trip(seed):
    gen = torch.Generator().manual_seed(seed)
    B, T = 6, 11
    mask = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        start = int(torch.randint(0, 4, (1,), generator=gen))
        n = int(torch.randint(0, T - start + 1, (1,), generator=gen))
        mask[b, start:start + n] = 1
    ids = torch.randint(1, 50, (B, T), generator=gen) * mask
    ids_l, mask_l, shift, length = left_align(ids, mask)
    assert torch.equal(length, mask.sum(1))
    assert ids_l.shape[1] == max(int(length.max()), 1)
    for b in range(B):
        n = int(length[b])
        assert torch.equal(ids_l[b, :n], ids[b][mask[b].bool()])
        assert not mask_l[b, n:].any()
    vals = torch.randn(B, ids_l.shape[1], generator=gen) * mask_l
    back = unalign(vals, shift, T)
    assert torch.equal(back[mask.bool()], vals[mask_l])
    assert not back[~mask.bool()].any()
    holes = mask.clone()
    holes[0] = torch.tensor([1, 0, 1] + [0] * (T - 3))
    with pytest.raises(ValueError, match="contiguous"):
        left_align(ids, holes)


def test_pad_bias():
    assert pad_bias(128, 64, 1, "cpu") is None
    b = pad_bias(127, 64, 1, "cpu")
    assert b[-1] == PAD_LOGIT and not b[:-1].any()
    assert pad_bias(127, 64, 0, "cpu") is None
