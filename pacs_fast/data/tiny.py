"""A tiny Qwen2-architecture model and a character-level tokenizer, made locally (no hub).

Used by the built-in task of ``python -m pacs_fast.train`` and by the tests of every layer that
needs a real Hugging Face causal LM (rollout engines, the Megatron learner, evaluation).

The attention head size is 32, which vLLM's CPU attention kernels support (16 is not).
"""
from __future__ import annotations

import string
from pathlib import Path

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
SPECIAL_TOKENS = [PAD, BOS, EOS]
# Printable ASCII without the form feed / vertical tab oddities, plus newline.
CHARACTERS = [c for c in string.printable if c not in "\x0b\x0c\r\t"]


def _byte_level(c: str) -> str:
    """GPT-2's byte-to-unicode symbol of an ASCII character (what byte-level BPE vocabularies hold): printable
    ``!``..``~`` stand for themselves, the bytes below them for ``chr(256 + byte)`` (space ``Ġ``, newline ``Ċ``)."""
    return c if "!" <= c <= "~" else chr(256 + ord(c))


def build_char_tokenizer():
    """Character-level tokenizer: one token per character, a byte-level BPE with no merges.

    ids: 0 ``<pad>``, 1 ``<s>``, 2 ``</s>``, then the printable ASCII characters and newline (``CHARACTERS``,
    in that order). A character outside that set is dropped. No chat template is set: prompts use the
    documented plain format of ``pacs_fast.data``.

    Byte-level BPE (Qwen2's kind) because transformers >= 5 loads the tokenizer of every ``qwen2`` model folder
    as ``Qwen2Tokenizer``, which rebuilds a byte-level BPE from the saved vocabulary and ignores the saved
    pre-tokenizer: the earlier word-level vocabulary of plain characters reloaded without spaces and newlines
    (``"a b"`` -> ``ab``), and its ``Split(Regex("."))`` had never matched a newline (``"\\n"`` -> ``<pad>``).
    This one encodes the same in memory, reloaded as ``Qwen2Tokenizer`` and as ``PreTrainedTokenizerFast``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + [_byte_level(c) for c in CHARACTERS])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=PAD,
        padding_side="left", model_max_length=4096,
    )


def tiny_qwen2_config(vocab_size: int, *, hidden_size: int = 128, num_layers: int = 2,
                      num_heads: int = 4, num_kv_heads: int = 2, intermediate_size: int = 384,
                      max_positions: int = 512, tie_word_embeddings: bool = True):
    """A ``Qwen2Config`` for a tiny model (head size ``hidden_size // num_heads``, default 32)."""
    from transformers import Qwen2Config

    if hidden_size % num_heads:
        raise ValueError(f"hidden_size={hidden_size} is not divisible by num_heads={num_heads}")
    return Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions, rope_theta=10000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=tie_word_embeddings, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        attention_dropout=0.0, torch_dtype="float32",
    )


def make_tiny_model(path: str | Path, *, seed: int = 0, **config_kwargs) -> Path:
    """Create a randomly initialised tiny Qwen2 model + char tokenizer saved in HF format at ``path``.

    Returns the path. The folder loads with ``AutoModelForCausalLM.from_pretrained`` /
    ``AutoTokenizer.from_pretrained`` (and with vLLM).
    """
    import torch
    from transformers import Qwen2ForCausalLM

    from pacs_fast.files import default_mode

    path = Path(path)
    tokenizer = build_char_tokenizer()
    # Round the vocabulary up to a multiple of 64 (as real models pad it) so TP sharding divides it.
    vocab_size = -(-len(tokenizer) // 64) * 64
    config = tiny_qwen2_config(vocab_size, **config_kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    path.mkdir(parents=True, exist_ok=True)
    save_model_here(model, path)
    for f in path.glob("*.safetensors"):  # (written 0600: readable as the folder's other files)
        default_mode(f)
    tokenizer.save_pretrained(path)
    return path


def save_model_here(model, path: str | Path) -> None:
    """``model.save_pretrained(path)`` (safetensors) written by this process whatever its torch.distributed rank.

    transformers 5 writes nothing (no config, no weights, no error) on a process whose global rank is not 0
    (``should_save_on_this_rank``). The warm-up is built by the first process of each node: on a second node that
    process has rank 1 or more, and its folder held only the tokenizer (a 2-node launch with an empty warm-up
    cache failed there). ``model``: a ``PreTrainedModel``, not sharded over processes."""
    if hasattr(model, "should_save_on_this_rank"):  # (an instance attribute, removed again: the class is untouched)
        model.should_save_on_this_rank = lambda is_main_process: is_main_process
    try:
        model.save_pretrained(path, safe_serialization=True)
    finally:
        model.__dict__.pop("should_save_on_this_rank", None)
