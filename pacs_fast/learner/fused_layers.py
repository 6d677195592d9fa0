"""Fused layer ops for the learners' models: RMSNorm and SwiGLU through Liger-Kernel.

``learner.fused_layers`` (issue 38): ``on`` replaces, on this model instance only,

- torch learner (a Hugging Face model): the forward of every LLaMA-style RMSNorm (``Qwen2RMSNorm``,
  ``LlamaRMSNorm``, ``MistralRMSNorm``, ``Qwen3RMSNorm``: a weight and ``variance_epsilon``, the norm in fp32,
  the cast back before the weight) with Liger-Kernel's one-kernel RMSNorm (casting mode "llama": the same
  roundings) and the forward of every gated MLP (``gate_proj``, ``up_proj``, ``down_proj`` and SiLU) with
  ``down_proj(silu_mul(gate_proj(x), up_proj(x)))``, Liger's fused SiLU-and-multiply (its backward
  recomputes SiLU instead of keeping it);
- megatron learner (a megatron-core ``GPTModel`` of megatron's local spec): the forward of every dense
  ``MLP`` (gated SiLU, no bias) with ``linear_fc2(gated_silu(linear_fc1(x)))``, Liger's fused gate-up
  SiLU-and-multiply, which reads both halves of ``linear_fc1``'s ``[..., 2 * ffn]`` output in place (no
  chunk copies) and recomputes SiLU in its backward. Its norms stay ``torch.nn.RMSNorm`` (megatron's
  ``WrappedTorchNorm``): on CUDA that is torch's own one-kernel RMSNorm (``aten::_fused_rms_norm``).

``auto`` does that where it can run (a CUDA device and ``liger-kernel`` installed), ``off`` keeps the
model's own ops.

Per instance, not Liger's ``apply_liger_kernel_to_*`` (or its megatron monkey patch): those rebind the
``transformers`` / megatron module-level classes and functions for every model built later in the process
(a reference model, an evaluation copy). The parameters, ``state_dict`` and checkpoints are unchanged; a
deep copy (the reference model) keeps the fused forwards, bound to its own modules. Not fused here: RoPE
(Hugging Face's attention calls a module-level function, which cannot be replaced for one instance) and
the residual adds (fusing them with the norm means rewriting each decoder layer's forward). Liger's
RMSNorm and its gate-up SwiGLU run with ``in_place=False``: an in-place backward overwrites a buffer (the
incoming gradient, megatron's fc1 output) that recompute may still read. (Its two-tensor SwiGLU, the Hugging Face
path's, writes its gradients over the gate and up tensors it saved, which nothing else reads.)

Liger's Triton kernels need a GPU (Triton's CPU interpreter cannot run them): the CPU tests check the
wiring with exact torch twins of the ops (``ops=``); their values on a GPU are checked by
``tests/test_fused_layers.py``'s GPU tests and the learner benchmark's fused rows (bench/gpu/learner.py).
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import types
from typing import Callable, NamedTuple

import torch

MODES = ("auto", "on", "off")
#: class names whose forward is the LLaMA-style RMSNorm (fp32 norm, cast back, times the weight)
RMS_NORMS = ("Qwen2RMSNorm", "LlamaRMSNorm", "MistralRMSNorm", "Qwen3RMSNorm")


class FusedOps(NamedTuple):
    """``rms_norm(x, weight, eps)`` (LLaMA casting), ``silu_mul(a, b)`` = silu(a) * b and ``gated_silu(y)`` =
    ``silu_mul`` of the two halves of ``y``'s last dimension (megatron's ``linear_fc1`` output: gate, then up)."""
    rms_norm: Callable
    silu_mul: Callable
    gated_silu: Callable


def liger_ops() -> FusedOps:
    """Liger-Kernel's functional ops (ImportError when ``liger-kernel`` is not installed)."""
    from liger_kernel.transformers.functional import liger_rms_norm, liger_swiglu

    def rms_norm(x, weight, eps):
        return liger_rms_norm(x, weight, eps, offset=0.0, casting_mode="llama", in_place=False)

    def gated_silu(y):  # [..., 2f] -> [..., f]; in_place=False: megatron's recompute may read y again
        from liger_kernel.ops.swiglu import LigerFusedGateUpSiLUMulFunction  # (the megatron learner's only)

        out = LigerFusedGateUpSiLUMulFunction.apply(y.reshape(-1, y.shape[-1]), False)
        return out.view(*y.shape[:-1], y.shape[-1] // 2)

    return FusedOps(rms_norm, liger_swiglu, gated_silu)


def torch_ops() -> FusedOps:
    """The ops in plain torch, as Hugging Face's and megatron's modules compute them (the CPU tests' twins)."""
    def rms_norm(x, weight, eps):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(x.dtype)

    def gated_silu(y):
        gate, up = torch.chunk(y, 2, dim=-1)
        return torch.nn.functional.silu(gate) * up

    return FusedOps(rms_norm, lambda a, b: torch.nn.functional.silu(a) * b, gated_silu)


def has_gate_up_op() -> bool:
    """Whether the installed liger-kernel has the fused gate-up SwiGLU the megatron learner uses
    (``liger_kernel.ops.swiglu.LigerFusedGateUpSiLUMulFunction``; liger-kernel 0.8.x from late 2026)."""
    try:
        module = importlib.import_module("liger_kernel.ops.swiglu")
    except ImportError:
        return False
    return hasattr(module, "LigerFusedGateUpSiLUMulFunction")


def why_not(device, *, megatron: bool = False) -> str | None:
    """Why the fused ops cannot run for a model on ``device`` (None when they can); ``megatron``: the megatron
    learner's model, whose MLPs need the fused gate-up op."""
    if torch.device(device).type != "cuda":
        return f"Liger-Kernel's Triton kernels need a CUDA GPU (the model is on {torch.device(device).type})"
    if importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel is not installed (pip install liger-kernel)"
    if megatron and not has_gate_up_op():
        return (f"liger-kernel {_installed_version()} has no fused gate-up SwiGLU (liger_kernel.ops.swiglu."
                "LigerFusedGateUpSiLUMulFunction), which the megatron learner's MLPs need; pip install -U liger-kernel")
    return None


def _installed_version() -> str:
    try:
        return importlib.metadata.version("liger-kernel")
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def _is_rms_norm(module) -> bool:
    return (type(module).__name__ in RMS_NORMS and hasattr(module, "variance_epsilon")
            and isinstance(getattr(module, "weight", None), torch.nn.Parameter) and module.weight.dim() == 1)


def _is_swiglu_mlp(module) -> bool:
    act = getattr(module, "act_fn", None)
    return (all(isinstance(getattr(module, n, None), torch.nn.Linear) for n in ("gate_proj", "up_proj", "down_proj"))
            and (isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"))  # (transformers')


def _is_megatron_swiglu_mlp(module) -> bool:
    """megatron-core's dense ``MLP`` whose unfused activation is exactly ``silu(gate) * up`` (no bias, clamp,
    offset, Transformer Engine activation or megatron's own fusion), as :mod:`pacs_fast.learner.megatron.model`
    builds it."""
    c = getattr(module, "config", None)
    return (type(module).__name__ == "MLP" and type(module).__module__.startswith("megatron.core")
            and hasattr(module, "linear_fc1") and hasattr(module, "linear_fc2") and c is not None
            and c.gated_linear_unit and c.activation_func is torch.nn.functional.silu and not c.add_bias_linear
            and not c.bias_activation_fusion and not getattr(c, "use_te_activation_func", False)
            and getattr(c, "activation_func_clamp_value", None) is None and not getattr(c, "glu_linear_offset", 0))


def _rms_norm_forward(self, hidden_states):
    return self._fused_ops.rms_norm(hidden_states, self.weight, self.variance_epsilon)


def _swiglu_forward(self, x):
    return self.down_proj(self._fused_ops.silu_mul(self.gate_proj(x), self.up_proj(x)))


def _megatron_swiglu_forward(self, hidden_states, per_token_scale=None, **kwargs):
    if per_token_scale is not None:  # (MoE experts' scaling: not in a model this learner builds)
        return type(self).forward(self, hidden_states, per_token_scale, **kwargs)
    gate_up, _ = self.linear_fc1(hidden_states)  # [s, b, 2 * ffn / tp]; no bias (checked)
    return self.linear_fc2(self._fused_ops.gated_silu(gate_up))  # (output, bias) as MLP.forward


_FORWARDS = {"rms_norm": _rms_norm_forward, "swiglu": _swiglu_forward, "megatron_swiglu": _megatron_swiglu_forward}


def _kind(module) -> str | None:
    if _is_rms_norm(module):
        return "rms_norm"
    if _is_swiglu_mlp(module):
        return "swiglu"
    return "megatron_swiglu" if _is_megatron_swiglu_mlp(module) else None


def _refuse_over_recompute(model, what: str) -> None:
    """The selective-recompute wrapper (pacs_fast/learner/recompute.py) sits over a module's forward, the fused
    one included: replacing or removing that forward under it would drop the recompute or keep a stale one."""
    if any("_forward_to_recompute" in m.__dict__ for m in model.modules()):
        raise ValueError(f"{what}: the model's MLPs recompute their forward (recompute_mlps); call "
                         "pacs_fast.learner.recompute.undo_recompute first (fuse, then recompute)")


def fuse_layers(model: torch.nn.Module, ops: FusedOps | None = None) -> dict[str, int]:
    """Replaces, on ``model``'s modules only, each LLaMA-style RMSNorm's and gated SiLU MLP's (Hugging Face or
    megatron) forward with the fused ops (``ops``: Liger-Kernel's by default). Returns ``{"rms_norm": n,
    "swiglu": n}``, the modules replaced; :func:`unfuse_layers` restores them. Idempotent."""
    _refuse_over_recompute(model, "fuse_layers")
    ops = ops or liger_ops()
    done = {"rms_norm": 0, "swiglu": 0}
    for module in model.modules():
        kind = _kind(module)
        if kind is None:
            continue
        module._fused_ops = ops
        module.forward = types.MethodType(_FORWARDS[kind], module)
        done["rms_norm" if kind == "rms_norm" else "swiglu"] += 1
    return done


def unfuse_layers(model: torch.nn.Module) -> int:
    """Gives every module :func:`fuse_layers` replaced its own forward back; returns how many."""
    _refuse_over_recompute(model, "unfuse_layers")
    n = 0
    for module in model.modules():
        if "_fused_ops" in module.__dict__:
            del module.__dict__["_fused_ops"]
            module.__dict__.pop("forward", None)
            n += 1
    return n


def apply_fused_layers(model: torch.nn.Module, mode: str, device) -> str:
    """``learner.fused_layers`` on a loaded model: the line a run prints (what was fused, or why not).
    ``on`` where the ops cannot run is a ValueError naming the key (the config check refuses it before
    loading, :func:`why_not`)."""
    if mode not in MODES:
        raise ValueError(f"learner.fused_layers must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off":
        return "fused layers: off"
    reason = why_not(device, megatron=any(_is_megatron_swiglu_mlp(m) for m in model.modules()))
    if reason is not None:
        if mode == "on":
            raise ValueError(f"learner.fused_layers=on: {reason}")
        return f"fused layers: off ({reason})"
    done = fuse_layers(model)
    if not any(done.values()):
        if mode == "on":
            raise ValueError(f"learner.fused_layers=on: no LLaMA-style RMSNorm or gated SiLU MLP in "
                             f"{type(model).__name__}")
        return f"fused layers: off (no LLaMA-style RMSNorm or gated SiLU MLP in {type(model).__name__})"
    line = "fused layers: Liger-Kernel " + ", ".join(
        f"{name} x{done[key]}" for key, name in (("rms_norm", "RMSNorm"), ("swiglu", "SwiGLU")) if done[key])
    if not done["rms_norm"] and any(isinstance(m, torch.nn.RMSNorm) for m in model.modules()):
        line += " (the norms stay torch.nn.RMSNorm: torch's own fused kernel on CUDA)"
    return line
