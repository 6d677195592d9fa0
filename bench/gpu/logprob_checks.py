"""What bench/gpu/logprobs.py records beside its times (issue 39 item 5: reports a kernel engineer can trust).

- :func:`reference_errors`: the float64 errors of one method's log-probs, entropies and both gradients (``dh``,
  ``dW``) **at the benchmarked shape**, i.e. of exactly the launches the timing ran (a check on 256 sliced rows
  would run other launches: the launch parameters depend on N). The reference streams the vocabulary in chunks
  in float64 (three passes: the log-sum-exp, then the entropies and the label log-probs, then the gradients), so
  it needs a few ``[N, chunk]`` float64 buffers, never ``[N, V]``.
- :func:`sm_clock_mhz`: the SM clock now, read before and after each timing (NVML where ``pynvml`` imports, else
  ``nvidia-smi``; None where neither answers): a timing whose clock moved says so in the JSON.

The loss whose gradients are checked is the benchmark's own: ``L = sum_i gl_i logp_i + sum_i gh_i H_i`` (log-prob
of the label and entropy of row ``i``), so ``dL/dz_ij = gl_i (1[j = y_i] - p_ij) - gh_i p_ij (log p_ij + H_i)``,
times ``1 - (z_ij / cap)^2`` under a soft cap ``z = cap tanh(x / cap)``; ``dh = dL/dx W``, ``dW = dL/dx^T h``.
"""
from __future__ import annotations

import shutil
import subprocess

import torch


def _logits(h, w, softcap):
    x = h @ w.T
    return x if not softcap else softcap * torch.tanh(x / softcap)


def reference_errors(logp, ent, hidden, weight, labels, gl, gh, grad_h=None, grad_w=None, softcap=None,
                     chunk_elems: int = 1 << 27) -> dict:
    """Max |method - float64 reference| of ``logp`` [N] (0-d: a loss-only method's ``sum_i logp_i``, key ``loss``;
    pass ``gl`` = 1, ``gh`` = 0 for its gradients), ``ent`` [N] (None: not checked) and, when given, the
    gradients ``grad_h`` [N, H] and ``grad_w`` [V, H] of the benchmark's loss, over every row and column; each
    with ``*_scale`` = max |reference| (so ``err / scale`` is the relative error). ``hidden`` [N, H], ``weight``
    [V, H] as the method saw them (their float64 values are the reference's inputs); ``chunk_elems``: the
    float64 elements of one ``[N, chunk]`` buffer (2**27: 1 GiB)."""
    h = hidden.detach().double()
    n, v = h.shape[0], weight.shape[0]
    step = max(1, min(v, chunk_elems // max(1, n)))
    chunks = [(c, min(v, c + step)) for c in range(0, v, step)]
    wd = lambda a, b: weight[a:b].detach().double()  # noqa: E731 (one chunk of the head in float64)
    m = torch.full((n,), float("-inf"), dtype=torch.float64, device=h.device)
    s = torch.zeros(n, dtype=torch.float64, device=h.device)
    for a, b in chunks:  # 1. log-sum-exp, online over the chunks
        z = _logits(h, wd(a, b), softcap)
        m_new = torch.maximum(m, z.max(1).values)
        s = s * torch.exp(m - m_new) + torch.exp(z - m_new[:, None]).sum(1)
        m = m_new
    lse = m + torch.log(s)
    pz = torch.zeros_like(lse)
    ref_logp = torch.zeros_like(lse)
    rows = torch.arange(n, device=h.device)
    for a, b in chunks:  # 2. entropies (lse - sum p z) and the labels' log-probs
        z = _logits(h, wd(a, b), softcap)
        pz += (torch.exp(z - lse[:, None]) * z).sum(1)
        inside = (labels >= a) & (labels < b)
        ref_logp[inside] = z[rows[inside], labels[inside] - a] - lse[inside]
    ref_ent = lse - pz
    if logp.dim() == 0:  # a loss-only method (Liger's FLCE, cut-cross-entropy): its sum of the label log-probs
        ref = ref_logp.sum()
        out = {"loss": float((logp.detach().double() - ref).abs()), "loss_scale": float(ref.abs())}
    else:
        out = {"logp": float((logp.detach().double() - ref_logp).abs().max()), "logp_scale": float(ref_logp.abs().max())}
    if ent is not None:
        out.update(entropy=float((ent.detach().double() - ref_ent).abs().max()), entropy_scale=float(ref_ent.abs().max()))
    if grad_h is None and grad_w is None:
        return out
    gld, ghd = gl.double()[:, None], gh.double()[:, None]
    dh = torch.zeros_like(h)
    err_w = scale_w = 0.0
    for a, b in chunks:  # 3. the gradients: dh summed over the chunks, dW compared chunk by chunk
        w = wd(a, b)
        x = h @ w.T
        z = x if not softcap else softcap * torch.tanh(x / softcap)
        logp_z = z - lse[:, None]
        p = torch.exp(logp_z)
        dz = -gld * p - ghd * p * (logp_z + ref_ent[:, None])
        inside = (labels >= a) & (labels < b)
        dz[rows[inside], labels[inside] - a] += gld[inside, 0]
        if softcap:
            dz = dz * (1.0 - (z / softcap) ** 2)
        dh += dz @ w
        if grad_w is not None:
            ref_w = dz.T @ h
            err_w = max(err_w, float((grad_w[a:b].double() - ref_w).abs().max()))
            scale_w = max(scale_w, float(ref_w.abs().max()))
    if grad_h is not None:
        out.update(dh=float((grad_h.double() - dh).abs().max()), dh_scale=float(dh.abs().max()))
    if grad_w is not None:
        out.update(dW=err_w, dW_scale=scale_w)
    return out


def format_errors(err) -> str:
    """A log-prob row's float64 errors as one line: ``logp 1.8e-05 (rel 1.6e-06), entropy ..., dh ..., dW ...``
    (relative to the reference's largest value; rows from before 2026-12-04 carry logp / entropy only)."""
    if not isinstance(err, dict):
        return str(err)
    parts = []
    for k in ("logp", "loss", "entropy", "dh", "dW"):
        if isinstance(err.get(k), (int, float)):
            scale = err.get(f"{k}_scale")
            parts.append(f"{k} {err[k]:.2g}" + (f" (rel {err[k] / scale:.2g})" if scale else ""))
    return ", ".join(parts) or "-"


_NVML = []  # [handle getter] once pynvml imported and initialised; [None] where it cannot be


def sm_clock_mhz(device=None) -> int | None:
    """The SM clock of ``device`` (a CUDA device; default the current one) in MHz now: NVML through ``pynvml``
    where it imports, else ``nvidia-smi``; None off-GPU or where neither answers."""
    if not torch.cuda.is_available():
        return None
    index = torch.device(device if device is not None else "cuda").index
    index = torch.cuda.current_device() if index is None else index
    if not _NVML:
        try:
            import pynvml
            pynvml.nvmlInit()
            _NVML.append(lambda i: pynvml.nvmlDeviceGetClockInfo(pynvml.nvmlDeviceGetHandleByIndex(i),
                                                                  pynvml.NVML_CLOCK_SM))
        except Exception:  # noqa: BLE001 - not installed, or no NVML here: nvidia-smi below
            _NVML.append(None)
    if _NVML[0] is not None:
        try:
            return int(_NVML[0](index))
        except Exception:  # noqa: BLE001
            pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        text = subprocess.run([smi, "-i", str(index), "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        return int(text.splitlines()[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None
