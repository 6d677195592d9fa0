"""Backend choice shared by the ops: ``"triton"`` kernels or the chunked ``"torch"`` path."""
from __future__ import annotations

import os

import torch

BACKENDS = ("auto", "triton", "torch")


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_backend(backend: str, *tensors: torch.Tensor) -> str:
    """Returns ``"triton"`` or ``"torch"``.

    ``auto``: Triton when the tensors are on CUDA and Triton is installed, else torch.
    ``triton``: compiled on CUDA tensors; on CPU tensors only under ``TRITON_INTERPRET=1``
    (the Triton interpreter, used by the tests), otherwise a ValueError says why.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    on_cuda = all(t.is_cuda for t in tensors)
    if backend == "auto":
        return "triton" if on_cuda and triton_available() else "torch"
    if backend == "triton":
        if not triton_available():
            raise ValueError("backend='triton' needs the triton package (pip install 'pacs_fast[triton]')")
        if not on_cuda and not triton_interpreted():
            raise ValueError("backend='triton' on CPU tensors needs TRITON_INTERPRET=1 (the Triton "
                             "interpreter); use backend='torch' or 'auto' on CPU")
    return backend
