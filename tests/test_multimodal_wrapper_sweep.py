"""LoRA on Gemma 3's multimodal wrapper, and a Mistral 3 (LLaVA-style) wrapper end to end (sweep of 2026-12-07).

After tests/test_gemma3_olmo2_path_sweep.py (whose Gemma-3-4b-it-shaped folder builders this file reuses), two paths
users bring that it left untried:

**LoRA on Gemma3ForConditionalGeneration** (``model.lora_rank=4``, ``model.lora_target_modules`` at its default,
``all-linear``). Works: the run trains the language model's linear layers through the adapters and writes the merged
weights under the hub's names (``language_model.model.*``), everything else (embeddings, norms, the SigLIP tower,
the projector) byte for byte; the ``adapter/`` folder loads on the base folder (``PeftModel.from_pretrained`` and
``AutoPeftModelForCausalLM``) and gives the merged checkpoint's logits; ``--resume`` from step 2 gives the
uninterrupted run's step 3 bit for bit (the merge check compares the renamed tensors: a changed one is refused); no
gradient reaches anything outside the language model. Found and fixed (each test failed before its fix):
- PEFT's ``all-linear`` (and any name list: SigLIP's and Pixtral's layers are also ``q_proj`` / ``v_proj`` ...) puts
  adapters on the vision tower (and on Mistral 3's projector), which a text-only forward never reaches: the run's
  line says 9,984 trainable parameters where the language model's adapters hold 8,192 (18% dead weight here; at
  full size the masters, the memory check and ``adapter/`` carry them too): now the language model's alone
  (pacs_fast/learner/lora.py ``outside_language_model``, PEFT's ``exclude_modules``);
- the LoRA branch of ``load_hf_weights`` on a renamed checkpoint (the wrapper's hub names) opens every tensor into a
  dict before the merge check, which then reads each while the dict keeps them all: the whole file resident, as
  ``load_file`` was, where the rest of ``--resume`` holds one tensor at a time (``LazyHFCheckpoint``): now renamed
  lazily too.

Each passing check was seen to fail under the fault it guards against (injected for the trial, then removed).

**Mistral3ForConditionalGeneration** (Mistral-Small-3.1-24B-Instruct's shape: ``model_type`` mistral3, a mistral
``text_config`` with an untied head, a pixtral ``vision_config``, the hub's tensor names ``language_model.model.*``,
``language_model.lm_head.weight``, ``vision_tower.*``, ``multi_modal_projector.*``; transformers 5 builds it on the CPU
in well under a second). Found and fixed:
- ``python -m pacs_fast.train`` could not load it at all: transformers 5 maps ``mistral3`` (and ``llava``) under
  ``AutoModelForImageTextToText`` only, not ``AutoModelForCausalLM`` (``gemma3`` is under both), which the learner,
  the HF engine and the preflight use; README lists these wrappers as trained: now ``causal_lm.auto_model_class``;
- once loaded, the run trains (the learner's
  padded, packed and shared-prefix log-probs and the engine's are the wrapper's own; the tower and projector stay
  byte for byte), but transformers 5's ``Mistral3Config`` defaults ``tie_word_embeddings`` to True (the hub's
  config.json has no such key; ``from_pretrained`` unties the head the file holds) and the learner reads that flag,
  not the model: every export leaves out the trained LM head. The checkpoint lacks ``language_model.lm_head.weight``
  (transformers then ties the head to the embedding: another model), ``--resume`` finds no usable checkpoint, and an
  HF engine with its own copy (megatron, another ``rollout.dtype``) never gets the head: the learner now reads
  the model's own tying (its head's storage against its embedding's).
``learner.backend=megatron`` is one line before any model loads.
"""
from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
import torch

from pacs_fast.data.prompts import INSTRUCTION, SYSTEM_PROMPT
from test_gemma3_olmo2_path_sweep import (TRAIN, _problem, forcer, gemma3_folder, learner_gap, own_logprobs,
                                          run_logprob_gaps)
from test_hostile_inputs import cli
from test_llama3_path_sweep import _data, check_batch, check_completion, recording

RANK = 4
LORA = [f"model.lora_rank={RANK}", "learner.lr=0.01"]  # (a rate at which 2 steps move the logits well past 1e-5)
THREE = ["train.steps=3"]  # checkpoints at steps 2 (save_every) and 3 (the last): a resume from 2 redoes 3


def _quiet_main(args, force=None):
    """``python -m pacs_fast.train args`` in this process: ``(exit code, output, engine calls, learner batches)``."""
    from pacs_fast.train import main

    text, code = io.StringIO(), 0
    with recording(force) as (calls, batches), contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        try:
            main(args)
        except SystemExit as e:
            code = e.code
    return code, text.getvalue(), calls, batches


def _resume_from_step_2(run: Path, dest: Path, force):
    """A copy of ``run`` cut back to its step-2 checkpoint (as if killed before step 3), resumed: ``(code, output)``.
    The copy's ``step_000003`` is then comparable with ``run``'s."""
    shutil.copytree(run, dest)
    shutil.rmtree(dest / "checkpoints" / "step_000003")
    (dest / "checkpoints" / "latest").write_text("step_000002\n")
    code, output, _, _ = _quiet_main(["--resume", str(dest)], force)
    return code, output


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def _lm_adapter_count(model, rank: int) -> int:
    """The trainable parameters of rank-``rank`` adapters on every linear layer of the wrapper's language model
    (``model.language_model.*``; the LM head is outside it), counted from the layers' widths."""
    return sum(rank * (m.in_features + m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and n.startswith("model.language_model."))


# =========================================================================================== Gemma 3 + LoRA

@pytest.fixture(scope="module")
def g3(tmp_path_factory):
    from transformers import AutoTokenizer

    folder = gemma3_folder(tmp_path_factory.mktemp("g3") / "gemma-3-it")
    return folder, AutoTokenizer.from_pretrained(folder)


@contextlib.contextmanager
def gradient_record():
    """Records, over the first learner update inside the block, which of the model's parameters a gradient reached
    (hooks) and which changed: ``{"trainable", "grad", "changed"}`` (state-dict names)."""
    from pacs_fast.learner.torch_learner import TorchLearner

    seen: dict[str, set] = {}
    update = TorchLearner.update

    def recorded(self, batch, **kw):
        if seen:
            return update(self, batch, **kw)
        params = dict(self.model.named_parameters())
        before = {n: p.detach().clone() for n, p in params.items()}
        seen.update(trainable={n for n, p in params.items() if p.requires_grad}, grad=set())
        hooks = [p.register_hook(lambda g, n=n: seen["grad"].add(n)) for n, p in params.items() if p.requires_grad]
        try:
            return update(self, batch, **kw)
        finally:
            for h in hooks:
                h.remove()
            seen["changed"] = {n for n, p in params.items() if not torch.equal(p.detach(), before[n])}

    TorchLearner.update = recorded
    try:
        yield seen
    finally:
        TorchLearner.update = update


@pytest.fixture(scope="module")
def g3_lora(g3, tmp_path_factory):
    """A 3-step LoRA run on the Gemma 3 wrapper (rank 4, the default targets, sample 0 of each prompt forced right):
    ``{"run", "output", "batches", "grads"}``; checkpoints at steps 2 and 3."""
    folder, _ = g3
    tmp = tmp_path_factory.mktemp("g3_lora")
    with gradient_record() as grads:
        code, output, _, batches = _quiet_main(
            [f"model.path={folder}", f"data.dataset={_data(tmp / 'train.jsonl')}", *TRAIN, *THREE, *LORA,
             f"train.out_dir={tmp}", "train.run_name=r"], forcer(["<end_of_turn>", "<eos>"]))
    assert code == 0, output
    return {"run": tmp / "r", "output": output, "batches": batches, "grads": grads}


def _g3_ckpt(g3_lora, step=2) -> Path:
    return g3_lora["run"] / "checkpoints" / f"step_{step:06d}"


LM_LINEAR = {f"language_model.model.layers.{i}.{m}.weight" for i in range(2) for m in (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
    "mlp.down_proj")}


def test_a_lora_run_on_gemma3_trains_the_language_models_layers_under_the_hubs_names(g3, g3_lora):
    """The step-2 checkpoint of the LoRA run: ``model.safetensors`` under exactly the input's tensor names (the hub's
    ``language_model.model.*``, not transformers 5's), every linear layer of the language model merged with its
    trained adapters (changed), every other tensor (embeddings, norms, the SigLIP tower, the projector) the input's
    byte for byte; transformers 5 reloads it as the wrapper with every tensor the file's."""
    from transformers import AutoModelForCausalLM

    from test_gemma3_olmo2_path_sweep import hub_name

    folder, _ = g3
    assert f"LoRA: rank {RANK} on all-linear," in g3_lora["output"], g3_lora["output"]
    assert "Traceback" not in g3_lora["output"] and "warning:" not in g3_lora["output"], g3_lora["output"]
    given, saved = _tensors(folder / "model.safetensors"), _tensors(_g3_ckpt(g3_lora) / "model.safetensors")
    assert sorted(saved) == sorted(given)
    changed = {k for k in given if not torch.equal(given[k], saved[k])}
    assert changed == LM_LINEAR, sorted(changed ^ LM_LINEAR)
    assert any(k.startswith("vision_tower.") for k in given) and any(k.startswith("multi_modal") for k in given)
    model = AutoModelForCausalLM.from_pretrained(_g3_ckpt(g3_lora))
    state = {hub_name(k): v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert type(model).__name__ == "Gemma3ForConditionalGeneration" and set(state) == set(saved)
    assert all(torch.equal(state[k], saved[k]) for k in saved)


def _rows(g3_lora, n=4):
    """The first ``n`` rows of the run's first learner batch (right-padded ids, attention mask)."""
    b = g3_lora["batches"][0]
    return b["input_ids"][:n], b["attention_mask"][:n]


def test_the_lora_checkpoints_adapter_folder_gives_the_merged_models_logits(g3, g3_lora):
    """``PeftModel.from_pretrained(base, ckpt / "adapter")`` on the input folder's wrapper, and
    ``AutoPeftModelForCausalLM`` on the adapter folder alone (its ``base_model_name_or_path`` is the folder), give the
    merged checkpoint's logits on the run's rows (and not the base's: the adapters trained)."""
    from peft import AutoPeftModelForCausalLM, PeftModel
    from transformers import AutoModelForCausalLM

    folder, _ = g3
    ckpt = _g3_ckpt(g3_lora)
    config = json.loads((ckpt / "adapter" / "adapter_config.json").read_text())
    assert (config["base_model_name_or_path"], config["r"], config["lora_alpha"]) == (str(folder), RANK, 2 * RANK)
    ids, mask = _rows(g3_lora)
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(ckpt).eval()(input_ids=ids, attention_mask=mask).logits
        base = AutoModelForCausalLM.from_pretrained(folder).eval()
        plain = base(input_ids=ids, attention_mask=mask).logits
        peft = PeftModel.from_pretrained(base, ckpt / "adapter").eval()(input_ids=ids, attention_mask=mask).logits
        auto = AutoPeftModelForCausalLM.from_pretrained(ckpt / "adapter").eval()(input_ids=ids,
                                                                                  attention_mask=mask).logits
    keep = mask.bool()
    assert float((merged - plain)[keep].abs().max()) > 1e-3  # (what the comparisons below could miss)
    assert float((peft - merged)[keep].abs().max()) < 1e-5 and float((auto - merged)[keep].abs().max()) < 1e-5


def test_no_gradient_reaches_anything_outside_gemma3s_language_model(g3_lora):
    """The run's first update: a gradient reaches every adapter of the language model, and nothing else (not the
    frozen base, not the vision tower, nor adapters PEFT may have put there); only language-model adapters change."""
    grads = g3_lora["grads"]
    lm = {n for n in grads["trainable"] if n.startswith("model.language_model.")}
    assert lm and all(".lora_" in n for n in grads["trainable"])
    assert grads["grad"] == lm, sorted(grads["grad"] ^ lm)[:5]
    assert {n for n in grads["changed"] if ".lora_B." in n} == {n for n in lm if ".lora_B." in n}
    assert all(n.startswith("model.language_model.") for n in grads["changed"]), sorted(grads["changed"])[:5]


def test_a_lora_run_on_gemma3_adapts_the_language_model_only(g3, g3_lora):
    """The run's own line counts the trainable parameters of the language model's adapters (8,192 here: 2 layers of
    q/k/v/o/gate/up/down at rank 4), and ``adapter/`` holds those adapters alone. Found: 9,984, the SigLIP tower's
    q/k/v/out_proj and fc1/fc2 adapted too (their B stays 0: they never train)."""
    import re

    from transformers import Gemma3ForConditionalGeneration

    folder, _ = g3
    want = _lm_adapter_count(Gemma3ForConditionalGeneration.from_pretrained(folder), RANK)
    said = int(re.search(r"LoRA: rank \d+ on \S+, ([\d,]+) trainable", g3_lora["output"]).group(1).replace(",", ""))
    names = _tensors(_g3_ckpt(g3_lora) / "adapter" / "adapter_model.safetensors")
    outside = sorted(n for n in names if not n.startswith("base_model.model.model.language_model."))
    assert (said, outside) == (want, []), (said, want, outside[:4])


def test_a_lora_run_on_gemma3_resumes_as_the_uninterrupted_run(g3_lora, tmp_path):
    """``--resume`` from the step-2 checkpoint (merged weights under the hub's names, the adapters in learner.pt):
    the resumed step 3 is the uninterrupted run's bit for bit, merged weights and adapter folder."""
    code, output = _resume_from_step_2(g3_lora["run"], tmp_path / "r", forcer(["<end_of_turn>", "<eos>"]))
    assert code == 0 and "resumed from" in output and "step_000002 (step 2)" in output, output
    for name in ("model.safetensors", "adapter/adapter_model.safetensors"):
        want, got = _tensors(_g3_ckpt(g3_lora, 3) / name), _tensors(tmp_path / "r/checkpoints/step_000003" / name)
        assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want), name
    two, three = (_tensors(_g3_ckpt(g3_lora, s) / "adapter/adapter_model.safetensors") for s in (2, 3))
    assert any(not torch.equal(two[k], three[k]) for k in two)  # (step 3 trained: a restart would show)


def _lora_learner(folder, tok):
    from pacs_fast.config import load_config
    from pacs_fast.trainer.build import build_learner

    cfg = load_config(None, [f"model.path={folder}", *LORA])
    return build_learner(cfg, Path(folder), "cpu", tok)[0]


def test_the_lora_merge_check_compares_the_wrappers_renamed_tensors(g3, g3_lora, tmp_path):
    """A LoRA resume compares the checkpoint's merged weights (the hub's names) with the merge of its adapters on
    model.path's base (for checkpoints without the base's digest): the step-2 checkpoint passes, the same with one
    language-model tensor changed is refused, named by the model's name."""
    from safetensors.torch import save_file

    from pacs_fast.learner.hf_folder import LazyHFCheckpoint

    folder, tok = g3
    ckpt = tmp_path / "ckpt"
    shutil.copytree(_g3_ckpt(g3_lora), ckpt)
    state = torch.load(ckpt / "learner.pt", weights_only=False)
    state["lora_base"] = None
    learner = _lora_learner(folder, tok)
    learner.load_hf_weights(LazyHFCheckpoint(ckpt).items())
    learner.load_state_dict(state)
    tensors = _tensors(ckpt / "model.safetensors")
    tensors["language_model.model.layers.1.mlp.down_proj.weight"][0, 0] += 0.01
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    learner = _lora_learner(folder, tok)
    learner.load_hf_weights(LazyHFCheckpoint(ckpt).items())
    with pytest.raises(ValueError, match=r"checkpoint's model\.language_model\.layers\.1\.mlp\.down_proj\.weight "):
        learner.load_state_dict(state)


def test_a_lora_resume_on_the_wrapper_reads_the_checkpoint_a_tensor_at_a_time(g3, g3_lora, monkeypatch):
    """``load_hf_weights`` with LoRA keeps a checkpoint's LazyHFCheckpoint unread (its docstring; the merge check in
    ``load_state_dict`` reads a tensor at a time), as without renaming. Found: on the wrapper's hub names every
    tensor is read into a dict first (at 24B, 48 GB of bf16 held beside the base)."""
    import pacs_fast.learner.hf_folder as hf_folder

    folder, tok = g3
    learner = _lora_learner(folder, tok)
    reads, read = [], hf_folder._read_tensor
    monkeypatch.setattr(hf_folder, "_read_tensor", lambda path, name: reads.append(name) or read(path, name))
    checkpoint = hf_folder.LazyHFCheckpoint(_g3_ckpt(g3_lora))
    assert len(checkpoint) > 40  # (the count below is of these)
    learner.load_hf_weights(checkpoint.items())
    assert reads == [], f"{len(reads)} of {len(checkpoint)} tensors read before the merge check"


# =========================================================================================== Mistral 3

MISTRAL_TEMPLATE = (  # Mistral-Small-3.1's shape (system turn in [SYSTEM_PROMPT], [INST] turns), no default system
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- if system_message is defined %}{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}{{- '[INST]' + message['content'] + '[/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}{{- message['content'] + eos_token }}"
    "{%- else %}{{- raise_exception('Only user and assistant roles are supported') }}{%- endif %}"
    "{%- endfor %}")
# Tekken's first ids (Mistral-Small-3.1): <unk> 0, <s> 1, </s> 2, [INST] 3, [/INST] 4, ..., [IMG] 10, <pad> 11, ...
M3_SPECIAL = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
              "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]",
              "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]"]
TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
                r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
M3_CORPUS = ["Step 1: add 2 and 3.\n\nStep 2: the sum is 5.\n\nThe answer is \\boxed{5}",
             "You are a helpful assistant. Please reason step by step, and put your final answer within \\boxed{}.",
             "What is 12 plus 7? So the answer is"] * 10
# transformers 5's Mistral3ForConditionalGeneration names -> the hub's (transformers 4.50 wrote them)
M3_HUB = (("model.language_model.", "language_model.model."), ("model.vision_tower.", "vision_tower."),
          ("model.multi_modal_projector.", "multi_modal_projector."), ("lm_head.", "language_model.lm_head."))
_RAW: dict = {}


def mistral3_raw():
    """A byte-level BPE on Tekken's split regex with Mistral's special tokens first (ids 0..19), ``<s>`` added by a
    ``TemplateProcessing`` post-processor (built once)."""
    if "m3" in _RAW:
        return _RAW["m3"]
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(TEKKEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(M3_CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=M3_SPECIAL,
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in M3_SPECIAL])
    raw.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s>:1 $B:1",
                                                       special_tokens=[("<s>", M3_SPECIAL.index("<s>"))])
    _RAW["m3"] = raw
    return raw


def m3_hub_name(name: str) -> str:
    for new, old in M3_HUB:
        if name.startswith(new):
            return old + name[len(new):]
    raise AssertionError(f"no hub name for {name}")


def mistral3_folder(folder: Path, *, hidden: int = 64, heads: int = 4) -> Path:
    """A Mistral-Small-3.1-24B-Instruct-shaped folder: the hub's config.json (mistral3, a mistral ``text_config`` with
    no ``tie_word_embeddings`` key and no sliding window, a pixtral ``vision_config``; no top-level tie key), a tiny
    Mistral3ForConditionalGeneration (2 text layers, GQA 4:2, an untied head; a 1-layer Pixtral on 56x56 images, the
    2x2 patch merger) in fp32 under the hub's tensor names, generation_config.json (EOS </s>, pad <pad>), tokenizer
    files with the chat template, the processor's files. The head row of </s> reads one hidden unit."""
    from safetensors.torch import save_file
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    raw = mistral3_raw()
    folder.mkdir(parents=True, exist_ok=True)
    raw.save(str(folder / "tokenizer.json"))
    ids = {t: raw.token_to_id(t) for t in M3_SPECIAL}
    assert list(ids.values()) == list(range(len(M3_SPECIAL)))
    tcfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
            "unk_token": "<unk>", "pad_token": "<pad>", "clean_up_tokenization_spaces": False,
            "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast",
            "processor_class": "PixtralProcessor", "chat_template": MISTRAL_TEMPLATE,
            "added_tokens_decoder": {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                              "single_word": False, "special": True} for t, i in ids.items()}}
    (folder / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                                "unk_token": "<unk>", "pad_token": "<pad>"}))
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_processor_type": "PixtralImageProcessorFast",
        "image_std": [0.26862954, 0.26130258, 0.27577711], "patch_size": 14, "processor_class": "PixtralProcessor",
        "resample": 3, "rescale_factor": 0.00392156862745098, "size": {"longest_edge": 56}}, indent=2))
    (folder / "processor_config.json").write_text(json.dumps({
        "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]", "image_token": "[IMG]", "patch_size": 14,
        "processor_class": "PixtralProcessor", "spatial_merge_size": 2}, indent=2))
    config = {
        "architectures": ["Mistral3ForConditionalGeneration"], "image_token_index": ids["[IMG]"],
        "model_type": "mistral3", "multimodal_projector_bias": False, "projector_hidden_act": "gelu",
        "spatial_merge_size": 2,
        "text_config": {"attention_dropout": 0.0, "head_dim": hidden // heads, "hidden_act": "silu",
                        "hidden_size": hidden, "initializer_range": 0.02, "intermediate_size": 2 * hidden,
                        "max_position_embeddings": 4096, "model_type": "mistral", "num_attention_heads": heads,
                        "num_hidden_layers": 2, "num_key_value_heads": heads // 2, "rms_norm_eps": 1e-05,
                        "rope_theta": 1000000000.0, "sliding_window": None, "use_cache": True,
                        "vocab_size": raw.get_vocab_size()},
        "torch_dtype": "float32", "transformers_version": "4.50.0.dev0",
        "vision_config": {"attention_dropout": 0.0, "head_dim": 16, "hidden_act": "silu", "hidden_size": 32,
                          "image_size": 56, "initializer_range": 0.02, "intermediate_size": 64,
                          "model_type": "pixtral", "num_attention_heads": 2, "num_channels": 3,
                          "num_hidden_layers": 1, "patch_size": 14, "rope_theta": 10000.0},
        "vision_feature_layer": -1}
    torch.manual_seed(0)
    model = Mistral3ForConditionalGeneration(Mistral3Config(**config, tie_word_embeddings=False)).float()
    with torch.no_grad():
        for p in model.parameters():  # (weights large enough that positions and norms matter)
            if p.dim() >= 2:
                p.normal_(0, 0.1)
        model.lm_head.weight[ids["</s>"]] = 0.0
        model.lm_head.weight[ids["</s>"], 2] = 4.0
    save_file({m3_hub_name(k): v.contiguous() for k, v in model.state_dict().items()},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"], "pad_token_id": ids["<pad>"],
         "transformers_version": "4.50.0.dev0"}, indent=2))
    return folder


def mistral_prompt(user: str, system: str | None) -> str:
    head = f"[SYSTEM_PROMPT]{system}[/SYSTEM_PROMPT]" if system else ""
    return f"<s>{head}[INST]{user}[/INST]"


@pytest.fixture(scope="module")
def m3(tmp_path_factory):
    from transformers import AutoTokenizer

    folder = mistral3_folder(tmp_path_factory.mktemp("m3") / "mistral-small-3.1")
    return folder, AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def m3_run(m3, tmp_path_factory):
    """A 3-step run on the Mistral 3 folder (HF engine, torch learner; sample 0 of each prompt forced right), the
    ``(calls, batches, output, run)``; checkpoints at steps 2 and 3."""
    folder, _ = m3
    tmp = tmp_path_factory.mktemp("m3_run")
    code, output, calls, batches = _quiet_main(
        [f"model.path={folder}", f"data.dataset={_data(tmp / 'train.jsonl')}", *TRAIN, *THREE,
         f"train.out_dir={tmp}", "train.run_name=r"], forcer(["</s>"]))
    assert code == 0, output
    return calls, batches, output, tmp / "r"


def _m3_ckpt(m3_run, step=2) -> Path:
    return m3_run[3] / "checkpoints" / f"step_{step:06d}"


def test_the_mistral3_folder_loads_as_the_hubs_do(m3):
    """What the rest relies on: AutoTokenizer keeps the folder's pipeline (<s> from the post-processor), BOS <s>, EOS
    </s>, pad <pad>; the template; transformers 5 builds the wrapper from the hub's names (every tensor the file's,
    the head untied: its Mistral3Config says ``tie_word_embeddings=True`` when config.json is silent, and
    ``from_pretrained`` unties a head the file holds), no sliding window."""
    from transformers import Mistral3ForConditionalGeneration

    folder, tok = m3
    assert tok.backend_tokenizer.to_str() == mistral3_raw().to_str()
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == tuple(M3_SPECIAL.index(t)
                                                                           for t in ("<s>", "</s>", "<pad>"))
    assert tok("12 plus 7")["input_ids"][0] == tok.bos_token_id
    assert tok.apply_chat_template([{"role": "system", "content": "S "}, {"role": "user", "content": " U"}],
                                   tokenize=False, add_generation_prompt=True) == mistral_prompt(" U", "S ")
    model = Mistral3ForConditionalGeneration.from_pretrained(folder)
    hub = _tensors(folder / "model.safetensors")
    state = {m3_hub_name(k): v for k, v in model.state_dict().items()}
    assert set(state) == set(hub) and all(torch.equal(v, hub[k]) for k, v in state.items())
    assert model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    assert model.config.get_text_config().sliding_window is None and len(tok) == model.config.text_config.vocab_size


def test_train_loads_a_mistral3_wrapper(m3, tmp_path, capsys):
    """``python -m pacs_fast.train model.path=<Mistral 3 folder>`` (README: "LLaVA- and Mistral 3-style wrappers;
    torch learner: the language model trains") runs. Found: exit 2, ``error: Unrecognized configuration class <class
    '...Mistral3Config'> for this kind of AutoModel: AutoModelForCausalLM.`` and a 3,000-character list of classes."""
    folder, _ = m3
    code, err = cli([f"model.path={folder}", f"data.dataset={_data(tmp_path / 'd.jsonl')}", *TRAIN,
                     "train.save_every=0", f"train.out_dir={tmp_path / 'runs'}", "train.run_name=m"], capsys)
    assert code in (0, None), err[-600:]


def test_a_mistral3_run_sends_the_template_once_stops_at_eos_and_masks_it(m3, m3_run):
    """Every engine call of the run: prompt ids are the template once (one <s>, the
    paper's system text in [SYSTEM_PROMPT]); responses end at </s> (kept once, last) or run to the limit, both seen;
    the learner's batches hold prompt + response with the loss mask on exactly the response and its </s>."""
    _, tok = m3
    calls, batches, output, _ = m3_run
    assert "warning:" not in output and "Traceback" not in output, output
    eos, ends = tok.eos_token_id, set()
    for prompts, params, comps in calls:
        for p, cs in zip(prompts, comps):
            text = mistral_prompt(f"{_problem(tok, p)} {INSTRUCTION}", SYSTEM_PROMPT)
            assert p == mistral3_raw().encode(text, add_special_tokens=False).ids and p.count(tok.bos_token_id) == 1
            for c in cs:
                ends.add(check_completion(c, {eos}, params.max_new_tokens))
                assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
    assert ends == {eos, None}, ends
    train = [c for c in calls if c[1].return_logprobs]
    assert len(train) == len(batches) == 3
    for (prompts, _, comps), batch in zip(train, batches):
        check_batch(batch, prompts, comps)


def test_the_mistral3_engine_and_learner_give_the_wrappers_own_log_probs(m3, m3_run):
    """At the folder's weights (the run's first training call): the HF engine's log-prob of every sampled token and
    the torch learner's, padded or packed, with and without the shared-prefix forward (Mistral 3 has no window:
    the default runs it), are those of the wrapper's own forward of each row alone; the run's own engine-against-
    learner gap is float rounding."""
    from transformers import Mistral3ForConditionalGeneration

    folder, tok = m3
    calls, batches, _, run = m3_run
    model = Mistral3ForConditionalGeneration.from_pretrained(folder).eval()
    batch = batches[0]
    assert max(batch["attention_mask"].sum(-1).tolist()) > 40
    refs = own_logprobs(model, batch, len(tok))
    prompts, _, comps = next(c for c in calls if c[1].return_logprobs)
    r = 0
    for p, cs in zip(prompts, comps):
        for c in cs:
            ref = refs[r][len(p) - 1:len(p) - 1 + len(c.token_ids)]
            assert torch.allclose(torch.tensor(c.logprobs, dtype=torch.float64), ref, atol=1e-5, rtol=0), r
            r += 1
    gaps = {(packing, shared): learner_gap(model, batch, refs, len(tok), packing, shared)
            for packing in ("off", "on") for shared in (False, True)}
    assert max(gaps.values()) < 1e-5 and max(run_logprob_gaps(run)) < 1e-4, gaps


def test_the_mistral3_checkpoint_trains_the_text_model_and_leaves_the_tower_byte_for_byte(m3, m3_run):
    """The step-2 checkpoint: the Pixtral tower and the projector (patch merger included) the input's byte for byte,
    every tensor of the text model it holds trained; config.json keeps the architecture and the input's sub-config
    keys; tokenizer, template, generation and processor files byte for byte."""
    folder, _ = m3
    ckpt = _m3_ckpt(m3_run)
    given, saved = _tensors(folder / "model.safetensors"), _tensors(ckpt / "model.safetensors")
    frozen = [k for k in given if k.startswith(("vision_tower.", "multi_modal_projector."))]
    assert len(frozen) > 10 and all(torch.equal(saved[k], given[k]) for k in frozen)
    text = [k for k in saved if k.startswith("language_model.")]
    assert len(text) >= 20 and all(not torch.equal(saved[k], given[k]) for k in text)
    config, before = json.loads((ckpt / "config.json").read_text()), json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Mistral3ForConditionalGeneration"] and config["model_type"] == "mistral3"
    for key in ("text_config", "vision_config"):
        assert {k: config[key].get(k) for k in before[key]} == before[key], key
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                 "preprocessor_config.json", "processor_config.json"):
        assert (ckpt / name).read_bytes() == (folder / name).read_bytes(), name


def test_the_mistral3_checkpoint_keeps_the_inputs_tensor_names(m3, m3_run):
    from safetensors import safe_open

    folder, _ = m3
    names = []
    for f in (folder / "model.safetensors", _m3_ckpt(m3_run) / "model.safetensors"):
        with safe_open(str(f), framework="pt") as h:
            names.append(sorted(h.keys()))
    assert names[1] == names[0], sorted(set(names[0]) ^ set(names[1]))


def test_the_mistral3_checkpoint_reloads_with_its_trained_head(m3_run):
    """transformers 5 loads the step-2 checkpoint as the wrapper with every tensor the file's and the head its own.
    Found: the file has no head, so transformers ties it to the embedding (the config's default): another model."""
    from transformers import Mistral3ForConditionalGeneration

    ckpt = _m3_ckpt(m3_run)
    model = Mistral3ForConditionalGeneration.from_pretrained(ckpt)
    saved = _tensors(ckpt / "model.safetensors")
    state = {m3_hub_name(k): v for k, v in model.state_dict().items()}
    assert all(torch.equal(state[k], saved[k]) for k in saved)
    assert model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    assert set(state) == set(saved)


def test_a_mistral3_run_resumes_as_the_uninterrupted_run(m3, m3_run, tmp_path):
    """``--resume`` from step 2 gives the uninterrupted run's step 3 bit for bit, the tower untouched. Found:
    ``load_hf_weights: 1 of the policy's tensors are not in the weights given: ['lm_head.weight']``, the checkpoint
    skipped, ``error: --resume ...: no usable checkpoint``."""
    folder, _ = m3
    code, output = _resume_from_step_2(m3_run[3], tmp_path / "r", forcer(["</s>"]))
    assert code == 0 and "resumed from" in output, output[-800:]
    want, got = _tensors(_m3_ckpt(m3_run, 3) / "model.safetensors"), _tensors(
        tmp_path / "r/checkpoints/step_000003/model.safetensors")
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
    given = _tensors(folder / "model.safetensors")
    assert all(torch.equal(got[k], given[k]) for k in given if k.startswith("vision_tower."))


def test_an_hf_engine_with_its_own_copy_takes_the_learners_mistral3_weights(m3):
    """The sync of an HF engine holding its own model (beside the megatron learner, another ``rollout.dtype``): after
    a step that moved the head and a tower tensor, every tensor of the engine's copy is the learner's. Found: the
    head is never sent, so the engine keeps sampling from the input's head."""
    from transformers import Mistral3ForConditionalGeneration

    from pacs_fast.config import load_config
    from pacs_fast.learner.torch_learner import TorchLearner
    from pacs_fast.rollout.hf import HFEngine

    folder, tok = m3
    cfg = load_config(None, [])
    learner = TorchLearner(Mistral3ForConditionalGeneration.from_pretrained(folder), algo=cfg.algo,
                           learner=cfg.learner, vocab_size=len(tok))
    with torch.no_grad():
        learner.model.lm_head.weight.add_(0.5)
        learner.model.model.vision_tower.ln_pre.weight.add_(0.5)
    engine = HFEngine(str(folder))
    engine.sync_weights(learner.export_hf_weights())
    after, want = engine.model.state_dict(), learner.model.state_dict()
    assert torch.equal(after["model.vision_tower.ln_pre.weight"], want["model.vision_tower.ln_pre.weight"])
    assert [k for k in want if not torch.equal(after[k], want[k])] == []


def test_the_megatron_learner_refuses_mistral3_in_one_line_before_it_loads(m3, tmp_path, capsys, monkeypatch):
    import pacs_fast.trainer.session as session

    def no_load(*args, **kwargs):
        raise AssertionError("the learner was built")

    monkeypatch.setattr(session, "build_learner", no_load)
    folder, _ = m3
    runs = tmp_path / "runs"
    code, err = cli([f"model.path={folder}", "learner.backend=megatron", f"data.dataset={_data(tmp_path / 'd.jsonl')}",
                     f"train.out_dir={runs}", "train.run_name=m"], capsys)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"error: learner.backend=megatron cannot build model.path={folder}: ") and \
        "got 'mistral3'" in lines[0], err
    assert not (runs / "m").exists()


# =========================================================================================== adapter placement

@pytest.mark.parametrize("targets", ["all-linear", "q_proj,v_proj"])
@pytest.mark.parametrize("family", ["gemma3", "mistral3"])
def test_lora_adapts_the_wrappers_language_model_only(g3, m3, family, targets):
    """``add_lora`` (what ``model.lora_rank`` runs) on each wrapper: every adapted layer is in the language model and
    the count it returns is theirs. Found: SigLIP's q/k/v/out_proj, fc1/fc2 (Gemma 3), Pixtral's q/k/v/o_proj and
    gate/up/down_proj and the projector's linear_1/linear_2/merging_layer (Mistral 3) adapted too."""
    from transformers import Gemma3ForConditionalGeneration, Mistral3ForConditionalGeneration

    from pacs_fast.learner.lora import add_lora, lora_layers

    folder = (g3 if family == "gemma3" else m3)[0]
    cls = Gemma3ForConditionalGeneration if family == "gemma3" else Mistral3ForConditionalGeneration
    model = cls.from_pretrained(folder)
    names = [t for t in targets.split(",") if t != "all-linear"]
    want = sum(RANK * (m.in_features + m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and n.startswith("model.language_model.")
               and (not names or n.rsplit(".", 1)[-1] in names))
    trained = add_lora(model, rank=RANK, alpha=2.0 * RANK, dropout=0.0, target_modules=targets)
    outside = [n for n in lora_layers(model) if not n.startswith("model.language_model.")]
    assert (trained, outside) == (want, []), (trained, want, outside[:4])


def test_the_memory_check_counts_mistral3s_own_head(m3, g3):
    """config.json of Mistral Small 3.1 says nothing of tying and transformers 5's Mistral3Config defaults to tied,
    but the model's head is the file's own (``language_model.lm_head.weight``): the memory check's parameter count
    (a lower bound, pacs_fast/trainer/memory_model.py) counts it. Gemma 3's tied head (no such tensor) once."""
    from pacs_fast.config import load_config
    from pacs_fast.trainer.memory_model import model_params, model_shape

    shapes = {name: model_shape(load_config(None, [f"model.path={folder}"])) for name, (folder, _) in
              (("m3", m3), ("g3", g3))}
    assert shapes["m3"]["tied"] is False and shapes["g3"]["tied"] is True
    s = shapes["m3"]
    assert model_params(s) - model_params({**s, "tied": True}) == s["vocab"] * s["hidden"]
