"""A hub-sized byte-level BPE tokenizer for the sweeps' model folders, built in a second: the hub's pre-tokenizer
splits, merges trained on a small corpus, unreachable filler tokens up to the id where the hub's added tokens begin
(their ids, and the head's rows, as the hub's)."""
from __future__ import annotations

import json


def padded_byte_level_bpe(splits: list[str], corpus: list[str], first_added: int, vocab_size: int = 400,
                          leading: tuple[str, ...] = ()):
    """A ``tokenizers.Tokenizer``: each regex of ``splits`` isolated in turn, then byte-level; ``leading`` tokens at
    ids 0.. (a family whose special tokens come first: the caller makes them special), BPE merges trained on
    ``corpus`` (``vocab_size`` tokens) after them, then fillers ``zq000400``.. up to id ``first_added`` (the caller
    adds its added tokens from there); a byte-level decoder. No post-processor (the caller's BOS, if any)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    def pre():
        return pre_tokenizers.Sequence([*(pre_tokenizers.Split(Regex(s), behavior="isolated") for s in splits),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])

    small = Tokenizer(models.BPE())
    small.pre_tokenizer = pre()
    small.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[],
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model = json.loads(small.to_str())["model"]
    vocab = {t: i for i, t in enumerate(leading)}
    vocab.update({t: i + len(leading) for t, i in model["vocab"].items()})
    vocab.update({f"zq{i:06d}": i for i in range(len(vocab), first_added)})
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in model["merges"]]))
    raw.pre_tokenizer, raw.decoder = pre(), decoders.ByteLevel()
    return raw
