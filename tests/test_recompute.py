"""model.recompute_granularity (pacs_fast/learner/recompute.py): selective recompute of each decoder layer's MLP in
the torch learner's Hugging Face model.

The wrapped model must give the plain model's log-probs and gradients bit for bit (the same ops, run again in the
backward), with the MLP's forward shown to run twice, alone and over learner.fused_layers' forward; the tensors
the forward keeps for the backward (counted with saved-tensor hooks) must lose exactly the MLPs' activations, as
the memory model says; and the trainer wires the key (the line it prints, the shared-prefix forward kept).
The megatron learner's selective recompute is checked in tests/test_megatron_thd.py.
"""
import copy

import pytest
import torch

from pacs_fast.learner.fused_layers import FusedOps, fuse_layers, torch_ops
from pacs_fast.learner.recompute import apply_recompute, recompute_mlps
from pacs_fast.trainer.memory_model import activation_bytes_per_token

H, F, L, V = 64, 96, 3, 97


def _model(seed):
    from transformers import Qwen2ForCausalLM

    from pacs_fast.data.tiny import tiny_qwen2_config
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(tiny_qwen2_config(V, hidden_size=H, num_layers=L, num_heads=4, num_kv_heads=2,
                                              intermediate_size=F)).train()


def _logp_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    (logp * torch.linspace(-1, 1, logp.shape[1])).sum().backward()  # reaches every parameter, nothing cancels
    return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _count_mlp_calls(model, calls):
    # (a pre-hook on the MLP's first projection: the backward's recompute stops once the last tensor it needs is
    # saved again, inside down_proj, before any forward hook of it would run)
    for layer in model.model.layers:
        layer.mlp.gate_proj.register_forward_pre_hook(lambda *a: calls.append(1))


@pytest.mark.parametrize("fused", [False, True])
def test_selective_recompute_equals_the_plain_model_bit_for_bit(fused, seed):
    model = _model(seed % 1000)
    ids = torch.randint(0, V, (2, 13), generator=torch.Generator().manual_seed(seed))
    want_logp, want_grads = _logp_and_grads(model, ids)
    calls = []
    _count_mlp_calls(model, calls)
    if fused:  # learner.fused_layers first (the trainer's order), then the recompute wraps the fused forward
        twin = torch_ops()
        fuse_layers(model, ops=FusedOps(twin.rms_norm, lambda a, b: (calls.append("fused"), twin.silu_mul(a, b))[1],
                                        twin.gated_silu))
    line = apply_recompute(model, True, "selective")
    assert line == f"activation recompute: selective (the MLP of {L} decoder layers)"
    assert recompute_mlps(model) == 0  # idempotent
    got_logp, got_grads = _logp_and_grads(model, ids)
    # every MLP ran twice (forward, then again in the backward), the fused op each time where it is installed
    assert calls.count(1) == 2 * L and calls.count("fused") == (2 * L if fused else 0)
    assert torch.equal(got_logp, want_logp)
    for name, g in want_grads.items():
        assert g.abs().max() > 0, name
        assert torch.equal(got_grads[name], g), name
    calls.clear()
    with torch.no_grad():  # no backward: nothing is recomputed, no checkpoint is made
        model(input_ids=ids)
    assert calls.count(1) == L
    ref = copy.deepcopy(model)  # the learner's reference model keeps the wrapper bound to its own modules
    mlp = ref.model.layers[0].mlp
    assert mlp.forward.__self__ is mlp and mlp._forward_to_recompute.__self__ is mlp
    # the fused forward cannot be replaced or removed under the wrapper; undone in order, each comes back
    from pacs_fast.learner.fused_layers import unfuse_layers
    from pacs_fast.learner.recompute import undo_recompute
    for change in (lambda: fuse_layers(model, ops=torch_ops()), lambda: unfuse_layers(model)):
        with pytest.raises(ValueError, match="recompute their forward .*undo_recompute first"):
            change()
    assert undo_recompute(model) == L and not any("_forward_to_recompute" in m.__dict__ for m in model.modules())
    assert ("forward" in model.model.layers[0].mlp.__dict__) is fused  # the fused forward is back, or none
    assert unfuse_layers(model) == (3 * L + 1 if fused else 0) and torch.equal(_logp_and_grads(model, ids)[0],
                                                                                want_logp)


def _saved_bytes(model, ids) -> int:
    """Bytes of the distinct storages the forward keeps for the backward (outside checkpointed regions)."""
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids).logits.float().sum()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in seen.items() if ptr not in params)


def test_selective_recompute_keeps_what_the_memory_model_says(seed):
    """The forward no longer keeps the MLPs' gate, up, SiLU and product (4 F values a token and layer: the memory
    model's ``M``); it may also drop the MLP's input, the norm's output (H values), which the checkpoint holds by
    reference instead of through the saved-tensor hooks. Full recompute keeps less still."""
    ids = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(seed))
    plain = _saved_bytes(_model(0), ids)
    sel = _model(0)
    apply_recompute(sel, True, "selective")
    full = _model(0)
    apply_recompute(full, True, "full")
    N, b = ids.numel(), 4
    dropped = plain - _saved_bytes(sel, ids)
    assert L * 4 * b * F * N <= dropped <= L * (4 * F + H) * b * N, (dropped, L * 4 * b * F * N)
    assert _saved_bytes(full, ids) < plain - dropped
    shape = {"vocab": V, "hidden": H, "layers": L, "heads": 4, "kv_heads": 2, "head_dim": 16, "intermediate": F,
             "bytes": b}
    model_drop = activation_bytes_per_token(shape) - activation_bytes_per_token(shape, recompute="selective")
    assert model_drop == (L - 1) * 4 * b * F  # (the one MLP recomputed at a time in the backward is counted)


def test_the_key_is_checked_and_a_model_without_mlps_is_refused():
    from transformers import GPT2Config, GPT2LMHeadModel

    from pacs_fast.config import load_config, unused_settings, validate
    with pytest.raises(ValueError, match="model.recompute_granularity must be one of full, selective"):
        validate(load_config(None, ["model.recompute_granularity=mlp"]))
    lines = unused_settings(load_config(None, ["model.recompute_granularity=selective"]))
    assert any(x.startswith("model.recompute_granularity=selective has no effect without "
                            "model.gradient_checkpointing=true") for x in lines), lines
    sel = unused_settings(load_config(None, ["model.gradient_checkpointing=true", "model.recompute_granularity="
                                             "selective", "learner.shared_prefix=true"]))
    assert not any("shared_prefix" in x for x in sel)  # the shared-prefix forward still runs (the cache stays on)
    model = _model(0)
    assert apply_recompute(model, False, "selective") is None and not any(
        "_forward_to_recompute" in m.__dict__ for m in model.modules())
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=2, n_positions=16))
    assert recompute_mlps(gpt2) == 2  # any architecture whose decoder layers name their MLP "mlp"
    with pytest.raises(ValueError, match="^model.recompute_granularity=selective: Sequential has no"):
        apply_recompute(torch.nn.Sequential(torch.nn.Linear(2, 2)), True, "selective")
    with pytest.raises(ValueError, match="^model.recompute_granularity must be one of full, selective"):
        apply_recompute(model, True, "core_attn")


def test_a_run_with_selective_recompute_keeps_the_shared_prefix_forward(tmp_path, capsys, warm_cache):
    import json

    from pacs_fast.config import load_config
    from pacs_fast.trainer import train
    cfg = load_config(None, ["train.steps=1", "train.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=6",
                             "data.eval_size=2", "data.arith_ops=+", "data.arith_max_digits=1", "warmup.steps=30",
                             "warmup.batch_size=32", "model.tiny_hidden_size=64", "train.progress=false",
                             "model.gradient_checkpointing=true", "model.recompute_granularity=selective",
                             "learner.packing=off", f"warmup.cache_dir={warm_cache}"])
    train(cfg, tmp_path / "run")
    out = capsys.readouterr().out
    assert "activation recompute: selective (the MLP of 2 decoder layers)" in out
    (rec,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
              if '"learner/forward/' in x]
    assert rec["learner/forward/shared_prefix"] >= 1 and not rec.get("learner/forward/padded")


def test_selective_over_megatrons_padded_attention_is_a_warning():
    """Selective recompute leaves the megatron learner's padded / dense-mask [S, S] scores (sweep of 2026-11-29: no
    word of it); THD rows (auto, on) have none."""
    from pacs_fast.config import load_config
    from pacs_fast.config.hazards import hazard_warnings

    sel = ["learner.backend=megatron", "model.gradient_checkpointing=true", "model.recompute_granularity=selective"]
    # the way out named is the one this configuration can take (a sweep: with packing=auto and the dense mask it said
    # "learner.packing=auto")
    for extra, way in ((["learner.packing=off"], "learner.packing=auto (THD)"),
                       (["learner.packed_attention=dense"], "learner.packed_attention=auto (THD)"),
                       (["learner.packing=off", "learner.packed_attention=dense"],
                        "learner.packing=auto with learner.packed_attention=auto (THD)")):
        (line,) = [x for x in hazard_warnings(load_config(None, sel + extra)) if "recompute_granularity" in x]
        assert "[b, heads, S, S] scores" in line and "model.recompute_granularity=full" in line
        assert line.endswith(way), line
    assert not any("recompute_granularity" in x for x in hazard_warnings(load_config(None, sel)))
