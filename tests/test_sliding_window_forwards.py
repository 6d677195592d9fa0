"""The torch learner on a model with sliding-window layers (Qwen2 with ``use_sliding_window`` and a per-layer mix, as
Gemma 2/3 have; Mistral's window on every layer): its log-probs are the model's own, whatever ``learner.packing`` and
``learner.shared_prefix`` say (sweep of 2026-12-02: the dense packed mask, block-diagonal causal, attended past the
window, and the shared-prefix forward, whose prefixes are padded to the micro-batch's longest, counted the padding into
the window; both off by up to 0.25 in log-prob, silently, under the defaults). The dense mask now keeps the window
(one mask per layer type where the model mixes them), and such a model runs packed or padded rows, not the
shared-prefix forward; the memory check counts its groups unshared (pacs_fast/learner/packing.py)."""
import json

import pytest
import torch

from pacs_fast.config import AlgoConfig, LearnerConfig, load_config
from pacs_fast.data.tiny import tiny_qwen2_config
from pacs_fast.learner.torch_learner import TorchLearner
from pacs_fast.trainer import memory_model
from test_packing import prompted_batch, uneven_batch

WINDOW = 8


def sliding_model(attention, family="qwen2"):
    from transformers import MistralConfig, MistralForCausalLM, Qwen2ForCausalLM

    torch.manual_seed(1)
    cfg = tiny_qwen2_config(128, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128,
                            max_positions=512)
    if family == "mistral":  # no layer types: the window on every layer
        cfg = MistralConfig(**{k: v for k, v in cfg.to_dict().items() if k in MistralConfig().to_dict()
                               and k not in ("layer_types", "model_type", "sliding_window")}, sliding_window=WINDOW)
        model = MistralForCausalLM(cfg).float()
    else:  # a full layer and a sliding one: the mask per layer type
        cfg.use_sliding_window, cfg.sliding_window, cfg.max_window_layers = True, WINDOW, 1
        cfg.layer_types = ["full_attention", "sliding_attention"]
        model = Qwen2ForCausalLM(cfg).float()
    model.config._attn_implementation = attention
    return model


def alone(model, batch):
    """Each row's log-probs from the model's own forward on that row alone (its window applied by the model)."""
    out = torch.zeros(batch.input_ids.shape)
    with torch.no_grad():
        for i in range(batch.input_ids.shape[0]):
            n = int(batch.attention_mask[i].sum())
            ids = batch.input_ids[i:i + 1, :n]
            out[i, 1:n] = model(ids).logits.float().log_softmax(-1)[0, :-1].gather(-1, ids[0, 1:, None])[:, 0]
    return out


@pytest.mark.parametrize("attention,family", [("sdpa", "qwen2"), ("eager", "qwen2"), ("short", "qwen2"),
                                              ("sdpa", "mistral")])
def test_the_learner_keeps_the_window_on_every_forward(seed, attention, family):
    from pacs_fast.ops.short_attention import use_attention

    model = sliding_model("sdpa", family)
    use_attention(model, attention)
    gen = torch.Generator().manual_seed(seed)
    batches = {"uneven": uneven_batch(gen, 2, 2, 128, [30, 12, 25, 40]),   # auto packs these (dense: the window)
               "prompted": prompted_batch(gen, 2, 2, (4, 20))}             # prefixes of unequal lengths
    for name, batch in batches.items():
        want = alone(model, batch)
        m = batch.response_mask > 0
        for packing in ("auto", "on", "off"):
            for shared in (True, False):
                learner = TorchLearner(model, algo=AlgoConfig(),
                                       learner=LearnerConfig(packing=packing, shared_prefix=shared))
                logp, _, _ = learner._forward(model, batch, entropy=False, values=False)
                assert (logp[m] - want[m]).abs().max() <= 1e-5, (name, packing, shared)
                assert not learner.forwards["shared_prefix"], (name, packing, shared)
                assert learner.forwards["packed" if packing == "on" else "padded" if packing == "off" else
                                        "token_slots"], (name, packing, shared)
                # and the gradients: the packed rows' equal the padded rows'
                if packing != "auto" and shared:
                    model.zero_grad(set_to_none=True)
                    logp[m].sum().backward()
                    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
                    if packing == "on":
                        on = grads
                    else:
                        assert (on - grads).abs().max() <= 1e-5 * grads.abs().max(), name


def test_a_sliding_window_model_is_counted_without_the_shared_prefix(tmp_path):
    config = {"vocab_size": 151936, "hidden_size": 896, "num_hidden_layers": 4, "num_attention_heads": 14,
              "num_key_value_heads": 2, "intermediate_size": 4864, "model_type": "qwen2", "use_sliding_window": True,
              "sliding_window": 4096, "max_window_layers": 2}
    for name, extra in (("sw", {}), ("plain", {"use_sliding_window": False})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({**config, **extra}))

    def cfg(name, *overrides):
        return load_config(None, [f"model.path={tmp_path / name}", "data.dataset=math500", "rollout.n=8",
                                  "rollout.max_new_tokens=4096", *overrides])

    # the padded forward's group, G (P + R), not the shared prefix's P + G R; packed rows under auto: the dense mask
    assert memory_model.group_tokens(cfg("sw")) == 8 * (512 + 4096)
    assert memory_model.group_tokens(cfg("plain")) == 512 + 8 * 4096
    assert memory_model.packed_rows_dense(cfg("sw")) and not memory_model.packed_rows_dense(cfg("plain"))
    assert not memory_model.packed_rows_dense(cfg("sw", "learner.packing=off"))
    # GPT-Neo's local layers are a window the learner reads the same way (one rule: packing.shared_prefix_problem)
    (tmp_path / "neo").mkdir()
    (tmp_path / "neo" / "config.json").write_text(json.dumps({
        "model_type": "gpt_neo", "vocab_size": 151936, "hidden_size": 64, "num_layers": 2, "num_heads": 2,
        "attention_types": [[["global", "local"], 1]], "window_size": 8}))
    assert memory_model.windowed_model(cfg("neo")).startswith("the model has local (windowed) attention layers")
    assert memory_model.group_tokens(cfg("neo")) == 8 * (512 + 4096)
