"""Core attention for megatron's local layer spec that also takes packed (THD) rows.

megatron-core's local spec uses ``DotProductAttention``, which materialises ``[b, heads, S, S]``
scores and refuses ``packed_seq_params``. :func:`core_attention_class` returns its subclass
``PackedDotProductAttention`` (built on first use: megatron is imported lazily). Given a mask (the dense
block-diagonal mask of ``learner.packed_attention=dense``) it *is* ``DotProductAttention``. Without a mask or
``packed_seq_params`` (padded rows, their padding only at the end) it runs causal attention through
:func:`pacs_fast.ops.varlen_attention.causal_rows` (SDPA's causal kernel, flash on a GPU; two matmuls for short
rows on the CPU), no ``[S, S]`` mask or scores, except where that would not be the layer's attention (the
conditions refused on the THD path below): then megatron's own with the causal mask. With
``packed_seq_params.qkv_format == "thd"`` it gets
``query [t, heads, d]`` and ``key / value [t, kv heads, d]`` (this rank's heads: tensor parallelism
splits heads, never tokens), all sequences end to end with boundaries ``cu_seqlens_q`` (int32
``[n + 1]``), and runs causal attention inside each sequence through
:func:`pacs_fast.ops.varlen_attention.attend`: torch's ``varlen_attn`` or flash-attn's varlen kernel
on a CUDA GPU (bf16 / fp16), a compiled ``flex_attention`` document mask, else one causal SDPA per
group of equal-length sequences (the CPU path, what CI proves exact). None of them builds ``[t, t]``
or computes a block across a boundary. Grouped-query heads are not repeated by hand (the kernels
take them, or SDPA's ``enable_gqa``).

RoPE is megatron's, before this module: with THD ``packed_seq_params`` ``GPTModel`` builds the
frequencies for ``max_seqlen_q`` positions and ``apply_rotary_pos_emb`` restarts them at 0 in each
sequence of ``cu_seqlens`` (see :func:`thd_params` for where it reads them).

Refused (ValueError) on the THD path, where the dense path would differ: attention dropout while
training, sliding-window layers, a softmax offset (``softmax_type`` other than vanilla), an
attention bias, a non-causal mask type, key boundaries other than the query's. Sequences lie end to
end: ``cu_seqlens_*_padded``, where set, must equal the unpadded boundaries (:func:`thd_params` sets
them so); megatron's RoPE reads those, this module the unpadded ones.
"""
from __future__ import annotations

import functools

import torch


def thd_params(cu_seqlens: torch.Tensor, max_seqlen: int, device):
    """megatron ``PackedSeqParams`` (``qkv_format="thd"``) for sequences laid end to end in one row
    with boundaries ``cu_seqlens`` (int32 ``[n + 1]``, on the host) and longest ``max_seqlen``.

    ``cu_seqlens_q/kv`` go to ``device`` (the attention kernels read them there). The ``*_padded``
    boundaries equal them (there is no padding between sequences) but stay on the host: megatron's
    unfused THD RoPE reads the padded ones when they are set and splits the tokens by sequence with
    host ints (``.tolist()`` / ``.item()``), which on a device copy would cost a sync in every layer.
    """
    from megatron.core.packed_seq_params import PackedSeqParams

    from pacs_fast.ops.varlen_attention import LENGTHS_ATTR

    host = cu_seqlens.to(device="cpu", dtype=torch.int32)
    cuda = torch.device(device).type == "cuda"
    dev = host.pin_memory().to(device, non_blocking=True) if cuda else host.to(device)  # no wait for the stream
    setattr(dev, LENGTHS_ATTR, tuple(host.diff().tolist()))  # the host lengths, once a forward (attend splits)
    m = int(max_seqlen)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=dev, cu_seqlens_kv=dev, cu_seqlens_q_padded=host,
                           cu_seqlens_kv_padded=host, max_seqlen_q=m, max_seqlen_kv=m)


@functools.lru_cache(maxsize=None)
def core_attention_class():
    """``PackedDotProductAttention``: megatron's ``DotProductAttention`` plus the THD path (see the module)."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.utils import is_layer_window_attention

    class PackedDotProductAttention(DotProductAttention):
        """megatron's ``DotProductAttention``; with THD ``packed_seq_params``, causal attention inside
        each sequence through a varlen kernel (:mod:`pacs_fast.learner.megatron.core_attention`)."""

        def __init__(self, config, layer_number, attn_mask_type, attention_type, **kwargs):
            super().__init__(config, layer_number, attn_mask_type, attention_type, **kwargs)
            self.window = is_layer_window_attention(config.window_size, config.window_attn_skip_freq, layer_number)
            # DotProductAttention divides its scale by layer_number under apply_query_key_layer_scaling
            # and its softmax multiplies the scores back: the scale the scores really get
            self.thd_scale = self.softmax_scale * (self.layer_number if config.apply_query_key_layer_scaling else 1)

        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None):
            if packed_seq_params is None:
                if attention_mask is None:  # padded rows, padding only at their end (forward.py)
                    return self._causal(query, key, value, attn_mask_type, attention_bias)
                return super().forward(query, key, value, attention_mask, attn_mask_type=attn_mask_type,
                                       attention_bias=attention_bias)
            why = self._why_not_kernel(attn_mask_type, attention_bias)
            if packed_seq_params.qkv_format != "thd":
                why = f"qkv_format={packed_seq_params.qkv_format!r} (only 'thd')"
            elif packed_seq_params.cu_seqlens_kv is not None and packed_seq_params.cu_seqlens_kv is not \
                    packed_seq_params.cu_seqlens_q and not torch.equal(packed_seq_params.cu_seqlens_kv,
                                                                     packed_seq_params.cu_seqlens_q):
                why = "cu_seqlens_kv differs from cu_seqlens_q (self-attention only)"
            if why is not None:
                raise ValueError(f"packed (THD) attention does not support {why}: use learner.packed_attention=dense")
            from pacs_fast.ops.varlen_attention import attend

            out = attend(query, key, value, packed_seq_params.cu_seqlens_q, int(packed_seq_params.max_seqlen_q),
                         self.thd_scale)  # (the host lengths ride on cu_seqlens_q: thd_params)
            return out.reshape(out.shape[0], -1)  # [t, heads * d]: megatron reshapes to [t, 1, h]

        def _causal(self, query, key, value, attn_mask_type, attention_bias):
            """Causal attention over whole rows ``[S, b, heads, d]`` through a causal kernel
            (:func:`~pacs_fast.ops.varlen_attention.causal_rows`: SDPA's flash kernel on a GPU, no ``[S, S]`` mask
            or scores); where that would not be this layer's attention, the causal mask through megatron's own."""
            S = query.shape[0]
            if self._why_not_kernel(attn_mask_type, attention_bias) is not None:
                blocked = torch.ones(S, S, dtype=torch.bool, device=query.device).triu(1).view(1, 1, S, S)
                return super().forward(query, key, value, blocked, attn_mask_type=attn_mask_type,
                                       attention_bias=attention_bias)
            from pacs_fast.ops.varlen_attention import causal_rows

            q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))  # [b, heads, S, d]
            out = causal_rows(q, k, v, self.thd_scale)  # [b, S, heads, d]
            return out.transpose(0, 1).reshape(S, query.shape[1], -1)  # [S, b, heads * d], as megatron's

        def _why_not_kernel(self, attn_mask_type, attention_bias) -> str | None:
            """Why a causal kernel without a mask would not be this layer's attention (None: it is)."""
            mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
            if attention_bias is not None:
                return "an attention bias"
            if mask_type not in (AttnMaskType.causal, AttnMaskType.padding_causal):
                return f"attn_mask_type={mask_type} (causal only)"
            if self.window:
                return f"sliding-window attention (window_size={self.config.window_size})"
            if self.softmax_offset is not None:
                return f"softmax_type={self.config.softmax_type!r}"
            if self.training and self.attention_dropout.p > 0:
                return f"attention dropout {self.attention_dropout.p}"
            return None

    return PackedDotProductAttention
