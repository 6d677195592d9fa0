"""The built-in model's character tokenizer (pacs_fast/data/tiny.py): one token per character, the same ids in
memory and reloaded from the model folder by every loader a user meets. transformers >= 5 loads the tokenizer of
every ``qwen2`` folder as ``Qwen2Tokenizer`` (a byte-level BPE rebuilt from the saved vocabulary): the earlier
word-level vocabulary reloaded without spaces and newlines, so every default run trained on prompts without them,
and its ``Split(Regex("."))`` had encoded each newline as ``<pad>`` even in memory."""
import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from pacs_fast.data.prompts import build_prompt
from pacs_fast.data.tiny import BOS, CHARACTERS, EOS, PAD, build_char_tokenizer, make_tiny_model

TEXTS = ["a b\n\nc = 12", "  two  spaces,\nthen ~!@#$%^&*()_+{}|:\"<>?`-=[]\\;',./ end\n", "<s>x</s><pad>"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=32, num_layers=1, num_heads=1,
                           num_kv_heads=1, intermediate_size=32)


def loaders(folder):
    return {"memory": build_char_tokenizer(), "AutoTokenizer": AutoTokenizer.from_pretrained(folder),
            "PreTrainedTokenizerFast": PreTrainedTokenizerFast.from_pretrained(folder)}


def test_one_token_per_character_in_order():
    tok = build_char_tokenizer()
    text = "".join(CHARACTERS)
    assert tok(text, add_special_tokens=False).input_ids == list(range(3, 3 + len(CHARACTERS)))
    assert [tok.pad_token, tok.bos_token, tok.eos_token] == [PAD, BOS, EOS]
    assert tok.convert_tokens_to_ids([PAD, BOS, EOS]) == [0, 1, 2]


def test_every_loader_encodes_and_decodes_alike(folder):
    toks = loaders(folder)
    for text in TEXTS + [build_prompt(toks["memory"], "What is 12 + 34?")]:
        ids = {name: t(text, add_special_tokens=False).input_ids for name, t in toks.items()}
        assert len(set(map(tuple, ids.values()))) == 1, (text, ids)
        plain = text.replace(PAD, "").replace(BOS, "").replace(EOS, "")
        n_special = sum(text.count(s) for s in (PAD, BOS, EOS))
        assert len(ids["memory"]) == len(plain) + n_special, text  # one token per character, one per special
        for name, t in toks.items():
            assert t.decode(ids[name]) == text, name
    for t in toks.values():
        assert (t.pad_token_id, t.bos_token_id, t.eos_token_id) == (0, 1, 2)


def test_characters_outside_the_set_are_dropped_alike(folder):
    for name, t in loaders(folder).items():
        assert t.decode(t("caf\u00e9\t\r!", add_special_tokens=False).input_ids) == "caf!", name
