"""Packed rows through varlen attention on the decoder families RL runs train beyond Qwen2/3, LLaMA and Mistral
(2026-12-07): Phi-3/Phi-4-mini (partial rotary, fused qkv, longrope), SmolLM3 (layers without RoPE), OLMo 2 (query /
key norms over all heads), Qwen3-MoE and Mixtral (routed experts), Granite (its own attention scale), Gemma (a
scale of its own head width); and (2026-12-07) GLM-4 / GLM-Z1 / GLM-4.5 (interleaved partial rotary, query / key
biases, GLM-4.5's routed experts and query / key norms), Command R (interleaved rotary, per-head norms), Seed-OSS and
ERNIE 4.5. Each had packed with the dense ``[S, S]`` block mask (the memory and time of the
whole row's scores: issue 38's gap at long responses). Each family's packed varlen forward and backward equal its
padded and dense-mask ones in a float64 model (to the float32 rounding of the families' norms and of transformers'
eager softmax), with the family's own attention module (its eager and SDPA paths): log-probs, entropies, the loss and every parameter's
gradient. Families whose attention varlen cannot compute stay on the dense mask, by name: a sliding window (Gemma 2
and 3, Mistral's 4k window), attention sinks (gpt-oss), multi-head latent attention's value width (DeepSeek-V2/3).
"""
import pytest
import torch

from pacs_fast.config import AlgoConfig, LearnerConfig
from pacs_fast.learner.packing import packed_attention_mode, restores_attention
from pacs_fast.learner.torch_learner import TorchLearner
from pacs_fast.ops import varlen_attention as va
from test_varlen_attention import assert_same, forward_and_grads, long_prompt_batch

pytestmark = pytest.mark.usefixtures("dynamo_on")  # (as test_varlen_attention.py)

SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, pad_token_id=0,
             bos_token_id=1, eos_token_id=2)
FAMILIES = {  # model_type -> its settings that matter beside SMALL (the hub's shapes, scaled down)
    "phi3": dict(partial_rotary_factor=0.75, sliding_window=262144, original_max_position_embeddings=64,
                 rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.5 * i for i in range(6)],
                               "long_factor": [1.0 + 3 * i for i in range(6)]}),
    "smollm3": dict(no_rope_layers=[1, 0], use_sliding_window=False, sliding_window=None),
    "olmo2": dict(),
    "qwen3_moe": dict(head_dim=16, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                      decoder_sparse_step=1, mlp_only_layers=[1]),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    "granite": dict(attention_multiplier=0.3, embedding_multiplier=2.0, residual_multiplier=0.5,
                    logits_scaling=4.0),
    "gemma": dict(head_dim=32),
    "glm": dict(head_dim=16, partial_rotary_factor=0.5, attention_bias=True),
    "glm4": dict(head_dim=16, partial_rotary_factor=0.5, attention_bias=True),
    "glm4_moe": dict(head_dim=16, partial_rotary_factor=0.5, attention_bias=True, moe_intermediate_size=32,
                     n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1, use_qk_norm=True),
    "cohere": dict(use_qk_norm=True, logit_scale=0.25),
    "seed_oss": dict(head_dim=16, attention_bias=True, attention_out_bias=False,  # (Seed-OSS-36B's config.json
                     attention_dropout=0.0, residual_dropout=0.0),  # says 0.1 for both: a run applies them)
    "ernie4_5": dict(head_dim=16, use_bias=False),
}


def family_model(kind: str, attention: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(3)
    config = AutoConfig.for_model(kind, **{**SMALL, **FAMILIES[kind]})
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention).double()
    if "num_experts_per_tok" in FAMILIES[kind]:  # (the grouped-matmul experts take no float64 on the CPU)
        model.set_experts_implementation("eager")
    with torch.no_grad():  # (norm weights of ones and zero biases would hide a norm applied at the wrong place)
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_a_familys_packed_varlen_rows_equal_its_padded_and_dense_ones(kind, attention, seed, monkeypatch):
    model = family_model(kind, attention)
    assert va.unsupported(model.config) is None and packed_attention_mode(model, "auto") == "varlen"
    gen = torch.Generator().manual_seed(seed)
    lengths = [1, *torch.randint(20, 90, (4,), generator=gen).tolist(), 5]  # (past phi3's 64: its long factors)
    batch = long_prompt_batch(gen, lengths, 128, G=3)
    algo = AlgoConfig(beta=0.02)
    calls = []
    attend = va.attend
    monkeypatch.setattr(va, "attend", lambda *a, **k: calls.append(a[0].shape[0]) or attend(*a, **k))
    out = {}
    for name, lc in [("padded", LearnerConfig(packing="off", shared_prefix=False)),
                     ("dense", LearnerConfig(packing="on", packed_attention="dense")),
                     ("varlen", LearnerConfig(packing="on", packed_attention="varlen"))]:
        learner = TorchLearner(model, algo=algo, learner=lc)
        out[name] = restores_attention(forward_and_grads)(learner, batch, algo)
        assert model.config._attn_implementation == attention
    assert len(calls) == 2, calls  # (the varlen row went through attend() once a layer)
    m = batch.response_mask > 0
    # a float64 model, but these families' RMSNorms compute in float32 (``x.to(torch.float32)``, Gemma's ``x.float()``)
    # and transformers' eager attention takes its softmax in float32: where the paths' attention differs in summation
    # order (1e-16), a norm's float32 rounding can turn it into 6e-8 relative (Gemma under SDPA: 1.3e-7 of a norm
    # weight's largest gradient; the others were bit-equal), and the eager softmax adds 6e-8 a probability (1e-8 to
    # 3e-7 on log-probs of ~5 after two layers). A wrong boundary, position or scale moves them by O(1e-2) and more.
    rel = 1e-6 if attention == "sdpa" else 2e-5
    assert_same(out["padded"], out["varlen"], m, rel=rel)
    assert_same(out["dense"], out["varlen"], m, rel=rel)


@pytest.mark.parametrize("kind,changes,why", [
    ("gemma2", dict(head_dim=16, sliding_window=16), "model_type=gemma2"),  # (and its soft cap)
    ("mistral", dict(sliding_window=16), "sliding-window"),
    ("gpt_oss", dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=16,
                     layer_types=["full_attention"] * 2), "model_type=gpt_oss"),
    ("deepseek_v2", dict(kv_lora_rank=32, q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=8,
                         n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32), "model_type=deepseek_v2"),
])
def test_families_varlen_cannot_compute_keep_the_dense_mask(kind, changes, why):
    from transformers import AutoConfig

    config = AutoConfig.for_model(kind, **{**SMALL, **changes})
    assert why in (va.unsupported(config) or ""), va.unsupported(config)


def test_a_term_varlen_attention_would_leave_out_is_refused():
    """A soft cap (Gemma 2's), attention sinks (gpt-oss's), a window a sequence passes: were such a family let
    through, its call is refused, not computed without the term. A window no sequence reaches is none (Phi-4-mini's
    262,144: refused, its packed rows had failed once the family was let through)."""
    q = torch.randn(1, 2, 6, 8)
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    for term in ("softcap", "s_aux", "sinks"):
        with pytest.raises(ValueError, match=f"varlen attention has no {term}"):
            va.varlen_attention(None, q, q, q, None, scaling=0.3, cu_seq_lens_q=cu, max_length_q=4, **{term: 1.0})
    out, _ = va.varlen_attention(None, q, q, q, None, scaling=0.3, cu_seq_lens_q=cu, max_length_q=4, softcap=None,
                                 sliding_window=4)  # (a window the longest sequence, 4, does not pass binds nothing)
    assert out.shape == (1, 6, 2, 8)
    with pytest.raises(ValueError, match=r"varlen attention has no sliding window \(3\)"):
        va.varlen_attention(None, q, q, q, None, scaling=0.3, cu_seq_lens_q=cu, max_length_q=4, sliding_window=3)
