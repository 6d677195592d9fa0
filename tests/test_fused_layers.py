"""learner.fused_layers (pacs_fast/learner/fused_layers.py): the model's RMSNorm and SwiGLU MLP through fused ops.

Liger-Kernel's Triton kernels cannot run on the CPU (Triton's interpreter rejects them), so the CPU tests drive
the wiring with the exact torch twins of the two ops (``torch_ops``): the fused model must then give the
unfused model's log-probs and gradients bit for bit, with and without recompute, which fails if a module is
missed, patched twice, given the wrong epsilon or the wrong input. Each op is counted, so the fused forwards
are shown to run. Liger's own values are checked on a GPU (the last test).
"""
import copy

import pytest
import torch

from pacs_fast.learner.fused_layers import (FusedOps, apply_fused_layers, fuse_layers, liger_ops, torch_ops,
                                            unfuse_layers, why_not)


def _counted(calls):
    ops = torch_ops()

    def rms_norm(x, w, eps):
        calls["rms_norm"] += 1
        return ops.rms_norm(x, w, eps)

    def silu_mul(a, b):
        calls["silu_mul"] += 1
        return ops.silu_mul(a, b)

    def gated_silu(y):
        calls["gated_silu"] += 1
        return ops.gated_silu(y)

    return FusedOps(rms_norm, silu_mul, gated_silu)


def _model(arch, seed):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2ForCausalLM

    from pacs_fast.data.tiny import tiny_qwen2_config
    torch.manual_seed(seed)
    if arch == "qwen2":
        return Qwen2ForCausalLM(tiny_qwen2_config(97, hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2,
                                                  intermediate_size=96))
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=96, rms_norm_eps=1e-5, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


def _logp_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    # a loss that reaches every parameter through every layer (not a sum that some terms cancel)
    (logp * torch.linspace(-1, 1, logp.shape[1], device=logp.device)).sum().backward()
    return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("recompute", [False, True])
def test_fused_forwards_equal_the_models_own_bit_for_bit(arch, recompute, seed):
    model = _model(arch, seed % 1000)
    model.train()
    if recompute:
        model.gradient_checkpointing_enable()
    ids = torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(seed))
    want_logp, want_grads = _logp_and_grads(model, ids)
    before = {k: v.clone() for k, v in model.state_dict().items()}

    calls = {"rms_norm": 0, "silu_mul": 0, "gated_silu": 0}
    done = fuse_layers(model, ops=_counted(calls))
    L = model.config.num_hidden_layers
    assert done == {"rms_norm": 2 * L + 1, "swiglu": L}  # two norms per layer and the final one; every MLP
    got_logp, got_grads = _logp_and_grads(model, ids)
    # each fused forward ran (recompute runs each layer's once more in the backward)
    assert calls["rms_norm"] >= 2 * L + 1 and calls["silu_mul"] >= L and calls["gated_silu"] == 0
    assert torch.equal(got_logp, want_logp)
    assert got_grads.keys() == want_grads.keys()
    for name, g in want_grads.items():
        assert g.abs().max() > 0, name
        assert torch.equal(got_grads[name], g), name
    state = model.state_dict()  # parameters and checkpoints are untouched
    assert state.keys() == before.keys() and all(torch.equal(state[k], v) for k, v in before.items())

    # a deep copy (the learner's reference model) keeps fused forwards bound to its own modules
    twin = copy.deepcopy(model)
    mlp = twin.model.layers[0].mlp
    assert mlp.forward.__self__ is mlp and twin.model.norm.forward.__self__ is twin.model.norm
    assert unfuse_layers(model) == 3 * L + 1 and unfuse_layers(model) == 0
    assert "forward" not in model.model.layers[0].mlp.__dict__
    n = calls["rms_norm"]
    assert torch.equal(_logp_and_grads(model, ids)[0], want_logp) and calls["rms_norm"] == n  # its own ops again


def test_a_model_without_llama_style_layers_is_left_alone():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=32, n_layer=1, n_head=2, n_positions=16))
    assert fuse_layers(model, ops=torch_ops()) == {"rms_norm": 0, "swiglu": 0}
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_on_the_cpu_auto_is_off_and_on_is_refused_with_the_key():
    model = _model("qwen2", 0)
    reason = why_not("cpu")
    assert reason and "CUDA" in reason
    line = apply_fused_layers(model, "auto", "cpu")
    assert line.startswith("fused layers: off (") and "CUDA" in line
    assert not any("forward" in m.__dict__ for m in model.modules())  # nothing replaced
    assert apply_fused_layers(model, "off", "cpu") == "fused layers: off"
    with pytest.raises(ValueError, match=r"^learner.fused_layers=on: .*CUDA"):
        apply_fused_layers(model, "on", "cpu")
    with pytest.raises(ValueError, match="learner.fused_layers must be one of auto, on, off"):
        apply_fused_layers(model, "yes", "cpu")


@pytest.mark.parametrize("has_op", [False, True])
def test_a_liger_kernel_without_the_gate_up_op_is_named_for_megatron_only(monkeypatch, has_op):
    """A liger-kernel without the fused gate-up SwiGLU (liger_kernel.ops.swiglu.LigerFusedGateUpSiLUMulFunction),
    which the megatron learner's MLPs need: a reason for the megatron learner (auto: off; on: refused, one line),
    not an ImportError mid-setup (sweep of 2026-11-29); the torch learner, which does not use it, is not refused."""
    import importlib
    import importlib.metadata
    import importlib.util
    import types as pytypes

    find, load = importlib.util.find_spec, importlib.import_module
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "liger_kernel" else
                        find(name, *a))
    fake = pytypes.ModuleType("liger_kernel.ops.swiglu")
    if has_op:
        fake.LigerFusedGateUpSiLUMulFunction = object
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: fake if name == "liger_kernel.ops.swiglu" else
                        load(name, *a))
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.8.1")
    assert why_not("cuda") is None  # the torch learner
    reason = why_not("cuda", megatron=True)
    if has_op:
        assert reason is None
    else:
        assert reason == ("liger-kernel 0.8.1 has no fused gate-up SwiGLU (liger_kernel.ops.swiglu."
                          "LigerFusedGateUpSiLUMulFunction), which the megatron learner's MLPs need; "
                          "pip install -U liger-kernel")


@pytest.mark.parametrize("extra", [[], ["learner.backend=megatron"]])
def test_the_run_refuses_on_where_it_cannot_run_before_any_model_loads(tmp_path, extra):
    from pacs_fast.config import load_config
    from pacs_fast.trainer import train
    from pacs_fast.trainer.loop import SetupError
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: learner.fused_layers=on is refused only without one (or without liger)")
    message = "learner.fused_layers=on: Liger-Kernel's Triton kernels need a CUDA GPU"
    cfg = load_config(None, ["learner.fused_layers=on", f"warmup.cache_dir={tmp_path / 'cache'}", *extra])
    with pytest.raises(SetupError) as info:
        train(cfg, tmp_path / "run")
    msg = str(info.value)
    assert msg.startswith(message) and "\n" not in msg, msg
    assert not (tmp_path / "cache").exists()  # no warm-up (no model) was started


def test_the_config_names_the_key_for_a_bad_value():
    from pacs_fast.config import load_config, unused_settings, validate
    with pytest.raises(ValueError, match="learner.fused_layers"):
        validate(load_config(None, ["learner.fused_layers=always"]))
    lines = unused_settings(load_config(None, ["learner.backend=megatron", "learner.fused_layers=auto"]))
    assert not any("fused_layers" in x for x in lines)  # the megatron learner fuses its MLPs' SwiGLU too


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="Liger-Kernel's Triton kernels need a CUDA GPU; none here")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_liger_fused_layers_match_the_models_own_on_a_gpu(dtype, seed):
    """Liger's RMSNorm and SwiGLU against the model's own ops on the GPU: log-probs within a few roundings of the
    dtype (fp32: 1e-4 absolute on log-probs ~ -4.6, the reductions' order differs; bf16: 0.1, a bf16 rounding of
    the hidden states moved through three layers), gradients within 2% of each tensor's largest (fp32: 1e-3)."""
    pytest.importorskip("liger_kernel", reason="liger-kernel is not installed (pip install liger-kernel)")
    model = _model("qwen2", seed % 1000).to("cuda", dtype)
    ids = torch.randint(0, 97, (2, 37), generator=torch.Generator().manual_seed(seed)).cuda()
    want_logp, want_grads = _logp_and_grads(model, ids)
    assert fuse_layers(model, ops=liger_ops())["swiglu"] == 3
    got_logp, got_grads = _logp_and_grads(model, ids)
    tol, rel = (1e-4, 1e-3) if dtype == torch.float32 else (0.1, 2e-2)
    assert float((got_logp - want_logp).abs().max()) <= tol
    for name, g in want_grads.items():
        err = float((got_grads[name].float() - g.float()).abs().max())
        assert err <= rel * float(g.float().abs().max()), (name, err)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="Liger-Kernel's Triton kernels need a CUDA GPU; none here")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_liger_gated_silu_matches_megatrons_glu_on_a_gpu(dtype, seed):
    """The megatron learner's fused op (Liger's gate-up SiLU-and-multiply on linear_fc1's [s, b, 2f] output, an odd
    width) against megatron's own glu (chunk, silu, multiply), forward and backward: fp32 within 1e-5 of each
    output's largest (the same function, the derivative written another way: a few fp32 roundings); bf16 within
    four bf16 roundings (4 x 2^-8) of it (torch rounds after each of silu, its backward and each product, Liger
    once per output)."""
    pytest.importorskip("liger_kernel", reason="liger-kernel is not installed (pip install liger-kernel)")
    gen = torch.Generator().manual_seed(seed)
    y = (3 * torch.randn(37, 3, 2 * 1003, generator=gen)).to("cuda", dtype).requires_grad_()
    g = torch.randn(37, 3, 1003, generator=gen).to("cuda", dtype)
    want = torch_ops().gated_silu(y)
    (want_dy,) = torch.autograd.grad(want, y, g)
    got = liger_ops().gated_silu(y)
    (got_dy,) = torch.autograd.grad(got, y, g)
    assert got.shape == want.shape and got.dtype == dtype
    rel = 1e-5 if dtype == torch.float32 else 4 * 2.0 ** -8
    for a, b in ((got, want), (got_dy, want_dy)):
        err = float((a.float() - b.float()).abs().max())
        assert err <= rel * float(b.float().abs().max()), err
