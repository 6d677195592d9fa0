"""The torch learner on decoder families other than the built-in Qwen2 (sweep of 2026-12-02): its log-probs are the
model's own under every ``learner.packing`` / ``learner.packed_attention``, for Llama with attention biases and a tied
head, Qwen3's q/k norms, Phi-3's fused projections, Gemma 3's scaled embeddings and sliding layers, Gemma 2's
attention soft-capping and query scale. A model whose forward transforms the LM head's logits (Gemma 2's
``final_logit_softcapping``: Gemma 2 checkpoints all have it, at 30; Cohere's / Granite's scales) trains with the
torch learner (tests/test_logit_softcap.py); the megatron learner, whose log-prob op computes ``softmax(hidden @ W.T)``
from the head's weight alone (other log-probs than its engine sampled from: 1e-2 nats per token at a cap of 30, 0.2
at 5, with ``rollout/logprob_diff_*`` the only sign), and a transform no learner reproduces are refused, by the
command line before the model loads and by the torch learner."""
import json

import pytest
import torch

from pacs_fast.config import AlgoConfig, LearnerConfig, load_config
from pacs_fast.learner.torch_learner import TorchLearner
from test_hostile_inputs import cli
from test_packing import prompted_batch, uneven_batch
from test_sliding_window_forwards import alone

SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512)
GEMMA = dict(head_dim=16, sliding_window=8, query_pre_attn_scalar=7)


def family_model(family, **changes):
    import transformers as T

    config, model = {"llama_bias_tied": (T.LlamaConfig, T.LlamaForCausalLM),
                     "qwen3": (T.Qwen3Config, T.Qwen3ForCausalLM), "phi3": (T.Phi3Config, T.Phi3ForCausalLM),
                     "gemma3": (T.Gemma3TextConfig, T.Gemma3ForCausalLM),
                     "gemma2": (T.Gemma2Config, T.Gemma2ForCausalLM),
                     "gpt_neo": (T.GPTNeoConfig, T.GPTNeoForCausalLM)}[family]
    extra = {"llama_bias_tied": dict(attention_bias=True, tie_word_embeddings=True), "qwen3": dict(head_dim=32),
             "phi3": dict(pad_token_id=0),
             "gemma3": dict(GEMMA, layer_types=["sliding_attention", "full_attention"]),
             "gemma2": dict(GEMMA, attn_logit_softcapping=1.0, final_logit_softcapping=None),
             "gpt_neo": dict(attention_types=[[["global", "local"], 1]], window_size=8)}[family]
    torch.manual_seed(1)
    model = model(config(**{**SMALL, **extra, **changes})).float()
    with torch.no_grad():  # weights large enough that the soft-capping and the window matter
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.1)
    if family != "gpt_neo":  # (GPT-Neo has no SDPA path: it keeps eager, as transformers gives it)
        model.config._attn_implementation = "sdpa"
    return model


@pytest.mark.parametrize("family", ["llama_bias_tied", "qwen3", "phi3", "gemma3", "gemma2", "gpt_neo"])
def test_the_learners_log_probs_are_the_models_own(seed, family):
    """(GPT-Neo's ``local`` layers, a window of ``window_size``: the shared-prefix forward ignored it, 0.26 nats off
    per token on average in a training run, until :func:`pacs_fast.learner.packing.shared_prefix_problem` read it.)"""
    model = family_model(family)
    gen = torch.Generator().manual_seed(seed)
    for batch in (uneven_batch(gen, 2, 2, 128, [30, 12, 25, 40]), prompted_batch(gen, 2, 2, (4, 20))):
        want = alone(model, batch)
        m = batch.response_mask > 0
        for packing, attention in (("on", "auto"), ("on", "dense"), ("off", "auto"), ("auto", "auto")):
            for shared in (True, False):
                learner = TorchLearner(model, algo=AlgoConfig(), learner=LearnerConfig(
                    packing=packing, packed_attention=attention, shared_prefix=shared))
                logp, _, _ = learner._forward(model, batch, entropy=False, values=False)
                assert (logp[m] - want[m]).abs().max() <= 1e-5, (family, packing, attention, shared)


def test_a_model_whose_logits_the_op_cannot_reproduce_is_refused_by_the_learner():
    model = family_model("gemma2", final_logit_softcapping=30.0)
    TorchLearner(model, algo=AlgoConfig(), learner=LearnerConfig())  # (a cap: reproduced, tests/test_logit_softcap.py)
    TorchLearner(model, algo=AlgoConfig(), learner=LearnerConfig(logprob_backend="triton"))  # (the tiled kernels cap)
    model.config.output_multiplier = 2.0  # (MuseGlimmer's scale, applied before its cap: not a temperature)
    with pytest.raises(ValueError, match="final_logit_softcapping=30.0"):
        TorchLearner(model, algo=AlgoConfig(), learner=LearnerConfig())


@pytest.mark.parametrize("config", [{"model_type": "gemma2"},  # (Gemma2Config's default cap, 30, not written)
                                    {"model_type": "gemma3_text", "final_logit_softcapping": 5.0},
                                    {"model_type": "cohere", "logit_scale": 0.0625},
                                    {"model_type": "granite", "logits_scaling": 8.0}])
def test_the_megatron_learner_refuses_it_before_the_model_loads(tmp_path, config):
    """(The command line refuses megatron on these models earlier, in check_megatron_model: the check is called.)"""
    from pacs_fast.causal_lm import logits_transform
    from pacs_fast.trainer.preflight import check_logits_transform

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**SMALL, **config}))
    megatron = [f"model.path={folder}", "learner.backend=megatron"]
    with pytest.raises(ValueError) as e:
        check_logits_transform(load_config(None, megatron))
    key = next(k for k in config if k != "model_type") if len(config) > 1 else "final_logit_softcapping=30"
    err = str(e.value)
    assert "\n" not in err and f"model.path={folder}: its config has {key}" in err, err
    assert "learner.backend=megatron does not apply it" in err and "not supported" in err, err
    check_logits_transform(load_config(None, [f"model.path={folder}"]))  # the torch learner reproduces it
    for fine in ({"model_type": "gemma3_text"}, {"model_type": "llama"}, {"model_type": "cohere", "logit_scale": 1}):
        (folder / "config.json").write_text(json.dumps({**SMALL, **fine}))
        check_logits_transform(load_config(None, megatron))
    assert logits_transform({"text_config": {"final_logit_softcapping": 30.0}}) == "final_logit_softcapping=30.0"


def test_the_command_line_refuses_a_transform_no_learner_reproduces(tmp_path, capsys):
    """``logits_scaling`` divides Granite's logits and multiplies HyperCLOVA X's: of a model type not known, it is
    refused before the model loads."""
    from pacs_fast.trainer.preflight import check_logits_transform

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**SMALL, "model_type": "llama", "logits_scaling": 8.0}))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "pytorch_model.bin").write_bytes(b"")  # (not loadable: the checks come first)
    runs = tmp_path / "runs"
    code, err = cli([f"model.path={folder}", "data.dataset=math500", f"train.out_dir={runs}"], capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"model.path={folder}: its config has logits_scaling=8.0" in err and "no learner applies it" in err, err
    assert not runs.exists()  # nothing made


def test_lora_names_the_model_does_not_have_are_refused_before_it_loads(tmp_path, capsys):
    """Phi-3 fuses q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj``:
    ``model.lora_target_modules=q_proj,v_proj`` was refused by PEFT ("Target modules ... not found") after the model
    had loaded; it is now refused from the model built on the meta device, naming the layers it has."""
    from pacs_fast.trainer.preflight import check_lora_targets

    folder = tmp_path / "phi3"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**SMALL, "model_type": "phi3", "pad_token_id": 0}))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "pytorch_model.bin").write_bytes(b"")  # (not loadable: the checks come first)
    runs = tmp_path / "runs"
    lora = ["model.lora_rank=4", "model.lora_target_modules=q_proj,v_proj"]
    code, err = cli([f"model.path={folder}", "data.dataset=math500", f"train.out_dir={runs}", *lora], capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "model.lora_target_modules='q_proj,v_proj': q_proj, v_proj not found in this model; its linear layers: " \
           "o_proj, qkv_proj, gate_up_proj, down_proj" in err, err
    assert not runs.exists()
    for fine in (["model.lora_target_modules=qkv_proj,o_proj"], ["model.lora_target_modules=all-linear"]):
        assert check_lora_targets(load_config(None, [f"model.path={folder}", *lora, *fine])) == []  # (the last wins)


def test_attention_auto_keeps_gemma2s_attention_soft_capping():
    """Gemma 2's ``attn_logit_softcapping`` is in transformers' eager attention only: ``model.attention=auto`` (and
    the eval CLI's ``--attention auto``) picked the short matmul attention on the CPU, which left it out (2.4 nats
    off per token at a cap of 1 against the eager forward and vLLM, silently); auto now picks eager for such a model
    and ``short`` is refused."""
    from pacs_fast.ops.short_attention import use_attention

    model = family_model("gemma2")
    ids = torch.randint(3, 128, (2, 30), generator=torch.Generator().manual_seed(0))
    model.set_attn_implementation("eager")
    with torch.no_grad():
        want = model(ids).logits.log_softmax(-1)
        assert use_attention(model, "auto") == "eager"
        assert (model(ids).logits.log_softmax(-1) - want).abs().max() <= 1e-6
    with pytest.raises(ValueError, match="attn_logit_softcapping=1.0"):
        use_attention(model, "short")
    assert use_attention(family_model("gemma3"), "auto") != "eager"  # (no soft-capping: the short attention)


def test_a_soft_cap_of_zero_is_refused_before_the_model_loads(tmp_path):
    """``final_logit_softcapping: 0``: transformers and vLLM test the key against None only, so they divide the logits
    by 0 (every logit 0 or NaN: 3 NaN of 300 on a random Gemma 2, one per position); pacs_fast read 0 as "no cap".
    One line naming the key before anything loads; null is no cap."""
    from pacs_fast.trainer.preflight import check_logits_transform

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**SMALL, "model_type": "gemma2", "final_logit_softcapping": 0.0}))
    with pytest.raises(ValueError, match=r"its config has final_logit_softcapping=0.0, which transformers and vLLM "
                                         r"apply as a cap of 0 .* set it to null for no cap"):
        check_logits_transform(load_config(None, [f"model.path={folder}"]))
    (folder / "config.json").write_text(json.dumps({**SMALL, "model_type": "gemma2", "final_logit_softcapping": None}))
    check_logits_transform(load_config(None, [f"model.path={folder}"]))

