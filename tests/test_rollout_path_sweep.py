"""From a dataset row to the tensors the learner trains on, on a Qwen2.5-shaped model (sweep of 2026-12-05).

The model: a random Qwen2 architecture over a byte-level BPE tokenizer with Qwen2.5's special tokens and chat
template (``<|im_start|>`` / ``<|im_end|>``; EOS ``<|im_end|>``, pad ``<|endoftext|>``; the generation config's
two EOS ids ``[<|im_end|>, <|endoftext|>]`` and a Qwen folder's sampling defaults, which no engine may apply), an
LM head with padded rows past the tokenizer's ids, and an EOS head row that ends responses at varied lengths.
Everything is checked against a reference written here by hand: the template rendered as a string and encoded
by the ``tokenizers`` backend, greedy decoding and log-probs from full, unpadded forwards, the sampling filters
recomputed per token.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from pacs_fast.data.prompts import INSTRUCTION, encode_prompts, prompt_parts
from pacs_fast.rollout.base import SamplingParams
from pacs_fast.rollout.hf import HFEngine

QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) "
    "or (message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
CORPUS = ["Step 1: add 2 and 3.\n\nStep 2: the sum is 5.\n\nAnswer: \\boxed{5}", "café 日本 ∑ </answer> <answer>",
          "You are a helpful assistant. Please reason step by step, and put your final answer within \\boxed{}.",
          "What is 12+7? Compute the value of x if 3x = 9."] * 10
PROBLEMS = ["1+1?", "What is 12+7? Compute the value of x if 3x = 9. " * 12, "café 日本", "x"]  # 47 .. 259 tokens


@pytest.fixture(scope="module")
def tok():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    fast.chat_template = QWEN25_TEMPLATE
    return fast


def eos_ids(tok):
    return tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")


@pytest.fixture(scope="module")
def model(tok):
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    im_end, eot = eos_ids(tok)
    config = Qwen2Config(vocab_size=len(tok) + 7, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         eos_token_id=im_end, pad_token_id=eot, tie_word_embeddings=False, rope_theta=1e6)
    m = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        m.model.embed_tokens.weight.mul_(20)  # peaked distributions
        h = m.model(input_ids=torch.tensor([tok.encode(" ".join(CORPUS[:4]))])).last_hidden_state[0].mean(0)
        m.lm_head.weight[im_end] = 0.5 * h / h.norm()   # the EOS ids end responses at varied lengths
        m.lm_head.weight[eot] = 0.35 * h / h.norm()
    # a Qwen folder's generation_config.json: two EOS ids, and sampling defaults no engine applies
    m.generation_config = GenerationConfig(eos_token_id=[im_end, eot], pad_token_id=eot, do_sample=True,
                                           temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)
    return m


def forward_logits(model, tok, ids):
    """``[len(ids), V]`` fp64 logits over the tokenizer's ids (padded head rows cut) of one unpadded forward."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, :, :len(tok)].double()


def test_prompt_ids_are_the_template_rendered_once_and_encoded_without_extra_tokens(tok):
    raw = tok.backend_tokenizer
    problems = PROBLEMS + [f"Solve 2x=4. {INSTRUCTION}", "  spaced  \n", "a<|endoftext|>b"]
    for system_prompt, instruction_setting in [("pacs", "pacs"), ("", "pacs"), ("Be brief.", ""), ("", "")]:
        system, instruction = prompt_parts(system_prompt, instruction_setting)
        got = encode_prompts(tok, problems, system=system, instruction=instruction)
        for problem, ids in zip(problems, got):
            user = problem if not instruction or problem.rstrip().endswith(instruction) else f"{problem} {instruction}"
            text = (f"<|im_start|>system\n{system or QWEN_DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\n{user}"
                    f"<|im_end|>\n<|im_start|>assistant\n")
            assert ids == raw.encode(text, add_special_tokens=False).ids, (problem, system_prompt)
            assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 3  # one template, not two


@pytest.mark.parametrize("sampler,merge", [("lean", True), ("lean", False), ("generate", None)])
def test_responses_masks_texts_and_logprobs_against_full_forwards(sampler, merge, tok, model, seed):
    from pacs_fast.config import Config
    from pacs_fast.learner.torch_learner import TorchLearner
    from pacs_fast.trainer.batch import build_batch, engine_logprobs

    V, EOS = len(tok), set(eos_ids(tok))
    engine = HFEngine(model, tok, sampler=sampler, merge_rows=merge, batch_size=6)
    prompts = encode_prompts(tok, PROBLEMS)
    # greedy: the model's own sampling defaults (repetition penalty, top-k) are not applied
    for p, cs in zip(prompts, engine.generate(prompts, SamplingParams(n=2, temperature=0, max_new_tokens=12))):
        want, ids = [], list(p)
        while len(want) < 12 and not (want and want[-1] in EOS):
            want.append(int(forward_logits(model, tok, ids + want)[-1].argmax()))
        assert [c.token_ids for c in cs] == [want, want]
    settings = [(0.7, 0.8, 20, 0.0), (1.3, 1.0, 0, 0.1), (0.6, 0.95, 5, 0.05)]
    T, top_p, top_k, min_p = settings[seed % len(settings)]
    G = 3
    params = SamplingParams(n=G, temperature=T, top_p=top_p, top_k=top_k, min_p=min_p, max_new_tokens=16,
                            seed=seed % 10**6, return_logprobs=True)
    comps = engine.generate(prompts, params)
    rewards = [float(10 * i + j) for i in range(len(prompts)) for j in range(G)]  # each row's own label
    batch = build_batch(prompts, [[c.token_ids for c in cs] for cs in comps], rewards, pad_id=engine.pad_id,
                        logprobs=engine_logprobs(comps))
    cfg = Config()
    learner_logp = {t: TorchLearner(model, algo=cfg.algo, learner=cfg.learner, temperature=t,
                                    vocab_size=V).compute_logprobs(batch) for t in (1.0, T)}
    for i, p in enumerate(prompts):
        for j, c in enumerate(comps[i]):
            r, L = i * G + j, len(p) + len(c.token_ids)
            # the response: nothing after an EOS, the EOS kept and counted; a cut one is max_new_tokens long
            assert all(t not in EOS for t in c.token_ids[:-1])
            stopped = bool(c.token_ids) and c.token_ids[-1] in EOS
            assert c.finish_reason == ("stop" if stopped else "length")
            assert stopped or len(c.token_ids) == params.max_new_tokens
            assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
            # the row: prompt + response, right-padded; the mask on the response tokens (EOS included)
            assert batch.input_ids[r, :L].tolist() == p + c.token_ids
            assert batch.attention_mask[r].nonzero().flatten().tolist() == list(range(L))
            assert batch.response_mask[r].nonzero().flatten().tolist() == list(range(len(p), L))
            assert batch.rewards[r] == 10 * i + j and int(batch.response_mask[r].sum()) == len(c.token_ids)
            # each token within the filters (min-p, top-k, top-p on logits / T, vLLM's order)
            logits = forward_logits(model, tok, p + c.token_ids)[len(p) - 1:-1]
            for k, t in enumerate(c.token_ids):
                s = (logits[k] / T).float()
                probs = s.softmax(-1)
                s = s.masked_fill(probs < min_p * probs.max(), -torch.inf)
                if top_k:
                    s = s.masked_fill(s < s.topk(top_k).values[-1], -torch.inf)
                q, order = s.softmax(-1).sort(descending=True)
                assert t in order[(q.double().cumsum(0) - q.double()) < top_p].tolist(), (r, k)
            # log-probs: the engine's at temperature 1, the learner's at 1 and at T, against log_softmax(logits / T)
            for temp in (1.0, T):
                ref = (logits / temp).log_softmax(-1).gather(1, torch.tensor(c.token_ids)[:, None]).squeeze(1)
                assert torch.allclose(learner_logp[temp][r, len(p):L].double(), ref, atol=1e-5, rtol=0)
                if temp == 1.0:
                    assert torch.allclose(torch.tensor(c.logprobs, dtype=torch.float64), ref, atol=1e-5, rtol=0)
                    assert torch.equal(batch.behaviour_logp[r, len(p):L], torch.tensor(c.logprobs))
    # a prompt's samples do not depend on the prompts beside it (its seed is seed + i * n + j)
    alone = engine.generate([prompts[2]], dataclasses.replace(params, seed=params.seed + 2 * G))[0]
    assert [c.token_ids for c in alone] == [c.token_ids for c in comps[2]]
    assert batch.behaviour_logp[batch.response_mask == 0].abs().max() == 0


@pytest.mark.parametrize("sampler,merge", [("lean", True), ("generate", None)])
def test_stop_strings_and_the_context_cut_on_byte_level_text(sampler, merge, tok, model):
    EOS = set(eos_ids(tok))
    prompts = encode_prompts(tok, PROBLEMS)
    engine = HFEngine(model, tok, sampler=sampler, merge_rows=merge, batch_size=6)
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=20, seed=5, return_logprobs=True)
    plain = engine.generate(prompts, params)

    def emitted(ids):  # vLLM's detokenizer: an incomplete character at the end is held back
        for k in range(len(ids), -1, -1):
            text = tok.decode(ids[:k], skip_special_tokens=True)
            if not text.endswith("\ufffd"):
                return text
        return ""

    stop = ("é", "\n\n", " th", "日")
    got = engine.generate(prompts, dataclasses.replace(params, stop=stop))
    fired = 0
    for cs, ps in zip(got, plain):
        for c, p in zip(cs, ps):
            cut = None
            for k in range(1, len(p.token_ids) + 1):
                text = emitted(p.token_ids[:k])
                ends = [text.find(s) + len(s) for s in stop if s in text]
                if ends:
                    cut = (k, text[:min(ends)])
                    break
            if cut is None or (p.finish_reason == "stop" and cut[0] == len(p.token_ids)):
                assert (c.token_ids, c.text, c.finish_reason) == (p.token_ids, p.text, p.finish_reason)
            else:  # the tokens up to the one completing the string, the text just after it, the mask alike
                assert (c.token_ids, c.text, c.finish_reason) == (p.token_ids[:cut[0]], cut[1], "stop")
                fired += 1
                assert tok.decode(c.token_ids, skip_special_tokens=True).startswith(c.text)
            assert len(c.logprobs) == len(c.token_ids)
    assert fired
    # a context of 100 tokens: each response is the unlimited one's first (context - prompt) tokens at most
    short = [p for p in prompts if len(p) < 90]
    limited = HFEngine(model, tok, sampler=sampler, merge_rows=merge, max_model_len=100).generate(short, params)
    free = engine.generate(short, params)
    for p, cs, fs in zip(short, limited, free):
        for c, f in zip(cs, fs):
            assert c.token_ids == f.token_ids[:100 - len(p)]
            assert c.finish_reason == ("stop" if c.token_ids[-1] in EOS else "length")
