"""Fused layer ops for the torch learner's Hugging Face model: RMSNorm and SwiGLU through Liger-Kernel.

``learner.fused_layers`` (issue 38): ``on`` replaces, on this model instance only, the forward of every
LLaMA-style RMSNorm (``Qwen2RMSNorm``, ``LlamaRMSNorm``, ``MistralRMSNorm``, ``Qwen3RMSNorm``: a weight and
``variance_epsilon``, the norm in fp32, the cast back before the weight) with Liger-Kernel's one-kernel
RMSNorm (casting mode "llama": the same roundings) and the forward of every gated MLP (``gate_proj``,
``up_proj``, ``down_proj`` and SiLU) with ``down_proj(silu_mul(gate_proj(x), up_proj(x)))``, Liger's fused
SiLU-and-multiply (its backward recomputes SiLU instead of keeping it). ``auto`` does that where it can
run (a CUDA device and ``liger-kernel`` installed), ``off`` keeps the model's own ops.

Per instance, not Liger's ``apply_liger_kernel_to_*``: those rebind the ``transformers`` module's classes and
``apply_rotary_pos_emb`` for every model of that architecture built later in the process (a reference
model, an evaluation copy). The parameters, ``state_dict`` and checkpoints are unchanged; a deep copy (the
reference model) keeps the fused forwards, bound to its own modules. Not fused here: RoPE (Hugging Face's
attention calls a module-level function, which cannot be replaced for one instance) and the residual adds
(fusing them with the norm means rewriting each decoder layer's forward). Liger's RMSNorm runs with
``in_place=False``: its in-place backward overwrites the incoming gradient, which is safe only when no other
consumer reads it.

Liger's Triton kernels need a GPU (Triton's CPU interpreter cannot run them): the CPU tests check the
wiring with exact torch twins of the two ops (``ops=``); their values on a GPU are checked by
``tests/test_fused_layers.py``'s GPU test and the learner benchmark's fused row (bench/gpu/learner.py).
"""
from __future__ import annotations

import importlib.util
import types
from typing import Callable, NamedTuple

import torch

MODES = ("auto", "on", "off")
#: class names whose forward is the LLaMA-style RMSNorm (fp32 norm, cast back, times the weight)
RMS_NORMS = ("Qwen2RMSNorm", "LlamaRMSNorm", "MistralRMSNorm", "Qwen3RMSNorm")


class FusedOps(NamedTuple):
    """``rms_norm(x, weight, eps)`` (LLaMA casting) and ``silu_mul(a, b)`` = silu(a) * b."""
    rms_norm: Callable
    silu_mul: Callable


def liger_ops() -> FusedOps:
    """Liger-Kernel's functional ops (ImportError when ``liger-kernel`` is not installed)."""
    from liger_kernel.transformers.functional import liger_rms_norm, liger_swiglu

    def rms_norm(x, weight, eps):
        return liger_rms_norm(x, weight, eps, offset=0.0, casting_mode="llama", in_place=False)

    return FusedOps(rms_norm, liger_swiglu)


def torch_ops() -> FusedOps:
    """The two ops in plain torch, as Hugging Face's modules compute them (the CPU tests' twins)."""
    def rms_norm(x, weight, eps):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(x.dtype)

    return FusedOps(rms_norm, lambda a, b: torch.nn.functional.silu(a) * b)


def why_not(device) -> str | None:
    """Why the fused ops cannot run for a model on ``device`` (None when they can)."""
    if torch.device(device).type != "cuda":
        return f"Liger-Kernel's Triton kernels need a CUDA GPU (the model is on {torch.device(device).type})"
    if importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel is not installed (pip install liger-kernel)"
    return None


def _is_rms_norm(module) -> bool:
    return (type(module).__name__ in RMS_NORMS and hasattr(module, "variance_epsilon")
            and isinstance(getattr(module, "weight", None), torch.nn.Parameter) and module.weight.dim() == 1)


def _is_swiglu_mlp(module) -> bool:
    act = getattr(module, "act_fn", None)
    return (all(isinstance(getattr(module, n, None), torch.nn.Linear) for n in ("gate_proj", "up_proj", "down_proj"))
            and (isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"))  # (transformers')


def _rms_norm_forward(self, hidden_states):
    return self._fused_ops.rms_norm(hidden_states, self.weight, self.variance_epsilon)


def _swiglu_forward(self, x):
    return self.down_proj(self._fused_ops.silu_mul(self.gate_proj(x), self.up_proj(x)))


def fuse_layers(model: torch.nn.Module, ops: FusedOps | None = None) -> dict[str, int]:
    """Replaces, on ``model``'s modules only, each LLaMA-style RMSNorm's and gated SiLU MLP's forward with
    the fused ops (``ops``: Liger-Kernel's by default). Returns ``{"rms_norm": n, "swiglu": n}``, the modules
    replaced; :func:`unfuse_layers` restores them. Idempotent."""
    ops = ops or liger_ops()
    done = {"rms_norm": 0, "swiglu": 0}
    for module in model.modules():
        kind = "rms_norm" if _is_rms_norm(module) else ("swiglu" if _is_swiglu_mlp(module) else None)
        if kind is None:
            continue
        module._fused_ops = ops
        module.forward = types.MethodType(_rms_norm_forward if kind == "rms_norm" else _swiglu_forward, module)
        done[kind] += 1
    return done


def unfuse_layers(model: torch.nn.Module) -> int:
    """Gives every module :func:`fuse_layers` replaced its own forward back; returns how many."""
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
    reason = why_not(device)
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
    return f"fused layers: Liger-Kernel RMSNorm x{done['rms_norm']}, SwiGLU x{done['swiglu']}"
