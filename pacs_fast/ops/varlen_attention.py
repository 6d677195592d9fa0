"""Document-masked (varlen) attention for packed rows, as a Hugging Face attention implementation.

A packed micro-batch is ONE row of ``N = sum(lengths)`` tokens whose sequences lie end to end, with
position ids that restart at 0 (RoPE is applied by the model before attention, from those ids, so it
is already per sequence) and boundaries ``cu_seqlens`` (int32 ``[n + 1]``). :func:`attend` runs each
sequence's causal attention and nothing across a boundary, without ever building the ``[N, N]`` mask
of the whole row (the dense packed path builds ``[bins, 1, S, S]``, which forces SDPA off its flash
kernels and computes every masked block). Backends (:data:`BACKENDS`), ``"auto"`` picking the first
usable one:

- ``varlen_attn``: ``torch.nn.attention.varlen.varlen_attn`` (torch >= 2.10, CUDA, fp16/bf16; its
  causal switch is ``is_causal=True`` in 2.10, ``window_size=(-1, 0)`` later; grouped-query attention
  by ``enable_gqa`` where the signature has it, else the key/value heads are repeated);
- ``flash_attn``: flash-attn's ``flash_attn_varlen_func`` when installed (CUDA, fp16/bf16);
- ``flex``: ``flex_attention`` with a document block mask built from ``cu_seqlens`` (compiled on CUDA;
  eager elsewhere, which materialises the scores: for tests only);
- ``sdpa``: one attention call per group of equal-length sequences (``[g, h, L, d]``, ``is_causal``):
  :func:`pacs_fast.ops.short_attention.short_attention` (two matmuls for short ones on the CPU, else
  SDPA's flash kernel). The CPU path, what CI proves exact; anywhere else the fallback.

``PACS_FAST_VARLEN_BACKEND`` forces one. With ``varlen_attn`` / ``flash_attn``, the sequences of at least
``PACS_FAST_VARLEN_LONG`` tokens (default 4,096; 0: none) go through SDPA's causal kernel instead, where the host
knows the lengths (an attribute of both learners' ``cu_seqlens``, which a recomputed layer gets too): on the H200 that is cuDNN's
attention, 1.3x the varlen kernel's speed at 4k-token rows, 1.75x at 32k (:mod:`pacs_fast.ops.varlen_split`).
Registration: :func:`activate` switches a model to
``"pacs_fast_varlen:<base>"``, where ``<base>`` is the implementation it had (``sdpa``, ``eager``,
``pacs_fast_short``): attention calls that carry ``cu_seq_lens_q`` (the keyword transformers passes
from the model's forward to the attention function, as for flash-attention's varlen path) go to
:func:`attend`; every other call (padded rows, the shared-prefix forward with its key/value cache, a
decode step) goes to ``<base>``'s function with ``<base>``'s masks, unchanged. While
:func:`varlen_forward` is active the mask builder returns None (no ``[N, N]`` mask from the packed
position ids). :func:`restore` puts the base name back. :func:`unsupported` says why a model cannot
use it (sliding-window layers, attention dropout, a model family whose attention is not a plain
Qwen2/LLaMA-style causal GQA (:data:`FAMILIES`), a flash-attention base, which is already varlen).
"""
from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
import importlib
import inspect
import os
import sys

import torch

NAME = "pacs_fast_varlen"
BACKENDS = ("varlen_attn", "flash_attn", "flex", "sdpa")
# model families whose attention module applies RoPE from position_ids (or none, SmolLM3's NoPE layers) and calls
# the attention interface with **kwargs (causal, GQA, its own scale; no soft cap, sinks or value width of its own):
# what attend() computes (tests/test_varlen_attention.py, tests/test_varlen_families.py)
FAMILIES = ("qwen2", "qwen3", "llama", "mistral", "phi3", "smollm3", "olmo2", "qwen3_moe", "mixtral", "granite",
            "gemma", "glm", "glm4", "glm4_moe", "cohere", "seed_oss", "ernie4_5")
FLASH = ("flash_attention_2", "flash_attention_3", "flash_attention_4")
_ACTIVE = contextvars.ContextVar("pacs_fast_varlen_forward", default=False)
_FAILED: set = set()  # (backend, device type, dtype) that raised here once: not tried again
_GQA_REFUSED: list = []  # why this torch's varlen_attn refused fewer key/value heads (then they are repeated)
SPLIT_BACKENDS = ("varlen_attn", "flash_attn")  # the kernels whose long sequences go to SDPA (varlen_split.py)
_SPLIT_FAILED: list = []  # the error that switched the split off in this process
LENGTHS_ATTR = "pacs_fast_lengths"  # a packed row's cu_seqlens carries its sequences' host lengths as this attribute
# backend -> calls of attend() it answered in this process (a benchmark reads which kernel really ran)
KERNEL_CALLS: collections.Counter = collections.Counter()


def base_implementation(config) -> str:
    """The implementation a model runs apart from its packed forwards (its name without ours)."""
    name = getattr(config, "_attn_implementation", None) or "sdpa"
    return name.split(":", 1)[1] if name.startswith(NAME + ":") else name


def unsupported(config) -> str | None:
    """Why :func:`attend` would not be this model's exact attention (None: it is)."""
    base = base_implementation(config)
    kind = getattr(config, "model_type", "?")
    if kind not in FAMILIES:
        return f"model_type={kind} (varlen attention is implemented for {', '.join(FAMILIES)})"
    if base in FLASH or base.startswith("flex"):
        return f"the model's attention is {base}"
    window = windowed(config)
    if window:
        return window
    if float(getattr(config, "attention_dropout", 0.0) or 0.0) > 0:
        return f"attention_dropout={config.attention_dropout} > 0"
    return None


def windowed(config) -> str | None:
    """Why some layer of the model attends within a sliding window (None: every layer sees the whole causal past):
    a ``layer_types`` entry ``sliding_attention`` (Qwen2/3 with ``use_sliding_window``, Gemma 2/3), or a
    ``sliding_window`` the family applies to every layer, having no layer types (Mistral, Phi-3). A multimodal
    wrapper's config (Gemma 3 4B+'s, whose window is in its ``text_config``): its language model's."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = getattr(config, "layer_types", None) or []
    window = getattr(config, "sliding_window", None)
    positions = getattr(config, "max_position_embeddings", None)
    if window and positions and window >= positions:  # (Phi-3.5/4-mini's 262,144 of 131,072 positions: none binds)
        return None
    if "sliding_attention" in layers or (window and not layers and getattr(config, "use_sliding_window", True)):
        return f"the model has sliding-window attention (sliding_window={window})"
    return None


def cu_seqlens(lengths: list[int], device=None) -> torch.Tensor:
    """``[0, l0, l0 + l1, ...]`` as int32 (the layout every varlen kernel takes)."""
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    return out.to(device) if device is not None else out


# ------------------------------------------------------------------------------------------- kernels
@functools.lru_cache(maxsize=None)
def _varlen_params() -> frozenset:
    from torch.nn.attention.varlen import varlen_attn

    return frozenset(inspect.signature(varlen_attn).parameters)


def _varlen_attn(q, k, v, cu, max_len, scale):
    from torch.nn.attention.varlen import varlen_attn

    params = _varlen_params()
    kw = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    if "scale" in params:
        kw["scale"] = scale
    elif abs(scale - q.shape[-1] ** -0.5) > 1e-12 * scale:
        raise NotImplementedError("this torch's varlen_attn has no scale argument")
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in params:
            kw["enable_gqa"] = True
        elif not _GQA_REFUSED:
            # torch < 2.12's varlen_attn has no enable_gqa, but calls flash-attention's kernel, which takes fewer
            # key / value heads (as SDPA's enable_gqa does): the heads repeated would be kept for the backward,
            # 2 x heads x head_dim per token and layer (the H200 run of 2026-11-29: ~9 GiB at 66k tokens, 1.5B
            # shape). Where this torch refuses them and takes them repeated, they are repeated from then on; a
            # failure that repeating does not mend is the caller's (attend() falls back to the next backend).
            # Not covered: a torch whose forward takes them and whose backward does not (torch 2.10 / 2.11 call
            # the same flash-attention kernels both ways).
            try:
                return varlen_attn(q, k, v, cu, cu, max_len, max_len, **kw)
            except torch.cuda.OutOfMemoryError:
                raise
            except (RuntimeError, ValueError) as e:
                why = f"{type(e).__name__}: {e}"[:200]
            out = varlen_attn(q, *_repeat_heads(q, k, v), cu, cu, max_len, max_len, **kw)
            _GQA_REFUSED.append(why)
            _warn_once(f"varlen_attn refused {k.shape[1]} key/value heads for {q.shape[1]} query heads; they are "
                       f"repeated ({why})")
            return out
        if "enable_gqa" not in params:
            k, v = _repeat_heads(q, k, v)
    return varlen_attn(q, k, v, cu, cu, max_len, max_len, **kw)


def _repeat_heads(q, k, v):
    """``k, v`` with each key/value head repeated for the query heads it serves (``[N, h, d]``)."""
    return tuple(x.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for x in (k, v))


def _flash_attn(q, k, v, cu, max_len, scale):
    from flash_attn import flash_attn_varlen_func

    return flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len, softmax_scale=scale, causal=True)


@functools.lru_cache(maxsize=None)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True)


def _flex(q, k, v, cu, max_len, scale):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    N = q.shape[0]
    doc = torch.repeat_interleave(torch.arange(cu.numel() - 1, device=q.device), cu.diff().long(), output_size=N)

    def document_causal(b, h, qi, ki):
        return (doc[qi] == doc[ki]) & (qi >= ki)

    cuda = q.device.type == "cuda"
    mask = create_block_mask(document_causal, None, None, N, N, device=q.device, _compile=cuda)
    fn = _compiled_flex() if cuda else flex_attention
    out = fn(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], block_mask=mask,
             scale=scale, enable_gqa=k.shape[1] != q.shape[1])
    return out[0].transpose(0, 1)


def _sdpa_groups(q, k, v, cu, max_len, scale):
    """One causal attention per group of equal-length sequences; ``[N, h, d]`` back in token order.
    Each group is ``[g, h, L, d]``: two matmuls where :mod:`pacs_fast.ops.short_attention` finds them
    faster with gradients (up to 32 x 32 scores on the CPU), else SDPA (its flash kernel, grouped-query
    heads unrepeated). The choice does not depend on the grad mode, so a no-grad forward (old log-probs)
    gives bit for bit the log-probs of the training forward."""
    from pacs_fast.ops.short_attention import MAX_SCORES_TRAIN

    N, h, d = q.shape
    starts = cu.tolist()
    if q.device.type == "cpu" and max_len * max_len <= MAX_SCORES_TRAIN and len(starts) > 2:
        return _short_padded(q, k, v, starts, max_len, scale)
    by_len: dict[int, list[int]] = {}
    for s, e in zip(starts[:-1], starts[1:]):
        by_len.setdefault(e - s, []).append(s)
    outs, where = [], []
    for n, st in by_len.items():
        if len(st) == 1:  # a view, no gather
            idx = torch.arange(st[0], st[0] + n, device=q.device)
            qg, kg, vg = (x[st[0]:st[0] + n].transpose(0, 1)[None] for x in (q, k, v))
        else:
            idx = (torch.tensor(st, device=q.device)[:, None] + torch.arange(n, device=q.device)).reshape(-1)
            qg, kg, vg = (x.index_select(0, idx).view(len(st), n, x.shape[1], d).transpose(1, 2) for x in (q, k, v))
        outs.append(causal_rows(qg, kg, vg, scale).reshape(-1, h, d))
        where.append(idx)
    if len(outs) == 1:  # one length: the group is the whole row, in order
        return outs[0]
    return q.new_zeros(N, h, d).index_copy(0, torch.cat(where), torch.cat(outs))


def causal_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of rows of equal length: ``q [g, h, L, d]``, ``k, v [g, h_kv, L, d]`` (``h`` a multiple of
    ``h_kv``, not repeated); returns ``[g, L, h, d]``. Two matmuls on the CPU up to
    :data:`~pacs_fast.ops.short_attention.MAX_SCORES_TRAIN` scores, else SDPA's causal kernel (flash on a GPU: no
    ``[L, L]`` mask or scores); the choice does not depend on the grad mode."""
    from pacs_fast.ops.short_attention import MAX_SCORES_TRAIN, short_attention

    n = q.shape[2]
    if q.device.type == "cpu" and n * n <= MAX_SCORES_TRAIN:
        return short_attention(None, q, k, v, None, scaling=scale, is_causal=True)[0]
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=n > 1, scale=scale, enable_gqa=k.shape[1] != q.shape[1]).transpose(1, 2)


def _short_padded(q, k, v, starts, max_len, scale):
    """Short sequences on the CPU: all of them padded to ``max_len`` in one ``[n, h, L, d]`` batch
    and one matmul attention whose mask keeps each query on its own sequence's keys up to itself
    (padded queries see their sequence too, so no row is empty; their outputs are dropped)."""
    from pacs_fast.ops.short_attention import short_attention

    N, h, d = q.shape
    st = torch.tensor(starts[:-1])
    lengths = torch.tensor(starts[1:]) - st
    pos = torch.arange(max_len)
    valid = pos[None, :] < lengths[:, None]                                    # [n, L]
    idx = (st[:, None] + pos[None, :]).clamp(max=N - 1)
    qg, kg, vg = (x[idx].transpose(1, 2) for x in (q, k, v))                  # [n, heads, L, d]
    allowed = (valid[:, None, :] & torch.ones(max_len, max_len, dtype=torch.bool).tril())[:, None]
    o = short_attention(None, qg, kg, vg, allowed, scaling=scale)[0]          # [n, L, h, d]
    return o[valid]


_KERNELS = {"varlen_attn": _varlen_attn, "flash_attn": _flash_attn, "flex": _flex, "sdpa": _sdpa_groups}


def usable(backend: str, q: torch.Tensor) -> bool:
    """Whether ``backend`` can run on ``q``'s device and dtype here (imports, not a launch)."""
    return _usable(backend, q.device.type, q.device.index, q.dtype)


@functools.lru_cache(maxsize=None)
def _usable(backend: str, device: str, index, dtype) -> bool:
    if backend == "sdpa":
        return True
    if backend == "flex":
        # (importlib, not `import torch.nn...`: that statement would make `torch` a local name of this
        # function, unbound on the other branches: the bug the first GPU run of 2026-11-29 hit)
        try:
            importlib.import_module("torch.nn.attention.flex_attention")
        except ImportError:
            return False
        return device == "cuda"
    if device != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return False
    try:
        if backend == "varlen_attn":
            from torch.nn.attention.varlen import varlen_attn  # noqa: F401
        else:
            from flash_attn import flash_attn_varlen_func  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.get_device_capability(index)[0] >= 8


@functools.lru_cache(maxsize=None)
def _warn_once(msg: str) -> None:
    print(f"pacs_fast: {msg}", file=sys.stderr, flush=True)


def pick_backend(q: torch.Tensor, backend: str | None = None) -> str:
    """``backend`` (or ``PACS_FAST_VARLEN_BACKEND``, default ``auto``) resolved for ``q``."""
    backend = backend or os.environ.get("PACS_FAST_VARLEN_BACKEND", "auto")
    if backend != "auto":
        if backend not in BACKENDS:
            raise ValueError(f"PACS_FAST_VARLEN_BACKEND must be auto or one of {BACKENDS}, got {backend!r}")
        return backend
    return next(b for b in BACKENDS if usable(b, q) and (b, q.device.type, q.dtype) not in _FAILED)


def attend(q, k, v, cu: torch.Tensor, max_len: int, scale: float | None = None, *,
           backend: str | None = None, lengths=None) -> torch.Tensor:
    """Causal attention inside each sequence of a packed row: ``q [N, h, d]``, ``k, v [N, h_kv, d]``
    (``h`` a multiple of ``h_kv``), ``cu`` int32 ``[n + 1]`` boundaries on ``q``'s device, ``max_len``
    the longest sequence (a host int: no device sync). Returns ``[N, h, d]``. A backend that fails
    (compile, launch) falls back to the next usable one with one warning line.

    With a varlen kernel (``varlen_attn``, ``flash_attn``) and the sequences' host ``lengths`` (this argument, or
    ``cu``'s :data:`LENGTHS_ATTR` attribute), sequences of at least ``PACS_FAST_VARLEN_LONG`` tokens go through
    SDPA's causal kernel instead, one call per group of equal length (:mod:`pacs_fast.ops.varlen_split`)."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    name = pick_backend(q, backend)
    if name in SPLIT_BACKENDS and not _SPLIT_FAILED:
        lengths = getattr(cu, LENGTHS_ATTR, None) if lengths is None else tuple(int(n) for n in lengths)
        if lengths is not None and sum(lengths) == q.shape[0]:
            from pacs_fast.ops import varlen_split

            split = varlen_split.plan(lengths, varlen_split.long_threshold(), q.device)
            if split is not None:
                try:
                    return _split(q, k, v, scale, split, name)
                except torch.cuda.OutOfMemoryError:
                    raise
                except Exception as e:  # noqa: BLE001 - one warning, then the varlen kernel on every sequence
                    _SPLIT_FAILED.append(e)
                    _warn_once(f"long sequences through SDPA failed ({type(e).__name__}: {str(e)[:160]}); every "
                               f"sequence goes through {name}")
    return _run(q, k, v, cu, max_len, scale, name)


def _split(q, k, v, scale, split, name):
    """:func:`attend` with ``split`` (:class:`pacs_fast.ops.varlen_split.Plan`): each group of long sequences
    through :func:`causal_rows`, the short ones gathered into one sub-row through ``name``."""
    N, h, d = q.shape
    outs = []
    for n, starts, idx in split.long:
        if idx is None:  # one sequence: a view
            s = starts[0]
            qg, kg, vg = (x[s:s + n].transpose(0, 1)[None] for x in (q, k, v))
        else:
            qg, kg, vg = (x.index_select(0, idx).view(len(starts), n, x.shape[1], d).transpose(1, 2)
                          for x in (q, k, v))
        outs.append(causal_rows(qg, kg, vg, scale).reshape(-1, h, d))
        KERNEL_CALLS["sdpa_long"] += 1
    if split.short_index is not None:
        qs, ks, vs = (x.index_select(0, split.short_index) for x in (q, k, v))
        outs.append(_run(qs, ks, vs, split.short_cu, split.short_max, scale, name))
    return q.new_zeros(N, h, d).index_copy(0, split.where, torch.cat(outs))


def _run(q, k, v, cu, max_len, scale, name):
    """Every sequence through ``name``, falling back to the next usable backend (see :func:`attend`)."""
    key = (q.device.type, q.dtype)
    order = [name] + [b for b in BACKENDS[BACKENDS.index(name) + 1:] if usable(b, q) and (b, *key) not in _FAILED]
    for i, b in enumerate(order):
        try:
            out = _KERNELS[b](q, k, v, cu, max_len, scale)
            KERNEL_CALLS[b] += 1
            return out
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - one warning, then the next backend, this one not tried again
            if i == len(order) - 1:
                raise
            _FAILED.add((b, *key))
            _warn_once(f"varlen attention backend {b} failed ({type(e).__name__}: {str(e)[:160]}); using "
                       f"{order[i + 1]}")
    raise AssertionError("unreachable")


# ------------------------------------------------------------------------ the transformers interface
def _base_function(name: str, module):
    from transformers import AttentionInterface

    if name != "eager" and name in AttentionInterface._global_mapping:
        return AttentionInterface._global_mapping[name]
    return sys.modules[type(module).__module__].eager_attention_forward  # the model's own eager attention


def varlen_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                     is_causal=None, *, base: str = "sdpa", cu_seq_lens_q=None, cu_seq_lens_k=None,
                     max_length_q=None, max_length_k=None, sliding_window=None, **kwargs):
    """transformers' attention signature: ``query [1, h, N, d]``, key / value ``[1, h_kv, N, d]``;
    returns ``([1, N, h, d], None)``. Without ``cu_seq_lens_q``, ``base``'s function (see the module)."""
    if cu_seq_lens_q is None:
        if sliding_window is not None:
            kwargs["sliding_window"] = sliding_window
        return _base_function(base, module)(module, query, key, value, attention_mask, dropout=dropout,
                                            scaling=scaling, is_causal=is_causal, **kwargs)
    if query.shape[0] != 1:
        raise ValueError(f"varlen attention takes one packed row, got a batch of {query.shape[0]}")
    max_len = int(max_length_q) if max_length_q is not None else int(cu_seq_lens_q.diff().max())
    # (a window no sequence reaches binds nothing: Phi-3.5/4-mini pass their 262,144 of 131,072 positions)
    if (sliding_window is not None and int(sliding_window) < max_len) or dropout:
        raise ValueError(f"varlen attention has no sliding window ({sliding_window}) or dropout ({dropout}): use "
                         f"learner.packed_attention=dense")
    extra = [k for k in ("softcap", "s_aux", "sinks") if kwargs.get(k) is not None]
    if extra:  # (a family's term attend() would leave out: refused, not dropped)
        raise ValueError(f"varlen attention has no {', '.join(extra)}: use learner.packed_attention=dense")
    if cu_seq_lens_k is not None and cu_seq_lens_k is not cu_seq_lens_q and not torch.equal(cu_seq_lens_k,
                                                                                          cu_seq_lens_q):
        raise ValueError("varlen attention: cu_seq_lens_k must equal cu_seq_lens_q (self-attention)")
    out = attend(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1),
                 cu_seq_lens_q.to(device=query.device, dtype=torch.int32), max_len, scaling,
                 lengths=getattr(cu_seq_lens_q, LENGTHS_ATTR, None))
    return out[None], None


def _mask(*args, base: str, **kwargs):
    """The mask builder of ``base``, or None inside :func:`varlen_forward`."""
    if _ACTIVE.get():
        return None
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    return ALL_MASK_ATTENTION_FUNCTIONS._global_mapping[base](*args, **kwargs)


def register(base: str) -> str:
    """Registers ``"pacs_fast_varlen:<base>"`` (attention and masks) and returns that name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    if base == NAME or base.startswith(NAME + ":"):
        raise ValueError(f"{base} is already varlen")
    if base not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        raise ValueError(f"no mask function for the attention implementation {base!r}")
    name = f"{NAME}:{base}"
    AttentionInterface.register(name, functools.partial(varlen_attention, base=base))
    AttentionMaskInterface.register(name, functools.partial(_mask, base=base))
    return name


def activate(model) -> str | None:
    """Switches ``model`` to the varlen implementation over its current one; returns the base name
    to :func:`restore` (None when it was already switched)."""
    config = model.config
    current = getattr(config, "_attn_implementation", None) or "sdpa"
    if current.startswith(NAME + ":"):
        return None
    config._attn_implementation = register(current)
    return current


def restore(model, base: str) -> None:
    """Back to ``base``, unless someone set another implementation in between."""
    if getattr(model.config, "_attn_implementation", None) == f"{NAME}:{base}":
        model.config._attn_implementation = base


@contextlib.contextmanager
def varlen_forward():
    """Inside: the varlen implementation builds no mask (the packed forward passes ``cu_seq_lens_*``)."""
    token = _ACTIVE.set(True)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
