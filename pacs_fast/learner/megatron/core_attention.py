"""Core attention for megatron's local layer spec that also takes packed (THD) rows.

megatron-core's local spec uses ``DotProductAttention``, which materialises ``[b, heads, S, S]``
scores and refuses ``packed_seq_params``. :func:`core_attention_class` returns its subclass
``PackedDotProductAttention`` (built on first use: megatron is imported lazily): without
``packed_seq_params`` it *is* ``DotProductAttention`` (padded rows, and the dense block-diagonal
mask of ``learner.packed_attention=dense``); with ``packed_seq_params.qkv_format == "thd"`` it gets
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

    host = cu_seqlens.to(device="cpu", dtype=torch.int32)
    cuda = torch.device(device).type == "cuda"
    dev = host.pin_memory().to(device, non_blocking=True) if cuda else host.to(device)  # no wait for the stream
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
                return super().forward(query, key, value, attention_mask, attn_mask_type=attn_mask_type,
                                       attention_bias=attention_bias)
            self._check_thd(packed_seq_params, attn_mask_type, attention_bias)
            from pacs_fast.ops.varlen_attention import attend

            out = attend(query, key, value, packed_seq_params.cu_seqlens_q, int(packed_seq_params.max_seqlen_q),
                         self.thd_scale)
            return out.reshape(out.shape[0], -1)  # [t, heads * d]: megatron reshapes to [t, 1, h]

        def _check_thd(self, p, attn_mask_type, attention_bias) -> None:
            why = None
            mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
            if p.qkv_format != "thd":
                why = f"qkv_format={p.qkv_format!r} (only 'thd')"
            elif p.cu_seqlens_kv is not None and p.cu_seqlens_kv is not p.cu_seqlens_q and not torch.equal(
                    p.cu_seqlens_kv, p.cu_seqlens_q):
                why = "cu_seqlens_kv differs from cu_seqlens_q (self-attention only)"
            elif attention_bias is not None:
                why = "an attention bias"
            elif mask_type not in (AttnMaskType.causal, AttnMaskType.padding_causal):
                why = f"attn_mask_type={mask_type} (causal only)"
            elif self.window:
                why = f"sliding-window attention (window_size={self.config.window_size})"
            elif self.softmax_offset is not None:
                why = f"softmax_type={self.config.softmax_type!r}"
            elif self.training and self.attention_dropout.p > 0:
                why = f"attention dropout {self.attention_dropout.p}"
            if why is not None:
                raise ValueError(f"packed (THD) attention does not support {why}: use learner.packed_attention=dense")

    return PackedDotProductAttention
