"""Backend choice shared by the ops: ``"triton"`` kernels or the chunked ``"torch"`` path."""
from __future__ import annotations

import os

import torch

from pacs_fast.kernels import dispatch

BACKENDS = ("auto", "triton", "torch")


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def triton_interpreted() -> bool:
    """``$TRITON_INTERPRET`` as Triton reads it: on for 1 / true / on / yes (any case), off for anything else
    ("false" and "off" included: Triton then compiles for a GPU)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


def resolve_backend(backend: str, *tensors: torch.Tensor) -> str:
    """Returns ``"triton"`` or ``"torch"``.

    ``auto``: Triton when the tensors are on CUDA and Triton is installed, else torch.
    ``triton``: compiled on CUDA tensors; on CPU tensors only under ``TRITON_INTERPRET=1``
    (the Triton interpreter, used by the tests), otherwise a ValueError says why.
    ``PACS_FAST_KERNELS=torch`` (kernels/dispatch.py): ``auto`` and ``triton`` both give torch (an
    unknown value of the variable: a ValueError naming it). Meta tensors always take the torch path.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if dispatch.mode() == "torch":
        return "torch"
    if any(t.is_meta for t in tensors):  # shapes only (fake / meta tensors): no kernel can run on them
        return "torch"
    on_cuda = all(t.is_cuda for t in tensors)
    if backend == "auto":
        return "triton" if on_cuda and triton_available() else "torch"
    if backend == "triton":
        require_triton(*tensors)
    return backend


def require_triton(*tensors: torch.Tensor) -> None:
    """A ValueError unless Triton kernels can run on these tensors: the package installed, and the
    tensors on CUDA or the interpreter on (``TRITON_INTERPRET=1``). The Triton-only ops (the fused PACS
    loss) call this whatever ``PACS_FAST_KERNELS`` says."""
    if not triton_available():
        raise ValueError("backend='triton' needs the triton package (pip install 'pacs_fast[triton]')")
    if not all(t.is_cuda for t in tensors) and not triton_interpreted():
        raise ValueError("backend='triton' on CPU tensors needs TRITON_INTERPRET=1 (the Triton "
                         "interpreter); use backend='torch' or 'auto' on CPU")


def refuse_double_backward(op: str, instead: str) -> None:
    """Called first in a backward that is not itself differentiable (it writes into buffers, or runs a
    kernel). Grad mode is on inside a backward only under ``create_graph=True``: there this raises, where
    autograd would otherwise return gradients cut from the graph (second derivatives of 0 in a Hessian)
    or fail inside an ``out=`` op with a message that does not say why."""
    if torch.is_grad_enabled():
        raise RuntimeError(f"{op} is differentiable once: its backward cannot run with create_graph=True "
                           f"(double backward, Hessians, gradient penalties); {instead}")


_eager = None


def _run_eager(function, *args):
    # torch.compiler.disable imports torch._dynamo (~1 s): made on the first call under torch.compile,
    # not at import, so processes that never compile do not pay for it.
    global _eager
    if _eager is None:
        _eager = torch.compiler.disable(lambda fn, *a: fn(*a))
    return _eager(function, *args)


def apply_op(function, *args, triton: bool):
    """``function(*args)`` (an autograd ``Function.apply``). With ``triton`` (its path launches Triton kernels)
    under ``torch.compile`` the graph breaks here and it runs as in eager mode: the launchers (tuned tables, the
    checked fallbacks, file reads) are not traceable, and an error of dynamo's tracing inside them was taken
    for a kernel failure (the Triton path then switched off for the process). ``fullgraph=True`` around these
    ops needs ``backend="torch"``, whose path dynamo traces."""
    if triton and torch.compiler.is_compiling():
        return _run_eager(function, *args)
    return function(*args)
