"""The learner's memory model (pacs_fast/trainer/memory_model.py) and FLOP count (pacs_fast/learner/flops.py)
against hand computations on a tiny shape; the preflight refuses a micro-batch that cannot fit and
accepts one that can (issue 38, items 3-4)."""
import json

import re

import pytest

from pacs_fast.config import load_config
from pacs_fast.learner import flops
from pacs_fast.trainer import memory_model, preflight
from pacs_fast.trainer.memory_model import GiB

TINY = {"vocab": 100, "hidden": 8, "layers": 2, "heads": 2, "kv_heads": 1, "head_dim": 4, "intermediate": 16,
        "bytes": 2}
QWEN05 = {"vocab_size": 151936, "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
          "num_key_value_heads": 2, "intermediate_size": 4864, "model_type": "qwen2"}


def test_activation_bytes_per_token_by_hand():
    # one layer: norms 2 (4 + 2) 8 = 96; q k v, out, o_proj input 2 (3*8 + 2*4) = 64; MLP 4*2*16 = 128; lse 4*2 = 8
    layer = 96 + 64 + 128 + 8
    final = (4 + 2) * 8
    assert memory_model.activation_bytes_per_token(TINY) == 2 * layer + final
    assert memory_model.activation_bytes_per_token(TINY, recompute=True) == 2 * 2 * 8 + layer + final
    assert memory_model.activation_bytes_per_token(TINY, recompute="full") == 2 * 2 * 8 + layer + final
    # selective: every layer keeps all but its MLP's 128, one MLP is recomputed at a time
    assert memory_model.activation_bytes_per_token(TINY, recompute="selective") == 2 * (layer - 128) + 128 + final
    with pytest.raises(ValueError, match="recompute must be"):
        memory_model.activation_bytes_per_token(TINY, recompute="mlp")
    assert memory_model.activation_bytes_per_token(TINY, tp=2) == 2 * (96 + (64 + 128 + 8) / 2) + final
    # eager attention keeps a S (4 + b) more per token per layer
    eager = memory_model.activation_bytes_per_token(TINY, attention="eager", longest=10)
    assert eager == 2 * (layer + 2 * 10 * 6) + final
    assert memory_model.dense_mask_bytes(TINY, 25, 10) == 3 * 100 * (1 + 2 * 2)
    # megatron's MLP keeps one more b F (5 b F = 160); fused (Liger): 3 b F = 96 in both learners, and the torch
    # learner's fused norms keep their bf16 input, not an fp32 copy: 2 (2 + 2) 8 = 64
    assert memory_model.activation_bytes_per_token(TINY, megatron=True) == 2 * (layer + 32) + final
    assert memory_model.activation_bytes_per_token(TINY, fused=True) == 2 * (64 + 64 + 96 + 8) + final
    assert memory_model.activation_bytes_per_token(TINY, fused=True, megatron=True) == 2 * (layer - 32) + final
    assert memory_model.activation_bytes_per_token(TINY, recompute="selective", megatron=True) == (
        2 * (layer - 128) + 160 + final)  # its MLP is what selective recomputes


def test_sequence_parallel_divides_what_lies_between_the_tensor_parallel_regions():
    # TP=2 with sequence parallelism: the norms' 96 / 2 as well; the final norm's 48 / 2 plus the gathered b H = 16
    # the LM head keeps; full recompute's saved layer inputs L b H = 32 / 2
    layer, final = 96 / 2 + (64 + 128 + 8) / 2, 48 / 2 + 16
    assert memory_model.activation_bytes_per_token(TINY, tp=2, sequence_parallel=True) == 2 * layer + final
    assert memory_model.activation_bytes_per_token(TINY, tp=2, sequence_parallel=True, recompute="full") == (
        32 / 2 + layer + final)
    # at tp = 1 it changes nothing
    assert memory_model.activation_bytes_per_token(TINY, sequence_parallel=True) == (
        memory_model.activation_bytes_per_token(TINY))
    # the key: megatron at tp_size > 1 only (the torch learner has no tensor parallelism)
    def of(*over):
        return memory_model.sequence_parallel_of(load_config(None, list(over)))
    assert of("learner.backend=megatron", "learner.tp_size=2")
    assert not of("learner.backend=megatron", "learner.tp_size=2", "learner.sequence_parallel=false")
    assert not of("learner.backend=megatron") and not of("learner.tp_size=2")


def test_a_megatron_micro_batch_that_does_not_fit_names_sequence_parallelism(tmp_path):
    """At learner.tp_size > 1 without sequence parallelism the refusal says to turn it on, and with it on the same
    micro-batch counts fewer bytes per token (the norms and the residual stream split over the TP ranks)."""
    over = ("learner.backend=megatron", "learner.tp_size=2", "learner.max_tokens_per_micro_batch=200000")
    off = qwen_cfg(tmp_path, *over, "learner.sequence_parallel=false")
    on = qwen_cfg(tmp_path, *over)
    with pytest.raises(ValueError, match=r"cannot fit in the learner: .* set model.gradient_checkpointing=true, "
                                         r"set learner.sequence_parallel=true or use a larger device$"):
        preflight.check_memory(off, available=40 * GiB)
    with pytest.raises(ValueError, match="cannot fit") as e:
        preflight.check_memory(on, available=40 * GiB)
    assert "learner.sequence_parallel" not in str(e.value)
    assert memory_model.learner_memory(on)["per_token"] < 0.95 * memory_model.learner_memory(off)["per_token"]


def test_fused_layers_in_the_memory_model_follow_the_key():
    on, off, auto = (load_config(None, [f"learner.fused_layers={m}"]) for m in ("on", "off", "auto"))
    assert memory_model.fused_layers_of(on) and not memory_model.fused_layers_of(off)
    assert not memory_model.fused_layers_of(auto, "cpu")  # auto: a CUDA GPU here and liger-kernel
    assert memory_model.fused_layers_of(auto, "cuda") == (
        __import__("torch").cuda.is_available() and __import__("importlib").util.find_spec("liger_kernel") is not None)
    assert (memory_model.learner_memory(on, TINY, tokens=1000)["activations"]
            < memory_model.learner_memory(off, TINY, tokens=1000)["activations"])


def test_update_flops_by_hand_and_against_the_model():
    # P_layers = 2 (8 (8 + 2*4) + 8*8 + 3*8*16) = 1152
    assert flops.layer_params(TINY) == 1152
    f = flops.update_flops(TINY, [3, 5], head_tokens=4)
    assert f == {"dense": 6 * 1152 * 8, "head": 6 * 100 * 8 * 4, "attention": 6 * 2 * 8 * (9 + 25),
                 "total": 6 * 1152 * 8 + 6 * 100 * 8 * 4 + 6 * 2 * 8 * 34}
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = AutoConfig.for_model(**{**QWEN05, "vocab_size": 1000})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    matmul = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    assert flops.layer_params(flops.shape_of(hf)) == matmul
    # the head is counted apart from the embedding where the config unties them (the memory check's count;
    # at Qwen2.5-0.5B's shape the head is 14% of the parameters, so the bound tells the two apart)
    with torch.device("meta"):
        for tie in (True, False):
            config = AutoConfig.for_model(**QWEN05, tie_word_embeddings=tie)
            params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
            assert flops.shape_of(config)["tied"] is tie
            assert 0.997 * params < memory_model.model_params(flops.shape_of(config)) <= params, tie
    assert flops.peak_flops("NVIDIA H100 80GB HBM3") == 989e12 and flops.peak_flops("NVIDIA H100 PCIe") == 756e12
    assert flops.peak_flops("NVIDIA H200") == 989e12 and flops.peak_flops("cpu") is None
    assert flops.mfu(989e12, 2.0, 989e12) == 0.5 and flops.mfu(1.0, 1.0, None) is None


def qwen_cfg(tmp_path, *overrides):
    folder = tmp_path / "q05"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(QWEN05))
    return load_config(None, [f"model.path={folder}", "data.dataset=math500", "model.dtype=bfloat16", "rollout.n=8",
                              "rollout.max_new_tokens=4096", *overrides])


def test_learner_memory_breakdown_by_hand(tmp_path, capsys):
    cfg = qwen_cfg(tmp_path, "learner.max_tokens_per_micro_batch=16384", "learner.master_weights=false")
    shape = memory_model.model_shape(cfg)
    mem = memory_model.learner_memory(cfg, device="cuda")
    P = memory_model.model_params(shape)
    w = P * 2
    per = memory_model.activation_bytes_per_token(shape)
    ws = (512 << 20) + 12 * -(-151936 // 128) * 16384 + 2 * 16384 * 896 * 2
    tied = 0  # QWEN05 as written has an untied head (transformers' default); the tied model's is below
    backward = 4 * w + int(16384 * per) + ws + tied
    assert mem == {"weights": w, "gradients": w, "optimizer": 2 * w, "activations": int(16384 * per),
                   "tokens": 16384, "per_token": per, "workspace": ws, "tied_gradient": tied,
                   "optimizer_step": w,  # a GPU's foreach AdamW: a sqrt copy of every moment at once
                   "reference": 0,  # (algo.ref=rollout: no second copy)
                   "backward": backward, "step": 4 * w + w, "total": max(backward, 5 * w)}
    # on the CPU the per-tensor step makes two copies of the largest tensor (the [V, H] embedding)
    assert memory_model.learner_memory(cfg, device="cpu")["optimizer_step"] == 2 * 151936 * 896 * 2
    # fp32 master weights (the default): bf16 weights + fp32 masters, fp32 gradients and moments (18 bytes a
    # parameter), AdamW's temporaries in fp32
    cfg = qwen_cfg(tmp_path, "learner.max_tokens_per_micro_batch=16384")
    mem = memory_model.learner_memory(cfg, device="cuda")
    backward = 18 * P + int(16384 * per) + ws + tied
    assert mem == {"weights": 6 * P, "gradients": 4 * P, "optimizer": 8 * P, "activations": int(16384 * per),
                   "tokens": 16384, "per_token": per, "workspace": ws, "tied_gradient": tied, "optimizer_step": 4 * P,
                   "reference": 0, "backward": backward, "step": 22 * P, "total": max(backward, 22 * P)}
    assert memory_model.learner_memory(cfg, device="cpu")["optimizer_step"] == 2 * 151936 * 896 * 4
    # a head tied to the embedding (Qwen2.5-0.5B's): the lookup's dense [V, H] gradient, alive while it is added
    # into the head's at the end of the backward (measured on the CPU: bench/bench_learner_memory.py)
    (tmp_path / "tied").mkdir()
    (tmp_path / "tied" / "config.json").write_text(json.dumps({**QWEN05, "tie_word_embeddings": True}))
    tied_cfg = load_config(None, [f"model.path={tmp_path / 'tied'}", "model.dtype=bfloat16",
                                  "learner.max_tokens_per_micro_batch=16384"])
    tied_mem = memory_model.learner_memory(tied_cfg)
    assert tied_mem["tied_gradient"] == 151936 * 896 * 2  # (the lookup's bf16 gradient, before it reaches a master)
    assert tied_mem["backward"] == tied_mem["weights"] + tied_mem["gradients"] + tied_mem["optimizer"] + \
        tied_mem["activations"] + tied_mem["workspace"] + 151936 * 896 * 2
    preflight.print_learner_memory(cfg, available=80 * GiB)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("learner memory per process") and [x.split()[0] for x in out[1:]] == [
        "weights", "gradients", "optimizer", "reference", "activations", "workspace", "tied_gradient",
        "optimizer_step", "total"]
    # no budget: learner.micro_batch_prompts=32 groups x 8 rows x (512 + 4096) tokens; the shared prefix runs once
    nob = qwen_cfg(tmp_path, "learner.packing=on")
    assert memory_model.learner_memory(nob)["tokens"] == 32 * 8 * 4608
    assert memory_model.group_tokens(qwen_cfg(tmp_path)) == 512 + 8 * 4096


def test_a_micro_batch_that_cannot_fit_is_refused_and_one_that_can_passes(tmp_path):
    # learner.split_groups=off: a micro-batch must hold a group (the default, auto, is checked further down)
    big = qwen_cfg(tmp_path, "learner.max_tokens_per_micro_batch=200000", "learner.split_groups=off")
    with pytest.raises(ValueError, match=r"^learner.max_tokens_per_micro_batch=200000 cannot fit in the learner: "
                                         r"with model.gradient_checkpointing=false, 1\d{3} KiB of activations per "
                                         r"token x 200,000 tokens = 2\d\d\.\d GiB .* lower the budget to at most "
                                         r"[\d,]+ tokens \(it must still hold a group: rollout.n=8 x \(the longest "
                                         r"prompt \+ rollout.max_new_tokens=4096\)\), set model.gradient_checkpointing="
                                         r"true or use a larger device$") as e:
        preflight.check_memory(big, available=80 * GiB)
    # the budget it names is the largest that fits (a sweep: "lower the budget" named no number, and 300,000 after
    # 400,000 failed the same way)
    most = int(re.search(r"at most ([\d,]+) tokens", str(e.value)).group(1).replace(",", ""))
    preflight.check_memory(qwen_cfg(tmp_path, f"learner.max_tokens_per_micro_batch={most}"), available=80 * GiB)
    with pytest.raises(ValueError, match="cannot fit in the learner"):
        preflight.check_memory(qwen_cfg(tmp_path, f"learner.max_tokens_per_micro_batch={most + 1}"),
                               available=80 * GiB)
    # where not even the least group fits, no lower budget is offered (and the sentence reads right without advice)
    with pytest.raises(ValueError, match=r"available; set model.gradient_checkpointing=true or use a larger device "
                                         r"\(a lower budget cannot help: it must hold a group, rollout.n=8 x \(the "
                                         r"longest prompt \+ rollout.max_new_tokens=4096\) >= 32,776 tokens\)$"):
        preflight.check_memory(big, available=36 * GiB)
    tiny = qwen_cfg(tmp_path, "learner.max_tokens_per_micro_batch=6000000", "model.gradient_checkpointing=true",
                    "rollout.engine=vllm", "learner.split_groups=off")  # full recompute: nothing but the device
    with pytest.raises(ValueError, match=r"available; use a larger device \(a lower budget cannot help"):
        preflight.check_memory(tiny, available=12 * GiB)
    preflight.check_memory(qwen_cfg(tmp_path, "learner.max_tokens_per_micro_batch=32768"), available=80 * GiB)
    preflight.check_memory(qwen_cfg(tmp_path, "learner.max_tokens_per_micro_batch=200000",
                                    "model.gradient_checkpointing=true"), available=80 * GiB)
    # selective recompute keeps more than full (the attention's activations): 200k tokens do not fit; the advice
    # is the full granularity, and with full there is no recompute left to advise
    sel = qwen_cfg(tmp_path, "learner.max_tokens_per_micro_batch=600000", "model.gradient_checkpointing=true",
                   "model.recompute_granularity=selective")
    with pytest.raises(ValueError, match=r"with model.gradient_checkpointing=true, model.recompute_granularity="
                                         r"selective, \d+ KiB .* set model.recompute_granularity=full or use a "
                                         r"larger device$"):
        preflight.check_memory(sel, available=80 * GiB)
    full = qwen_cfg(tmp_path, "learner.max_tokens_per_micro_batch=6000000", "model.gradient_checkpointing=true")
    with pytest.raises(ValueError, match=r"recompute_granularity=full, \d+ KiB .* lower the budget to at most "
                                         r"[\d,]+ tokens \(.*\) or use a larger device$"):
        preflight.check_memory(full, available=80 * GiB)
    per = {g: memory_model.learner_memory(qwen_cfg(tmp_path, "model.gradient_checkpointing=true",
                                                   f"model.recompute_granularity={g}"))["per_token"]
           for g in ("full", "selective")}
    none = memory_model.learner_memory(qwen_cfg(tmp_path))["per_token"]
    assert per["full"] < per["selective"] < 0.5 * none  # (Qwen2.5-0.5B: the MLP is 70% of a layer's bytes)
    # no budget: a single group of full-length rows is the floor
    group = qwen_cfg(tmp_path, "rollout.n=64", "rollout.max_new_tokens=16384", "learner.packing=on",
                     "rollout.engine=vllm")
    with pytest.raises(ValueError, match=r"^one group of rollout.n=64 full-length rows .*1,081,344 tokens") as e:
        preflight.check_memory(group, available=80 * GiB)
    # ... unless a budget under one group trains it a few rows at a time (learner.split_groups=auto, the default),
    # as with a budget where not even a group fits: the largest budget that fits, down to one row
    for cfg in (group, qwen_cfg(tmp_path, "learner.max_tokens_per_micro_batch=200000")):
        with pytest.raises(ValueError, match=r"(set learner.max_tokens_per_micro_batch|lower the budget) to at most "
                                             r"[\d,]+ tokens \(a group larger than it trains a few rows at a time, "
                                             r"one more forward of its rows; it must still hold one row: the longest "
                                             r"prompt \+ rollout.max_new_tokens=\d+\)") as e:
            preflight.check_memory(cfg, available=36 * GiB)
        most = int(re.search(r"at most ([\d,]+) tokens", str(e.value)).group(1).replace(",", ""))
        assert 4097 <= most < 8 * 4097
        fits = qwen_cfg(tmp_path, *(o for o in ("rollout.n=64", "rollout.max_new_tokens=16384", "learner.packing=on",
                                                "rollout.engine=vllm") if cfg is group),
                        f"learner.max_tokens_per_micro_batch={most}")
        preflight.check_memory(fits, available=36 * GiB)
    nob = qwen_cfg(tmp_path)  # one group fits; 32 of them may not: a warning line, not a refusal
    preflight.check_memory(nob, available=80 * GiB)
    (line,) = preflight.memory_warnings(nob, available=80 * GiB)
    assert "set learner.max_tokens_per_micro_batch (about" in line
    assert preflight.memory_warnings(qwen_cfg(tmp_path, "learner.max_tokens_per_micro_batch=32768"),
                                     available=80 * GiB) == []
    # a budget past the whole mini-batch is never filled: a run of 2 x 128 tokens a step with a budget of
    # 3,000,000 was refused as "31.5 GiB" (long-response sweep, 2026-11-28)
    small = ["train.prompts_per_step=1", "learner.mini_batch_prompts=1", "learner.micro_batch_prompts=1",
             "rollout.n=2", "rollout.max_new_tokens=64", "data.max_prompt_tokens=64"]
    huge = qwen_cfg(tmp_path, *small, "learner.max_tokens_per_micro_batch=3000000")
    assert memory_model.largest_micro_batch(huge) == 64 + 2 * 64  # the shared prefix once, then each response
    preflight.check_memory(huge, available=80 * GiB)


def test_megatrons_dense_mask_counts_its_scores_and_its_padded_rows_do_not(tmp_path):
    """The megatron learner's dense-mask packed forward (learner.packed_attention=dense) runs its local
    DotProductAttention, which keeps [b, heads, S, S] scores for the backward (review of 2026-11-29: the model
    counted no S term); its THD rows and, since 2026-12-04, its padded rows (learner.packing=off: the causal
    kernel of core_attention.py) keep none, as the torch learner's SDPA."""
    base = ["learner.backend=megatron", "model.dtype=bfloat16"]
    thd = memory_model.learner_memory(qwen_cfg(tmp_path, *base))["per_token"]
    S = 512 + 4096  # data.max_prompt_tokens + rollout.max_new_tokens of qwen_cfg
    dense = memory_model.learner_memory(qwen_cfg(tmp_path, *base, "learner.packed_attention=dense"))["per_token"]
    assert dense - thd == pytest.approx(24 * 14 * S * (4 + 2))  # L a S (4 + b) per token
    padded = memory_model.learner_memory(qwen_cfg(tmp_path, *base, "learner.packing=off"))["per_token"]
    assert padded == thd
    torch_padded = memory_model.learner_memory(qwen_cfg(tmp_path, "model.dtype=bfloat16", "learner.packing=off"))
    assert torch_padded["per_token"] < thd + 1  # (the torch learner's SDPA keeps no scores)


def test_the_built_in_model_is_counted_in_model_dtype():
    """The built-in tiny model loads in ``model.dtype`` like any other: its estimate counted 4 bytes a parameter
    whatever the dtype (bf16 with masters said 16 bytes a parameter instead of 18, without them 16 instead of 8;
    sweep of 2026-11-29)."""
    big = ["model.tiny_hidden_size=2048", "model.tiny_num_layers=16"]
    n = memory_model.model_params(memory_model.model_shape(load_config(None, big)))
    per = {}
    for extra in (["model.dtype=float32"], ["model.dtype=bfloat16"],
                  ["model.dtype=bfloat16", "learner.master_weights=false"]):
        cfg = load_config(None, big + extra)
        assert memory_model.model_shape(cfg)["bytes"] == (4 if "float32" in extra[0] else 2)
        per[" ".join(extra)] = memory_model.learner_bytes(cfg, memory_model.model_shape(cfg)) / n
    assert per == {"model.dtype=float32": 16, "model.dtype=bfloat16": 18,
                   "model.dtype=bfloat16 learner.master_weights=false": 8}


def test_on_the_cpu_the_processes_of_a_host_share_its_memory(tmp_path, monkeypatch):
    """torchrun's ranks on one CPU host each hold a learner: the check compared one process's need with the
    whole host's memory (megatron TP=2: 2 x 13.7 GiB accepted against 17.4 GiB; sweep of 2026-11-28)."""
    cfg = qwen_cfg(tmp_path, "model.device=cpu", "model.dtype=float32", "learner.max_tokens_per_micro_batch=4096",
                   "rollout.engine=vllm", "learner.backend=megatron")  # (the HF engine's decode is not checked here)
    monkeypatch.setenv("WORLD_SIZE", "2")
    need = memory_model.learner_memory(cfg, device="cpu")["total"]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    preflight.check_memory(cfg, available=int(1.5 * need))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="are available to each of the 2 learner processes that share this host's"):
        preflight.check_memory(cfg, available=int(1.5 * need))
    gpu = qwen_cfg(tmp_path, "model.device=cuda", "learner.max_tokens_per_micro_batch=4096", "rollout.engine=vllm",
                   "rollout.ranks=1")  # a rank's own GPU
    preflight.check_memory(gpu, available=int(1.5 * memory_model.learner_memory(gpu)["total"]))


def test_a_data_parallel_rank_plans_for_its_share_and_an_async_launch_for_its_learners(tmp_path, monkeypatch):
    """Review of 2026-11-28: megatron's data-parallel ranks each train their share of a mini-batch (local batches),
    so a budget past a rank's share is never filled (the whole mini-batch's 294,912 tokens were held against the
    device at DP=2); ZeRO splits the moments over the ranks instead of removing them (and with one rank shards
    nothing); an asynchronous launch's engine ranks are not learner processes sharing the host."""
    ckpt = ["learner.backend=megatron", "model.gradient_checkpointing=true", "train.prompts_per_step=8",
            "learner.mini_batch_prompts=8", "learner.micro_batch_prompts=8", "rollout.engine=vllm"]
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = qwen_cfg(tmp_path, *ckpt, "learner.max_tokens_per_micro_batch=1000000")
    assert memory_model.learner_layout(cfg) == (2, 1)
    group = 8 * (512 + 4096)  # megatron runs no shared prefix
    assert memory_model.largest_micro_batch(cfg) == 4 * group  # a rank's 4 of the 8 groups
    assert memory_model.largest_micro_batch(qwen_cfg(tmp_path, *ckpt)) == 4 * group  # micro_batch_prompts=8 > 4
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert memory_model.largest_micro_batch(cfg) == 8 * group
    g = memory_model.learner_memory(cfg)["gradients"]  # (fp32: the masters' gradients)
    one = memory_model.learner_memory(qwen_cfg(tmp_path, *ckpt, "learner.distributed_optimizer=true"))
    assert one["optimizer"] == 2 * g and one["optimizer_step"] == g  # one rank: nothing to shard
    monkeypatch.setenv("WORLD_SIZE", "4")
    four = memory_model.learner_memory(qwen_cfg(tmp_path, *ckpt, "learner.distributed_optimizer=true"))
    assert four["optimizer"] == 2 * g // 4 and four["optimizer_step"] == g // 4
    # an asynchronous launch on one CPU host: 2 engine ranks and 1 learner; only the learner counts
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    async_cfg = qwen_cfg(tmp_path, *ckpt, "rollout.ranks=2", "model.device=cpu")
    assert memory_model.learner_layout(async_cfg) == (1, 1)
    torch_cfg = qwen_cfg(tmp_path, "model.device=cpu", "rollout.ranks=2", "rollout.engine=vllm")
    assert memory_model.learner_layout(torch_cfg) == (1, 1)  # the torch learner is one process


def test_forward_counts_add_up_over_the_data_parallel_groups(monkeypatch):
    """``learner/forward/*`` are this rank's forwards and token slots: a step's record sums them over the groups,
    as one process running the whole step would count them (they were averaged; review of 2026-11-28)."""
    from pacs_fast.trainer.parallel import World

    world = World(dp=2, size=2)
    parts = [{"learner/forward/padded": 2.0, "learner/forward/token_slots": 160.0, "learner/loss": 1.0},
             {"learner/forward/padded": 2.0, "learner/forward/token_slots": 120.0, "learner/loss": 3.0}]
    monkeypatch.setattr(world, "gather_dp", lambda record: parts)
    out = world.reduce_record(dict(parts[0]))
    assert out == {"learner/forward/padded": 4.0, "learner/forward/token_slots": 280.0, "learner/loss": 2.0}


def test_a_fixed_reference_model_is_counted():
    """algo.ref=fixed (PACS) and a baseline's KL keep a second copy of the weights (the torch learner deep-copies
    the model); the estimate had no term for it (a LoRA sweep, 2026-11-30: 0.62 GiB missing of 4.78)."""
    shape = memory_model.model_shape(load_config(None, []))
    plain = memory_model.learner_memory(load_config(None, []), shape, tokens=256, device="cpu")
    for extra in (["algo.ref=fixed"], ["algo.name=grpo", "algo.kl_coef=0.01"]):
        mem = memory_model.learner_memory(load_config(None, extra), shape, tokens=256, device="cpu")
        assert mem["reference"] == memory_model.model_params(shape) * shape["bytes"] > 0
        assert mem["total"] == plain["total"] + mem["reference"]
    assert plain["reference"] == 0

def test_auto_packed_attention_counts_the_dense_mask_where_varlen_cannot_run(tmp_path):
    """``learner.packed_attention=auto`` packs a model whose exact attention varlen is not (another family, attention
    dropout) with the dense block-diagonal mask (pacs_fast/learner/packing.py), as ``dense`` does: the memory
    check counts that mask for both (sweep of 2026-12-02: it counted none under auto, ~30 GiB at two 16k-token rows
    on a 28-layer model in bf16: a budget that could not fit passed); a model varlen runs, flash attention and
    ``learner.packing=off`` count none (a sliding-window model packs nothing: tests/test_sliding_window_forwards.py)."""
    sliding = {**QWEN05, "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 0}
    for name, config in (("sw", sliding), ("other", {**QWEN05, "model_type": "helium"}),
                         ("dropout", {**QWEN05, "attention_dropout": 0.1})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    budget = "learner.max_tokens_per_micro_batch=34000"

    def activations(folder, *overrides):
        cfg = load_config(None, [f"model.path={folder}", "data.dataset=math500", "model.dtype=bfloat16",
                                 "rollout.n=2", "rollout.max_new_tokens=16384", budget, *overrides])
        return memory_model.learner_memory(cfg)["activations"]

    S = 512 + 16384  # data.max_prompt_tokens + rollout.max_new_tokens
    mask = memory_model.dense_mask_bytes({"layers": 24, "bytes": 2}, 34000, S)
    assert mask > 20 * GiB
    qwen = tmp_path / "q05"
    qwen_cfg(tmp_path)  # (writes the folder)
    plain = activations(qwen)
    assert activations(qwen, "learner.packed_attention=dense") == plain + mask
    for folder in (tmp_path / "other", tmp_path / "dropout"):
        assert activations(folder) == plain + mask, folder.name  # auto: the dense mask
        assert activations(folder, "learner.packed_attention=dense") == plain + mask, folder.name
        assert activations(folder, "learner.packing=off") == plain, folder.name
    with pytest.raises(ValueError, match="learner.packed_attention=varlen cannot run .*sliding-window"):
        preflight.check_packed_attention(load_config(None, [f"model.path={tmp_path / 'sw'}", "data.dataset=math500",
                                                            "learner.packed_attention=varlen"]))
    preflight.check_packed_attention(load_config(None, [f"model.path={qwen}", "data.dataset=math500",
                                                        "learner.packed_attention=varlen"]))
    # a budget whose dense mask cannot fit is refused under auto as under dense, naming the budget
    def run(folder):
        return load_config(None, [f"model.path={folder}", "data.dataset=math500", "model.dtype=bfloat16", "rollout.n=2",
                                  "rollout.max_new_tokens=16384", budget, "train.prompts_per_step=1",
                                  "data.eval_size=1", "rollout.eval_n=1"])
    with pytest.raises(ValueError, match="learner.max_tokens_per_micro_batch=34000 cannot fit"):
        preflight.check_memory(run(tmp_path / "other"), available=70 * GiB)
    preflight.check_memory(run(qwen), available=70 * GiB)


def test_the_torch_log_prob_path_is_counted_on_a_gpu_with_a_third_tile_for_a_soft_capped_model(tmp_path):
    """``learner.logprob_backend=torch`` on a GPU: two 64 MiB logits tiles (three for a soft-capped model, Gemma 2's
    ``final_logit_softcapping``, 30 by its class's default where config.json omits it: the backward keeps the cap's
    ``z / c``), an fp32 ``[V, H]`` gradient accumulator for the bf16 head and fp32 copies of the hidden states and
    their gradient, not the Triton kernels' 512 MiB ``dz`` chunk and partials (the accumulator alone is 1.8 GiB at
    Gemma 2 2B's V = 256,000, H = 2,304: it was not counted). The Triton kernels cap too: their workspace is the same
    for a capped model."""
    gemma = {"vocab_size": 256000, "hidden_size": 2304, "num_hidden_layers": 26, "num_attention_heads": 8,
             "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 9216, "model_type": "gemma2"}
    budget = "learner.max_tokens_per_micro_batch=16384"
    triton_ws = (512 << 20) + 12 * -(-256000 // 128) * 16384 + 2 * 16384 * 2304 * 2
    for extra, tiles in (({}, 3), ({"final_logit_softcapping": None}, 2), ({"final_logit_softcapping": 5.0}, 3)):
        folder = tmp_path / f"gemma{len(extra)}{tiles}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**gemma, **extra}))
        for backend, want in (("torch", tiles * (64 << 20) + 256000 * 2304 * 4 + 2 * 16384 * 2304 * 4 +
                               2 * 16384 * 2304 * 2), ("auto", triton_ws)):
            cfg = load_config(None, [f"model.path={folder}", "model.dtype=bfloat16", budget,
                                     f"learner.logprob_backend={backend}"])
            assert memory_model.learner_memory(cfg, device="cuda")["workspace"] == want, (extra, backend)


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_update_flops_equal_torch_s_flop_counter_on_a_real_forward_and_backward(family):
    """The MFU numerator against an independent count: torch's FlopCounterMode over a Hugging Face model's forward
    and backward (eager attention, one sequence at a time, the head over every position). Dense layers and the head
    match exactly; the attention's matmuls are counted by torch over the whole s x s square, which the causal mask
    halves in :func:`flops.update_flops` (FlashAttention's count, what a causal kernel does): torch's is twice
    ours. A formula off by a factor (a forward-only count, a missing K/V projection, Hq for Hkv) fails here."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(family, vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=16, intermediate_size=176, tie_word_embeddings=False)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    lengths = [7, 12]
    counter = FlopCounterMode(display=False)
    with counter:
        for s in lengths:
            model(torch.randint(0, 300, (1, s))).logits.float().square().mean().backward()
    want = flops.update_flops(flops.shape_of(config), lengths)
    assert counter.get_total_flops() == want["dense"] + want["head"] + 2 * want["attention"], (
        counter.get_total_flops(), want)
