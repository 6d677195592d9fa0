"""The product on a Gemma 4-shaped folder (hostile sweep of 2026-12-07).

Gemma 4 (transformers' ``gemma4``; the hub's folders are ``Gemma4ForConditionalGeneration``: a ``gemma4_text`` decoder
with a vision tower) brings what no earlier family had together: full-attention layers with wider heads
(``global_head_dim``: 512 beside 256) that transformers 5 keeps as a *heterogeneous* config (``per_layer_config``;
reading ``config.head_dim`` raises ``AmbiguousGlobalPerLayerAttributeError``), per-layer input embeddings (a second
embedding of ``vocab x layers x 256``: 2.3B of E2B's parameters), the last ``num_kv_shared_layers`` layers reusing an
earlier layer's keys and values (no key / value projections, no cache), sliding-window layers, a final logit
soft-cap of 30. The folder here has those at tiny widths: hidden 64, 6 layers (sliding, sliding, full) x 2, heads 4 x
16 (the full layers 4 x 32), the last 2 layers KV-shared, per-layer inputs of 8, a 1-layer vision tower; the Gemma
tokenizer and chat template of tests/test_gemma3_olmo2_path_sweep.py (Gemma 4's own template was not found in public
sources; its stop ids, <eos> and <end_of_turn>, are Gemma 3's).

Found and fixed (each test below failed before its fix, checked by reverting it):
1. Every run stopped at its start with transformers' ``AmbiguousGlobalPerLayerAttributeError`` traceback: the
   model folder's shape check read ``head_dim`` off the heterogeneous config (pacs_fast/config/model_files.py); the
   FLOP count's ``shape_of`` (bench/gpu/learner.py's MFU) too. Read through ``config_attr`` now.
2. The memory and FLOP counts read every layer at ``head_dim`` with keys and values of its own and no per-layer
   inputs: the learner's parameters 15% short here (249,920 of 292,976; 2.3B short in E2B, with their gradients and
   Adam moments), the HF engine's cache counted in the KV-shared layers (384 elements a token for 320), the full
   layers' wider heads missed, LoRA's adapters on the per-layer input projections left out.
   pacs_fast/config/per_layer.py reads each layer's widths: the counts equal
   the built model's weights, transformers' own cache and PEFT's adapters.
3. The MoE variant (26B-A4B: fused experts of its own beside a dense MLP of the same names): LoRA's ``all-linear``
   left every expert bare (PEFT maps none), the counts missed its dense MLP and read top-1; a listed target name
   (``gate_proj``) matched the vision tower's ``Gemma4ClippableLinear`` and PEFT refused the run (the dense model
   too). pacs_fast/learner/lora.py ``EXPERTS_BESIDE_MLP``, ``outside_language_model``.
4. Gemma 3n (its decoder, Gemma 4's forerunner: per-layer inputs, KV-shared layers, AltUp, LAuReL): every run stopped
   at its start with a TypeError traceback (its ``intermediate_size`` is a list a layer); the counts missed AltUp and
   LAuReL. pacs_fast/config/per_layer.py ``intermediate_of``, ``altup_laurel``.

Seen and held: the learner's padded and packed forwards (the window keeps the shared-prefix one off) and the HF
engine's sampler on the KV-shared cache give the model's own log-probs (a run's ``rollout/logprob_diff_max`` at
fp32 rounding); the vision tower stays byte for byte; the checkpoint keeps the hub's names and reloads as the wrapper
with its per-layer head widths; the hub's k/v tensors of the KV-shared layers (transformers skips them on load) are
not carried (they belong to layers the model holds; vLLM's Gemma 4 has none either).
"""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from test_gemma3_olmo2_path_sweep import G3_IMAGE, G3_SOFT, G3_SPECIAL, GEMMA3_TEMPLATE, gemma3_raw, stop_rows
from test_llama3_path_sweep import _data
from test_qwen35_path_sweep import two_step_run
from test_qwen3_path_sweep import _gold, forced_completion

G, P, MAX_NEW = 4, 2, 8
LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention"] * 2


def gemma4_folder(folder: Path, *, hidden: int = 64, heads: int = 4, moe: bool = False) -> Path:
    """The hub-shaped folder (module docstring): config.json as the hub writes it (``global_head_dim``, not
    transformers' ``per_layer_config``), weights saved by ``Gemma4ForConditionalGeneration`` itself (the hub's names),
    the head rows of <end_of_turn> and <eos> reading one hidden unit each. ``moe``: the 26B-A4B's MoE layers (4
    experts of 32, top 2, beside the dense MLP), its experts fused in its own files."""
    import transformers as T

    raw = gemma3_raw()
    folder.mkdir(parents=True, exist_ok=True)
    raw.save(str(folder / "tokenizer.json"))
    ids = {t: raw.token_to_id(t) for t in G3_SPECIAL + G3_IMAGE + [G3_SOFT]}
    vocab = raw.get_vocab_size() + 9
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
        "unk_token": "<unk>", "chat_template": GEMMA3_TEMPLATE, "tokenizer_class": "GemmaTokenizer",
        "added_tokens_decoder": {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True} for t, i in ids.items()}}, indent=2))
    stops = [ids["<eos>"], ids["<end_of_turn>"]]
    text = {"model_type": "gemma4_text", "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": 2 * hidden,
            "num_hidden_layers": 6, "num_attention_heads": heads, "num_key_value_heads": heads // 2,
            "head_dim": hidden // heads, "global_head_dim": 2 * hidden // heads, "sliding_window": 8,
            "layer_types": LAYER_TYPES, "vocab_size_per_layer_input": vocab, "hidden_size_per_layer_input": 8,
            "num_kv_shared_layers": 2, "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh",
            "pad_token_id": ids["<pad>"], "bos_token_id": ids["<bos>"], "eos_token_id": stops,
            "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                   "rope_theta": 1000000.0}}}
    if moe:
        text.update(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32)
    vision = {"model_type": "gemma4_vision", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "patch_size": 16,
              "position_embedding_size": 64}
    config = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": text,
              "vision_config": vision, "audio_config": None, "eos_token_id": stops, "tie_word_embeddings": True,
              "image_token_id": ids[G3_SOFT], "boi_token_id": ids["<start_of_image>"],
              "eoi_token_id": ids["<end_of_image>"], "dtype": "bfloat16", "transformers_version": "5.5.0"}
    torch.manual_seed(0)
    model = T.Gemma4ForConditionalGeneration(T.Gemma4Config(**{k: v for k, v in config.items()
                                                               if k != "architectures"})).float()
    with torch.no_grad():  # (weights large enough that the window, the soft-cap and the per-layer inputs matter)
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.1)
        stop_rows(model, ids)
    model.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids["<bos>"], "do_sample": True, "eos_token_id": stops, "pad_token_id": ids["<pad>"],
         "top_k": 64, "top_p": 0.95, "transformers_version": "5.5.0"}, indent=2))
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return gemma4_folder(tmp_path_factory.mktemp("gemma4") / "gemma-4-tiny-it")


def forced_run(folder: Path, tmp: Path, response: str, stop: str, *extra: str, max_new: int = MAX_NEW,
               samples=None):
    """``python -m pacs_fast.train`` in this process on ``folder``: 2 steps (run ``r`` in ``tmp``), HF engine, defaults
    otherwise but ``extra``; sample 0 of each prompt is ``response`` with its right answer (``response.format(gold)``),
    then the token ``stop``, sample 1 the same with a wrong one (rewards mixed: a gradient); or, given ``samples``
    (``samples(encode, gold)``: token id lists), the first samples those ids, cut at ``max_new``. The run's folder and
    its output."""
    from pacs_fast.learner.packing import say_no_shared_prefix, say_padded_rows
    from pacs_fast.rollout.hf import HFEngine
    from pacs_fast.train import main

    say_padded_rows.cache_clear(), say_no_shared_prefix.cache_clear()  # (once a process: this run's lines)
    generate = HFEngine.generate

    def forced(self, prompts, params):
        out = generate(self, prompts, params)
        if not params.return_logprobs:
            return out
        enc = lambda s: self.tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
        end = self.tokenizer.convert_tokens_to_ids(stop)
        for p, cs in zip(prompts, out):
            gold = _gold(self.tokenizer, p)
            forced_ids = samples(enc, gold) if samples else [enc(response.format(a))[:max_new - 1] + [end]
                                                              for a in (gold, gold + 1)]
            for k, ids in enumerate(forced_ids):
                cs[k] = forced_completion(self, p, ids[:max_new], max_new, cs[k].logprobs is not None)
        return out

    text = io.StringIO()
    HFEngine.generate = forced
    try:
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            main([*two_step_run(folder, tmp), f"rollout.max_new_tokens={max_new}", *extra])
    finally:
        HFEngine.generate = generate
    return tmp / "r", text.getvalue()


@pytest.fixture(scope="module")
def run(folder, tmp_path_factory):
    """:func:`forced_run` on the folder: sample 0 of each prompt boxes the right answer then <end_of_turn>, sample 1
    a wrong one."""
    return forced_run(folder, tmp_path_factory.mktemp("runs"), "So \\boxed{{{}}}", "<end_of_turn>")


def test_a_run_trains_with_its_engine_and_learner_agreeing(run):
    """Found and fixed (1): the run had stopped at its start (the shape check's ``head_dim``). Now both steps train
    (rewards mixed, a gradient), the engine's and the learner's log-probs agree to fp32 rounding (the KV-shared cache
    in the sampler, the soft-cap on both sides), padded forwards (the window)."""
    two_agreeing_steps(run)


def two_agreeing_steps(run) -> None:
    """A :func:`forced_run`'s two steps trained (rewards mixed, a gradient) without the shared-prefix forward, its
    engine's and learner's log-probs equal to fp32 rounding."""
    run_dir, output = run
    steps = [s for s in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
             if s.get("kind") == "train"]
    assert len(steps) == 2, output[-3000:]
    for s in steps:
        assert s["rollout/logprob_diff_max"] < 1e-4 and s["learner/grad_norm"] > 0 and 0 < s["reward/mean"] < 1
        assert s["learner/forward/shared_prefix"] == 0


def test_the_checkpoint_is_the_hub_wrapper_with_its_tower_and_per_layer_widths(run, folder):
    """Every tensor of the input under the hub's names, the vision tower byte for byte, the decoder trained; it
    reloads as ``Gemma4ForConditionalGeneration`` with the full layers' wider heads."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    ckpt = run[0] / "checkpoints" / "step_000002"
    start, saved = load_file(folder / "model.safetensors"), load_file(ckpt / "model.safetensors")
    assert set(saved) == set(start)
    tower = [n for n in start if n.startswith("model.vision_tower.")]
    assert tower and all(torch.equal(saved[n], start[n]) for n in tower)
    layer = "model.language_model.layers.2.self_attn.q_proj.weight"
    assert saved[layer].shape == (4 * 32, 64) and not torch.equal(saved[layer], start[layer])
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    text = model.config.text_config
    assert type(model).__name__ == "Gemma4ForConditionalGeneration"
    assert [text.per_layer_config[i].head_dim for i in range(6)] == [16, 16, 32, 16, 16, 32]


def test_the_memory_and_flop_counts_read_each_layers_widths(folder):
    """Found and fixed (2): on the folder, the parameter count is the built decoder's matmul and embedding weights
    (the per-layer inputs' included), the cache a token is transformers' own after a forward shorter than the window
    (the KV-shared layers hold none, the full layers' heads are wider), the LoRA count is PEFT's on ``all-linear``,
    and the FLOP count's shape reads the heterogeneous config (it raised)."""
    from transformers import AutoModelForCausalLM

    from pacs_fast.config import load_config
    from pacs_fast.learner.flops import mixer_params, shape_of
    from pacs_fast.learner.lora import add_lora
    from pacs_fast.trainer.engine_memory import kv_per_token
    from pacs_fast.trainer.memory_model import lora_params, model_params, model_shape

    shape = model_shape(load_config(None, [f"model.path={folder}"]))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    decoder = model.model.language_model
    assert model_params(shape) == sum(p.numel() for p in decoder.parameters() if p.dim() >= 2)
    attention = sum(p.numel() for n, p in decoder.named_parameters() if ".self_attn." in n and p.dim() >= 2)
    assert mixer_params(shape) == mixer_params(shape_of(model.config)) == attention
    with torch.no_grad():
        cache = model(input_ids=torch.randint(10, 200, (1, 6)), use_cache=True).past_key_values
    held = sum(layer.keys.numel() + layer.values.numel() for layer in cache.layers)
    assert kv_per_token(shape) * 6 == held and len(cache.layers) == 4
    assert lora_params(shape, 4) == add_lora(model, rank=4, alpha=8, dropout=0.0, target_modules="all-linear")


def test_the_moe_layers_experts_take_adapters_and_are_counted(tmp_path):
    """Found and fixed (3): Gemma 4's MoE layers (26B-A4B) hold fused experts of their own beside a dense MLP of the
    same names, which PEFT maps to nothing: ``all-linear`` left every expert bare, and the counts read one MLP a layer
    and top-1 (``top_k_experts`` unread). Now the experts are PEFT's target parameters (a listed gate_proj / down_proj
    names both the dense layer and the experts), the vision tower takes none (a listed name had matched its
    ``Gemma4ClippableLinear`` modules, which PEFT refused: on the dense model too), and the parameter and adapter
    counts equal the built model's and PEFT's."""
    from transformers import AutoModelForCausalLM

    from pacs_fast.config import load_config
    from pacs_fast.learner.lora import add_lora
    from pacs_fast.trainer.memory_model import lora_params, model_params, model_shape

    folder = gemma4_folder(tmp_path / "gemma-4-moe", moe=True)
    shape = model_shape(load_config(None, [f"model.path={folder}"]))
    assert (shape["moe"]["top_k"], shape["moe"]["shared"]) == (2, 128)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert model_params(shape) == sum(p.numel() for p in model.model.language_model.parameters() if p.dim() >= 2)
    assert lora_params(shape, 4) == add_lora(model, rank=4, alpha=8, dropout=0.0, target_modules="all-linear")
    adapted = {n.split("layers.0.")[1].split(".lora_")[0] for n, _ in model.named_parameters()
               if ".lora_" in n and "language_model.layers.0." in n}
    assert {"experts", "experts.base_layer", "router.proj", "mlp.gate_proj"} <= adapted
    for listed in (True, False):  # (a listed name on the MoE model, and on the dense one)
        model = AutoModelForCausalLM.from_pretrained(folder if listed else gemma4_folder(tmp_path / "dense"))
        add_lora(model, rank=4, alpha=8, dropout=0.0, target_modules="gate_proj,down_proj")
        names = [n for n, _ in model.named_parameters() if ".lora_" in n]
        assert names and not any("vision" in n for n in names)
        assert any(".experts." in n for n in names) == listed


def test_megatron_is_refused_in_one_line_before_the_model_loads(folder, tmp_path, capsys):
    from test_hostile_inputs import cli

    code, err = cli([f"model.path={folder}", "learner.backend=megatron", "train.steps=1",
                     f"data.dataset={_data(tmp_path / 'd.jsonl', n=8)}", f"train.out_dir={tmp_path}"], capsys)
    assert code not in (0, None) and "learner.backend=megatron cannot build" in err and "gemma4" in err


# ------------------------------------------------------------------------------------------- Gemma 3n (its text model)

def gemma3n_folder(folder: Path) -> Path:
    """A Gemma 3n decoder (``Gemma3nForCausalLM``: the hub's E2B / E4B are wrappers around it with vision and audio
    towers, which need timm): ``intermediate_size`` a list a layer as its config writes it, AltUp of 3 inputs,
    LAuReL of rank 4, per-layer inputs of 8, the last 2 of 4 layers KV-shared; the character tokenizer."""
    import transformers as T

    from pacs_fast.data.tiny import make_tiny_model

    out = make_tiny_model(folder)
    config = T.Gemma3nTextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"] * 2,
        vocab_size_per_layer_input=128, hidden_size_per_layer_input=8, num_kv_shared_layers=2,
        activation_sparsity_pattern=[0.95, 0.95, 0.0, 0.0], altup_num_inputs=3, laurel_rank=4, pad_token_id=0,
        bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    (out / "model.safetensors").unlink()
    T.Gemma3nForCausalLM(config).save_pretrained(out)
    assert isinstance(json.loads((out / "config.json").read_text())["intermediate_size"], list)
    return out


def test_gemma3n_trains_and_is_counted(tmp_path):
    """Found and fixed (4): every Gemma 3n run stopped at its start with a TypeError traceback (the memory check read
    ``intermediate_size``, a list a layer, as one number). Now a run trains with its engine and learner agreeing, and
    the counts read the list, AltUp, LAuReL, the per-layer inputs and the KV-shared layers: the built model's weights,
    PEFT's adapters, transformers' own cache."""
    from transformers import AutoModelForCausalLM

    from pacs_fast.config import load_config
    from pacs_fast.learner.flops import shape_of
    from pacs_fast.learner.lora import add_lora
    from pacs_fast.train import main
    from pacs_fast.trainer.engine_memory import kv_per_token
    from pacs_fast.trainer.memory_model import lora_params, model_params, model_shape

    folder = gemma3n_folder(tmp_path / "gemma-3n-tiny")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main([f"model.path={folder}", "train.steps=1", "rollout.n=4", "train.prompts_per_step=2",
              "rollout.max_new_tokens=8", f"train.out_dir={tmp_path}", "train.run_name=r", "train.progress=false",
              "train.eval_every=0"])
    steps = [s for s in map(json.loads, (tmp_path / "r" / "metrics.jsonl").read_text().splitlines())
             if s.get("kind") == "train"]
    assert len(steps) == 1 and steps[0]["rollout/logprob_diff_max"] < 1e-5
    shape = model_shape(load_config(None, [f"model.path={folder}"]))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    built = sum(p.numel() for p in model.model.parameters() if p.dim() >= 2)
    assert model_params(shape) == model_params(shape_of(model.config, 4)) == built
    with torch.no_grad():
        cache = model(input_ids=torch.randint(3, 90, (1, 6)), use_cache=True).past_key_values
    assert kv_per_token(shape) * 6 == sum(layer.keys.numel() + layer.values.numel() for layer in cache.layers)
    assert lora_params(shape, 4) == add_lora(model, rank=4, alpha=8, dropout=0.0, target_modules="all-linear")
