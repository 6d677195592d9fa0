"""Responses of the reasoning families whose thinking has marks of its own, scored (hostile sweep of 2026-12-07).

``reward.extraction=boxed`` (and ``answer_tag``) reads a response's answer after its thinking (boxes inside it are
drafts) and nothing of a response cut inside its thinking (pacs_fast/reward/boxes.py ``answer_part``). It knew
``<think>`` and Magistral's ``[THINK]``; the families vLLM's reasoning parsers read with other marks were plain text
to it: Seed-OSS (``<seed:think>`` ... ``</seed:think>``), Command A Reasoning (``<|START_THINKING|>`` ...
``<|END_THINKING|>``), MiniMax-M3 (``<mm:think>``) and Gemma 4 (its thought channel, ``<|channel>thought\\n`` ...
``<channel|>``). Their marks are special tokens of their tokenizers, which the engines' texts (decoded without
special tokens) had dropped as well.

Found and fixed (each test failed before the fix, checked by restoring the previous files): a response cut inside
its thinking (``finish_reason`` length) whose draft box held the right answer was paid 1, the reward of a finished
right answer, in training (the PACS label) and in eval (pass@k); now it states no answer (0), as a ``<think>`` one
does. The marks are read as ``<think>`` / ``</think>`` (boxes.py ``THINK_MARKS``) and kept in the texts
(pacs_fast/rollout/base.py ``KEPT_SPECIAL``); a prompt that opens one (``opens_think``) reads its responses inside it.

The Seed-OSS folder: transformers' ``SeedOssConfig`` keys (Seed-OSS-36B's, whose attention and residual dropout 0.1
are set to 0 here: the learner would apply them) at tiny widths; a byte-level BPE whose first tokens are Seed's
special ones (``<seed:bos>`` 0, ``<seed:pad>`` 1, ``<seed:eos>`` 2, then the thinking marks: their ids here are
illustrative) and the hub template's turns (``<seed:bos>{role}\\n...<seed:eos>``, the generation prompt
``<seed:bos>assistant\\n``; its thinking-budget branches left out).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from byte_level_bpe import padded_byte_level_bpe
from test_gemma4_path_sweep import forced_run

MAX_NEW = 16
# family -> its thinking marks (the start's and the end's special tokens)
MARKS = {"seed_oss": ("<seed:think>", "</seed:think>"), "command_a": ("<|START_THINKING|>", "<|END_THINKING|>"),
         "minimax_m3": ("<mm:think>", "</mm:think>"), "gemma4": ("<|channel>", "<channel|>"),
         "magistral": ("[THINK]", "[/THINK]")}
SEED = ["<seed:bos>", "<seed:pad>", "<seed:eos>"]
LEADING = tuple(SEED + [m for pair in MARKS.values() for m in pair])  # (special tokens at ids 0..12)
CORPUS = ["What is 12 plus 7? So \\boxed{19} draft maybe thought\n", "Please reason step by step, and put your final "
          "answer within \\boxed{}. You are a helpful assistant."] * 10
SPLIT = r"\p{L}+|\p{N}|[^\s\p{L}\p{N}]+|\s+"
TEMPLATE = ("{%- for m in messages %}{{- '<seed:bos>' + m.role + '\\n' + m.content + '<seed:eos>' }}{%- endfor %}"
            "{%- if add_generation_prompt %}{{- '<seed:bos>assistant\\n' }}{%- endif %}")


def marks_tokenizer(folder: Path):
    """tokenizer.json (:data:`LEADING` special at ids 0.., then the BPE) and Seed-OSS's tokenizer_config.json in
    ``folder``; the ``tokenizers`` object."""
    from tokenizers import AddedToken

    raw = padded_byte_level_bpe([SPLIT], CORPUS, 0, leading=LEADING)
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in LEADING])
    folder.mkdir(parents=True, exist_ok=True)
    raw.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<seed:bos>", "eos_token": "<seed:eos>", "pad_token": "<seed:pad>", "chat_template": TEMPLATE,
         "clean_up_tokenization_spaces": False, "model_max_length": 524288,
         "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2))
    return raw


@pytest.mark.parametrize("family", sorted(MARKS))
def test_a_response_cut_inside_its_thinking_states_no_answer(family, tmp_path):
    """Found and fixed: each family's marks, special tokens, stay in the decoded text, and ``boxed`` reads the answer
    after the thinking: a response cut inside it (a right draft box) has none, a finished one reads its final box
    (a wrong draft before it, or a right draft before a wrong final), a prompt that opens the thinking reads its
    responses inside it."""
    from transformers import AutoTokenizer

    from pacs_fast.reward.answers import extract_answer
    from pacs_fast.reward.boxes import opens_think, with_prompt_think
    from pacs_fast.rollout.base import decode_texts

    marks_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    start, end = MARKS[family]
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    assert tok.convert_tokens_to_ids(start) in enc(start + "x")  # (a special token: a plain decode drops it)
    assert tok.decode(enc(start), skip_special_tokens=True) == ""
    cases = {start + "thought\ndraft \\boxed{19} maybe": None,  # (cut inside the thinking)
             start + "thought\ndraft \\boxed{18}" + end + "So \\boxed{19}": "19",
             start + "thought\ndraft \\boxed{19}" + end + "So \\boxed{18}": "18"}
    texts = decode_texts(tok, [enc(t) + [tok.eos_token_id] for t in cases])
    assert texts == list(cases)  # (the marks kept, the EOS dropped)
    assert [extract_answer(t, "boxed") for t in texts] == list(cases.values())
    prompt = "<seed:bos>assistant\n" + start
    assert opens_think(prompt) and not opens_think(prompt + "x" + end)
    inside = with_prompt_think(["draft \\boxed{19}", "x" + end + "So \\boxed{19}"], opens_think(prompt), "boxed")
    assert [extract_answer(t, "boxed") for t in inside] == [None, "19"]


def seed_oss_folder(folder: Path) -> Path:
    """A Seed-OSS-shaped folder (module docstring): the <seed:eos> head row reads one hidden unit."""
    from transformers import SeedOssConfig, SeedOssForCausalLM

    raw = marks_tokenizer(folder)
    config = {"architectures": ["SeedOssForCausalLM"], "model_type": "seed_oss", "attention_bias": True,
              "attention_dropout": 0.0, "attention_out_bias": False, "residual_dropout": 0.0, "bos_token_id": 0,
              "pad_token_id": 1, "eos_token_id": 2, "head_dim": 32, "hidden_act": "silu", "hidden_size": 64,
              "intermediate_size": 96, "max_position_embeddings": 524288, "mlp_bias": False,
              "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
              "rope_theta": 10000000.0, "tie_word_embeddings": False, "torch_dtype": "float32",
              "vocab_size": raw.get_vocab_size()}
    torch.manual_seed(0)
    model = SeedOssForCausalLM(SeedOssConfig(**{k: v for k, v in config.items()
                                               if k not in ("architectures", "model_type", "torch_dtype")}))
    with torch.no_grad():
        model.lm_head.weight[2] = 0.0
        model.lm_head.weight[2, 0] = 4.0
    model.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "pad_token_id": 1,
                                                               "eos_token_id": 2}))
    return folder


def test_a_seed_oss_run_pays_no_draft_of_a_response_cut_inside_its_thinking(tmp_path):
    """Found and fixed: ``python -m pacs_fast.train`` (HF engine) on the Seed-OSS folder, samples 0-2 of each
    prompt forced: 0 thinks with the right answer in a draft box and is cut at the token limit inside its
    ``<seed:think>``, 1 closes its thinking and boxes the right answer, 2 closes it and boxes a wrong one. Sample 0
    was paid 1 as sample 1 (its marks dropped from the text, or read as plain text); now 0, its text keeps the mark,
    and the held-out evaluation reads the same way."""
    folder = seed_oss_folder(tmp_path / "Seed-OSS-tiny")

    def forced(enc, gold):
        return [enc("<seed:think>draft \\boxed{%d} maybe maybe maybe maybe maybe maybe maybe" % gold),
                enc("<seed:think>add</seed:think>So \\boxed{%d}" % gold) + [2],
                enc("<seed:think>add</seed:think>So \\boxed{%d}" % (gold + 1)) + [2]]

    run_dir, output = forced_run(folder, tmp_path, "", "<seed:eos>", max_new=MAX_NEW, samples=forced)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples, output[-3000:]
    by_row = {}
    for s in samples:
        by_row.setdefault((s["step"], s["prompt"]), []).append(s)
    for rows in by_row.values():
        cut, right, wrong = sorted(rows, key=lambda s: s["row"])[:3]
        assert cut["finish_reason"] == "length" and cut["response"].startswith("<seed:think>draft \\boxed{")
        assert (cut["reward"], right["reward"], wrong["reward"]) == (0.0, 1.0, 0.0), rows
        assert right["response"].startswith("<seed:think>add</seed:think>So")
