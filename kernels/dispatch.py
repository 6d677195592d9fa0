"""Which kernel family runs the ``linear_logprobs`` kernels, checked before it is chosen, and the fallback
when it cannot run: a fast kernel that fails must never fail the user's run.

Families, fastest first (``FAMILIES``, also the fallback order): ``"gluon"`` (kernels/linear_logprobs_gluon.py:
warp-specialised, Hopper), ``"tma"`` (kernels/linear_logprobs_tma.py: TMA copies, sm_90 and later),
``"tiles"`` (the portable pointer kernels: the tiled forward kernels/linear_logprobs_fwd.py, the finish
kernel, the pointer dz kernel, the atomic backward); below them the ops layer's chunked PyTorch path
(pacs_fast/ops/linear_logprobs.py), which catches the tiled kernels' errors. The other ops' kernels
(``token_logprobs``, the PACS loss) are one tiled family each with the same fallback to their torch path.

Before a Gluon / TMA kernel is selected (``choose``):

1. it must take the inputs: its architecture (Gluon: sm_90 only; TMA: sm_90+ or the interpreter), bf16 /
   fp16 rows a TMA descriptor reads (``linear_logprobs_launch.descriptor_inputs``). Otherwise the inputs go
   to the tiled kernels, silently (the documented routing: fp32, other GPUs);
2. it must be usable here: no earlier failure in this process, its module imports (nothing of Gluon is
   imported before 1 has passed), the Triton API it needs exists (``api_problem``), and on a GPU the shared
   memory its launch needs per block (``smem_bytes``, from its tiles) fits the device's
   (``shared_limit``: Triton's driver, else torch). Otherwise the next family is tried, with one warning.

A launch that raises anyway (compile or launch error) is retried with the next family (``failed``): one
``KernelFallbackWarning`` line per (family, kernel, reason), naming the kernel and the error, and the
family's kernel is not tried again in this process (the next call neither retries nor warns). Out-of-memory
errors are not the kernel's fault and pass through, and so does a launch value the user set that no kernel
can take (``tuning.LaunchConfigError``: a typo in ``CONFIG`` / ``POLICY``, a block of 0). Errors surfacing
asynchronously from a kernel that already ran cannot be caught here.

Environment (read on every call):

- ``PACS_FAST_KERNELS``: ``auto`` (or unset: the tuned / built-in choice), ``safe`` (the portable tiled
  Triton kernels only: no Gluon, no TMA), ``torch`` (the chunked PyTorch path of every op: ``backend="auto"``
  and ``"triton"`` resolve to ``"torch"``, pacs_fast/ops/backend.py). Another value: a ValueError.
- ``PACS_FAST_DEBUG_CHECKS=1``: the input checks that read device values (label ranges, ``cu_seqlens``)
  run and raise; by default the hot path makes no device-to-host sync (``debug_checks``).

This module imports only the standard library at import time (torch and the kernel modules inside its
functions), so the ops layer reads ``mode()`` where Triton is not installed.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import os
import warnings

from .caller import stacklevel

ENV = "PACS_FAST_KERNELS"
MODES = ("auto", "safe", "torch")
DEBUG_ENV = "PACS_FAST_DEBUG_CHECKS"
FAMILIES = ("gluon", "tma", "tiles")
MODULES = {"gluon": "linear_logprobs_gluon", "tma": "linear_logprobs_tma"}
NAMES = {"gluon": "Gluon kernel", "tma": "TMA kernel", "tiles": "tiled Triton kernel",
         "torch": "chunked PyTorch path"}
SMEM_SLACK = 2048  # barriers and reduction scratch beside the tiles (compiled sm_90 launches: 0.5-1.3 KB)

_broken: dict = {}  # (family, kernel) -> reason: not tried again in this process
_warned: set = set()  # (family, kernel, reason) already warned about


class KernelFallbackWarning(UserWarning):
    """A kernel family could not run; the next one ran instead (one warning per family and reason)."""


class KernelFailed(RuntimeError):
    """An op whose torch path lives in a higher layer (the PACS loss: pacs_fast/algorithms/pacs.py) had its
    kernel fail (recorded and warned by ``failed``); the caller catches this and runs that path."""


def mode() -> str:
    """``$PACS_FAST_KERNELS``: "auto" (unset or empty), "safe" or "torch"; else a one-line ValueError."""
    raw = os.environ.get(ENV, "")
    val = raw.strip().lower() or "auto"
    if val not in MODES:
        raise ValueError(f"{ENV}={raw!r} is not one of {', '.join(MODES)} (unset means auto)")
    return val


def debug_checks() -> bool:
    """``$PACS_FAST_DEBUG_CHECKS`` set to anything but "", "0", "false", "no", "off"."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def reset() -> None:
    """Forgets every failure and warning (tests)."""
    _broken.clear()
    _warned.clear()


def broken(family: str, kernel: str) -> bool:
    """Whether ``kernel`` of ``family`` (or the family's module) failed earlier in this process."""
    return (family, kernel) in _broken or (family, "import") in _broken


def next_family(family: str) -> str:
    """The family after ``family`` in ``FAMILIES``; "torch" after the tiled kernels."""
    i = FAMILIES.index(family)
    return FAMILIES[i + 1] if i + 1 < len(FAMILIES) else "torch"


def _reason(err: BaseException) -> str:
    """``Type: message`` on one line (a compile error's first and last lines: its file and its cause)."""
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    text = "" if not lines else lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1]}"  # (may be empty)
    return f"{type(err).__name__}: {text[:300]}".rstrip(": ")


def warn_once(family: str, kernel: str, reason: str, message: str) -> None:
    """One warning per (family, kernel, reason): one cause breaking several ops' kernels names each. Warned
    before it is recorded, so that under ``-W error`` every call raises alike."""
    if (family, kernel, reason) not in _warned:
        warnings.warn(f"pacs_fast: {message}", KernelFallbackWarning, stacklevel=stacklevel())
        _warned.add((family, kernel, reason))


def failed(family: str, kernel: str, err: BaseException, key: str | None = None) -> str:
    """``kernel`` of ``family`` raised ``err`` (call inside the ``except``): records it (not tried again;
    ``key="import"``: the whole family), warns once per (family, kernel, reason) and returns the family to run
    instead. Re-raises what is not the kernel's fault (out of memory, interrupts)."""
    import torch

    from .tuning import LaunchConfigError
    if isinstance(err, getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)) or \
            not isinstance(err, Exception) or isinstance(err, LaunchConfigError):  # (the user's value: theirs)
        raise err
    if torch.compiler.is_compiling():  # dynamo tracing a launcher: its error says nothing of the kernel
        raise err
    reason = _reason(err)
    to = next_family(family)
    warn_once(family, kernel, reason, f"the {NAMES[family]} {kernel} failed ({reason}); running the "
                                      f"{NAMES[to]} instead from now on ({ENV}=safe or =torch chooses a path up "
                                      "front)")
    _broken[(family, key or kernel)] = reason
    return to


def takes(family: str, hidden, weight) -> bool:
    """Whether ``family``'s kernels take these inputs on their device (architecture, dtype, descriptor
    alignment): the silent routing, checked before anything of the family is imported."""
    from . import linear_logprobs_launch as L
    if family == "tiles":
        return True
    arch = L.device_arch(hidden.device)
    if family == "gluon" and arch != 90:
        return False
    if family == "tma" and arch is not None and arch < 90:
        return False
    return L.descriptor_inputs(hidden, weight)


def api_problem(family: str) -> str | None:
    """What of the Triton API ``family``'s kernels need is missing (None: all there). Imports the
    family's module first (its own imports check most of it: Gluon's Hopper language module, TMA ops)."""
    mod = importlib.import_module(f".{MODULES[family]}", __package__)
    missing = [n for n in (("stats_gluon", "dlogits_gluon", "dz_usable") if family == "gluon" else
                           ("stats_tma", "dlogits_tma")) if not hasattr(mod, n)]
    missing += _missing_triton_api(family)
    return f"missing {', '.join(missing)}" if missing else None


@functools.lru_cache(maxsize=None)
def _missing_triton_api(family: str) -> list:
    """The Triton names ``family``'s kernels use beyond what their module's import checks (cached: the
    installed Triton does not change in a process; an import error propagates)."""
    import triton.language as tl
    if family == "tma":
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
        params = inspect.signature(tl.range).parameters
        return [f"tl.range({p}=)" for p in ("flatten", "warp_specialize") if p not in params]
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: F401
    return [f"{o.__name__.split('.')[-1]}.{n}" for o, n in ((gluon, "constexpr_function"), (gl, "warp_specialize"),
                                                           (gl, "allocate_shared_memory"), (gl, "NVMMASharedLayout"))
            if not hasattr(o, n)]


def smem_bytes(kernel: str, cfg: dict, itemsize: int) -> int:
    """Shared memory per block a TMA / Gluon launch needs (an upper bound from its tiles): the
    ``num_stages``-deep ring of hidden ``[BLOCK_N, BLOCK_H]`` and weight ``[BLOCK_V, BLOCK_H]`` tiles, the
    dz kernels' epilogue buffer (Gluon: the ``[BLOCK_N, BLOCK_V]`` TMA-store staging tile, two for a
    ping-pong launch; TMA: the dz tile's layout conversion, at most 128 x 128 elements) and
    ``SMEM_SLACK``. tests/test_kernels_compile.py holds it against the compiled launches (within 2 KB on
    sm_90; sm_100's TMA dz kernel converts in registers: 23 KB less)."""
    bn, bv = cfg["BLOCK_N"], cfg["BLOCK_V"]
    ring = cfg["num_stages"] * (bn + bv) * cfg["BLOCK_H"] * itemsize
    staging = 0
    if kernel == "dlogits_gluon":
        staging = (2 if cfg.get("PINGPONG") else 1) * bn * bv * itemsize
    elif kernel == "dlogits_tma":
        staging = min(bn * bv, 128 * 128) * itemsize
    return ring + staging + SMEM_SLACK


def shared_limit(device) -> int | None:
    """Shared memory per block (opt-in maximum) of a CUDA device, None elsewhere."""
    import torch
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return _cuda_shared_limit(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _cuda_shared_limit(index: int) -> int | None:
    try:
        from triton.runtime import driver
        return int(driver.active.utils.get_device_properties(index)["max_shared_mem"])
    except Exception:
        try:
            import torch
            return int(torch.cuda.get_device_properties(index).shared_memory_per_block_optin)
        except Exception:
            return None


def choose(family: str, kernels: dict, hidden, weight):
    """``(family, module)`` to run: ``family`` (one of ``FAMILIES``) when its kernel ``kernels[family]``
    takes these inputs and is usable here, else the family to run instead (with its module; None for
    "tiles"): "tiles" for inputs it does not take (silently), the next family when it is unusable here
    (an earlier failure: silently; its import or Triton API, or its launch's shared memory: one warning)."""
    from . import linear_logprobs_launch as L
    if family != "tiles" and mode() == "safe":
        family = "tiles"
    while family != "tiles":
        kernel = kernels[family]
        if not takes(family, hidden, weight):
            return "tiles", None
        if broken(family, kernel):
            family = next_family(family)
            continue
        try:
            problem = api_problem(family)
            if problem:
                raise ImportError(f"the Triton API of the {NAMES[family]}s: {problem}")
            mod = importlib.import_module(f".{MODULES[family]}", __package__)
        except Exception as e:
            family = failed(family, f"module {MODULES[family]} (for {kernel})", e, key="import")
            continue
        limit = shared_limit(hidden.device)
        need = smem_bytes(kernel, L._cfg(kernel, hidden, weight), hidden.element_size()) if limit else 0
        if limit and need > limit:
            reason = f"its launch needs ~{need} B of shared memory per block, the device has {limit} B"
            warn_once(family, kernel, reason, f"the {NAMES[family]} {kernel} is not used: {reason}; running the "
                                              f"{NAMES[next_family(family)]} instead")
            family = next_family(family)
            continue
        return family, mod
    return "tiles", None
