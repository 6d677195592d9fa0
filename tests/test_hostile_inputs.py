"""The smaller silent-wrong paths of issue 23 (finding 6): each bad input is one line naming the key,
file or line, before any model loads; a default does not force a second key; str keys take the text
as written."""
import gzip
import json
from pathlib import Path

import pytest

from pacs_fast.config import Config, load_config, validate
from pacs_fast.data.datasets import load_dataset
from pacs_fast.experiment import parse_seeds
from pacs_fast.trainer.memory_model import GiB, hf_engine_bytes, learner_bytes, model_params, model_shape
from pacs_fast.trainer.preflight import check_cpus, check_memory, check_tensor_parallel

ROOT = Path(__file__).resolve().parent.parent
QWEN = {"vocab_size": 151936, "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "model_type": "qwen2", "tie_word_embeddings": True}  # as Qwen2.5-0.5B's


def cli(args, capsys):
    from pacs_fast.train import main
    try:
        main(args)
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def qwen_folder(tmp_path, tokenizer=True) -> Path:
    folder = tmp_path / "qwen"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN))
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}")
    (folder / "pytorch_model.bin").write_bytes(b"")  # a weights file, present (not loadable: checks come first)
    return folder


def test_a_rollout_that_cannot_fit_is_refused_before_the_model_loads(tmp_path, capsys):
    folder = qwen_folder(tmp_path)  # no weights: loading the model would fail differently
    code, err = cli([f"model.path={folder}", "data.dataset=math500", "rollout.n=1024", "rollout.max_new_tokens=30000",
                     f"train.out_dir={tmp_path / 'runs'}"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: the HF rollout engine cannot fit: it decodes 1,024 rows at once (rollout.n and ") \
        and "lower rollout.n and " in err and ", data.max_prompt_tokens or rollout.max_new_tokens" in err, err
    # the key that drives the rows is the one named (it always said rollout.n: sweep of 2026-11-30)
    both = "train.prompts_per_step x rollout.n and data.eval_size x rollout.eval_n"  # 64 x 8 = 512 = 512 x 1
    for override, driver in (("rollout.eval_n=100000", "rollout.eval_n and data.eval_size x rollout.eval_n"),
                             ("data.max_prompt_tokens=100000", both)):
        with pytest.raises(ValueError, match=rf"\({driver}, at most 1,024 a chunk.* lower {driver}, data.max_prompt"):
            check_memory(load_config(None, [f"model.path={folder}", "data.dataset=math500", override,
                                            "rollout.max_new_tokens=8192"]))
    # greedy evaluation decodes one response a problem, whatever rollout.eval_n (it was counted eval_n times)
    check_memory(load_config(None, [f"model.path={folder}", "data.dataset=math500", "rollout.eval_n=100000",
                                    "rollout.eval_temperature=0"]))
    # a group of 10,000 rows is decoded 1,024 rows at a time (it was decoded whole: 24.3 GB of fp32 logits alone);
    # the learner's refusal of one such group comes next, before the model loads too
    cfg = load_config(None, [f"model.path={folder}", "data.dataset=math500", "rollout.n=10000"])
    assert hf_engine_bytes(cfg, model_shape(cfg)) == hf_engine_bytes(
        load_config(None, [f"model.path={folder}", "data.dataset=math500", "rollout.n=1024"]), model_shape(cfg))
    code, err = cli([f"model.path={folder}", "data.dataset=math500", "rollout.n=10000",
                     f"train.out_dir={tmp_path / 'runs'}"], capsys)
    assert code == 2 and err.startswith("error: one group of rollout.n=10000 full-length rows"), err
    # the KV cache holds each row's prompt too (it counted the response tokens only): 24 layers x 2 x 2 heads x 64
    longer = load_config(None, [f"model.path={folder}", "data.dataset=math500", "rollout.n=1024",
                                "data.max_prompt_tokens=1024"])
    cfg = load_config(None, [f"model.path={folder}", "data.dataset=math500", "rollout.n=1024"])
    grown = hf_engine_bytes(longer, model_shape(longer)) - hf_engine_bytes(cfg, model_shape(cfg))
    assert grown == 1024 * 24 * 2 * 2 * 64 * 512 * 4


def test_the_default_run_and_a_gpu_sized_run_pass_the_check(tmp_path):
    check_memory(Config())  # the built-in model, this machine
    folder = qwen_folder(tmp_path)
    cfg = load_config(None, [f"model.path={folder}", "data.dataset=math500", "rollout.n=8",
                             "train.prompts_per_step=128", "rollout.max_new_tokens=4096", "model.dtype=bfloat16"])
    check_memory(cfg, available=80 * GiB)  # an H100: 1024 rows decode in ~4 GiB of logits + KV
    with pytest.raises(ValueError, match="lower train.prompts_per_step x rollout.n"):
        check_memory(cfg, available=4 * GiB)  # the learner's 3.0 GiB (with fp32 master weights) fit, the decode
        # step does not
    for name in ("pacs_qwen2.5_7b_deepscaler", "pacs_qwen2.5_3b_deepscaler"):
        paper = load_config(ROOT / "configs" / f"{name}.yaml")
        check_memory(paper, available=80 * GiB)  # vLLM: its memory is vLLM's own


QWEN7B = {"vocab_size": 152064, "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
          "num_key_value_heads": 4, "intermediate_size": 18944, "model_type": "qwen2"}


LLAMA8B = {"vocab_size": 128256, "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "model_type": "llama", "tie_word_embeddings": False}


@pytest.mark.parametrize("config", [QWEN7B, LLAMA8B, {**QWEN, "intermediate_size": 4864, "tie_word_embeddings": True},
                                    {**QWEN7B, "model_type": "not-a-model-type"}], ids=["qwen7b_default_untied",
                                    "llama8b_untied", "qwen0.5b_tied", "unknown_type"])
def test_the_parameter_count_is_a_tight_lower_bound(tmp_path, config):
    """Counted from config.json as the memory check counts them, against transformers' own model (on
    the meta device): never more, and within 0.3% (biases and norms). An untied LM head counts twice
    the embedding: Qwen2.5-7B's config.json leaves tie_word_embeddings to Qwen2Config's default
    (False), Llama-3.1-8B's says false; the count was 7.07B for a 7.62B model before. A model_type
    transformers does not know counts the head once (a lower bound)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    counted = model_params(model_shape(load_config(None, [f"model.path={folder}", "data.dataset=math500"])))
    known = {**config, "model_type": "qwen2"}
    with torch.device("meta"):
        true = sum(p.numel() for p in AutoModelForCausalLM.from_config(AutoConfig.for_model(**known)).parameters())
    if config["model_type"] == "not-a-model-type":  # the untied head counted once: a lower bound
        counted += known["vocab_size"] * known["hidden_size"]
    assert true * 0.997 < counted <= true, (counted, true)


def test_a_learner_that_cannot_fit_is_refused_before_the_model_loads(tmp_path, capsys):
    """A model whose weights, gradients and AdamW moments alone exceed the device is one line: the
    built-in model with 100,000 layers (it took 20 GB and was still building when stopped), and a
    Qwen2.5-7B-shaped model in fp32 on an 80 GiB GPU (7.62e9 x 16 bytes = 113 GiB), or in bf16 with fp32 master
    weights (18 bytes a parameter: 128 GiB; without them 8 bytes, 57 GiB, fit)."""
    code, err = cli(["model.tiny_num_layers=100000", f"train.out_dir={tmp_path / 'runs'}"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: the built-in tiny model (model.tiny_hidden_size=128, model.tiny_num_layers=100000) "
                          "cannot be trained here"), err
    folder = tmp_path / "q7"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN7B))
    fp32 = load_config(None, [f"model.path={folder}", "data.dataset=math500"])
    with pytest.raises(ValueError, match=r"need at least 113\.\d GiB per learner process"):
        check_memory(fp32, available=80 * GiB)
    bf16 = load_config(None, [f"model.path={folder}", "data.dataset=math500", "model.dtype=bfloat16",
                              "rollout.n=8", "train.prompts_per_step=8"])
    with pytest.raises(ValueError, match=r"in model.dtype=bfloat16 with fp32 master weights \(18 bytes a parameter\) "
                                         r"need at least 127\.\d GiB per learner process .*; use learner.master_"
                                         r"weights=false, which needs 8 bytes a parameter, 56\.\d GiB .*, learner."
                                         r"backend=megatron with learner.tp_size > 1 or a larger device$"):
        check_memory(bf16, available=80 * GiB)
    # where pure bf16 would not fit either, it is not offered (sweep of 2026-11-29: 57 GiB against 22.5)
    with pytest.raises(ValueError, match=r"are available; use learner.backend=megatron with learner.tp_size > 1 "
                                         r"or a larger device$"):
        check_memory(bf16, available=int(22.5 * GiB))
    assert learner_bytes(bf16, model_shape(bf16)) == 18 * model_params(model_shape(bf16))
    pure = load_config(None, [f"model.path={folder}", "data.dataset=math500", "model.dtype=bfloat16",
                              "rollout.n=8", "train.prompts_per_step=8", "learner.master_weights=false"])
    check_memory(pure, available=80 * GiB)  # 57 GiB of weights, gradients and moments
    assert learner_bytes(pure, model_shape(pure)) == 4 * 2 * model_params(model_shape(pure))
    paper = load_config(ROOT / "configs" / "pacs_qwen2.5_7b_deepscaler.yaml", [f"model.path={folder}"])
    assert learner_bytes(paper, model_shape(paper)) == learner_bytes(bf16, model_shape(bf16)) // 4  # tp_size=4
    check_memory(paper, available=80 * GiB)


def test_a_tensor_parallel_size_megatron_cannot_shard_is_refused_before_the_model_loads(tmp_path):
    """It used to pass validation, warm up, and fail in megatron's model build with a traceback."""
    folder = qwen_folder(tmp_path)  # Qwen2.5-0.5B: 14 heads, 2 key/value heads
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 4864}))
    mega = ["learner.backend=megatron", f"model.path={folder}"]
    check_tensor_parallel(load_config(None, mega + ["learner.tp_size=2"]))  # 14, 2 and 4864 split in two
    with pytest.raises(ValueError, match=r"^learner.tp_size=4 cannot shard model.path=.*: num_attention_heads=14, "
                                         r"num_key_value_heads=2 are not a multiple of 4$"):
        check_tensor_parallel(load_config(None, mega + ["learner.tp_size=4"]))
    check_tensor_parallel(load_config(None, ["learner.tp_size=4", f"model.path={folder}"]))  # the torch learner
    # the built-in tiny model: hidden 64 has 2 heads of 32 and 1 key/value head
    with pytest.raises(ValueError, match=r"tiny_hidden_size=64\): num_key_value_heads=1 is not a multiple of 2"):
        check_tensor_parallel(load_config(None, ["learner.backend=megatron", "learner.tp_size=2",
                                                 "model.tiny_hidden_size=64"]))
    check_tensor_parallel(load_config(None, ["learner.backend=megatron", "learner.tp_size=2"]))  # hidden 128
    # vLLM engines on their own processes (rollout.tp_size): 14 heads over 4 ranks cannot be split; 2 key/value
    # heads over 2 ranks can, and so can 1 over 2 (replicated)
    with pytest.raises(ValueError, match="rollout.tp_size=4 .* num_attention_heads=14"):
        check_tensor_parallel(load_config(None, [f"model.path={folder}", "rollout.tp_size=4"]))
    check_tensor_parallel(load_config(None, [f"model.path={folder}", "rollout.tp_size=2"]))
    check_tensor_parallel(load_config(None, ["model.tiny_hidden_size=64", "rollout.tp_size=2"]))


# small widths (the memory check comes first), the settings that matter as the real configs have them
SMALL = {"vocab_size": 1024, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 256}
LLAMA31 = {**SMALL, "model_type": "llama", "architectures": ["LlamaForCausalLM"], "max_position_embeddings": 131072,
           "rope_theta": 500000.0, "hidden_act": "silu",
           "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192}}


@pytest.mark.parametrize("change", ["llama3_rope_other_factors", "yarn_rope", "sliding_window", "attention_dropout"])
def test_a_model_megatron_cannot_build_is_refused_before_the_model_loads(tmp_path, capsys, change):
    """A Llama-3-style RoPE scaling with other frequency factors than Llama 3.1 / 3.2's (megatron builds only
    those; theirs trains: tests/test_megatron_tp.py), the YaRN block Qwen2.5's model cards add for long contexts,
    Qwen2's sliding windows: megatron's builder raised on every rank with a traceback, after the run folder was
    made. A config's attention dropout: megatron's model is built without dropout, so the run trained silently without it (the torch
    learner applies it; parity audit of 2026-12-03)."""
    from pacs_fast.trainer.preflight import check_megatron_model

    folder = qwen_folder(tmp_path)
    config = {**QWEN, **SMALL, "rope_theta": 1e6, "max_position_embeddings": 32768}
    other = {**LLAMA31, "rope_scaling": {**LLAMA31["rope_scaling"], "high_freq_factor": 2.0}}
    config = {"llama3_rope_other_factors": other,
              "sliding_window": {**config, "use_sliding_window": True, "sliding_window": 4096},
              "yarn_rope": {**config, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                       "original_max_position_embeddings": 32768}},
              "attention_dropout": {**config, "attention_dropout": 0.1}}[change]
    (folder / "config.json").write_text(json.dumps(config))
    runs = tmp_path / "runs"
    code, err = cli(["learner.backend=megatron", f"model.path={folder}", "data.dataset=math500",
                     f"train.out_dir={runs}"], capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"learner.backend=megatron cannot build model.path={folder}: hf_config" in err and \
        "learner.backend=torch trains it" in err, err
    if change == "attention_dropout":
        assert "hf_config has attention_dropout=0.1: the megatron learner trains without dropout" in err, err
    assert not runs.exists()  # nothing made
    check_megatron_model(load_config(None, [f"model.path={folder}"]))  # the torch learner takes it
    (folder / "config.json").write_text(json.dumps({**QWEN, **SMALL, "rope_theta": 1e6}))
    megatron = load_config(None, ["learner.backend=megatron", f"model.path={folder}"])
    # .bin weights alone: megatron reads safetensors (each rank's error once torchrun had started them, sweep of
    # 2026-12-03); the torch learner takes them
    with pytest.raises(ValueError, match=r"megatron cannot load model.path=.*: it has PyTorch .bin weights only"):
        check_megatron_model(megatron)
    import torch
    from safetensors.torch import save_file

    # safetensors, but neither model.safetensors nor its index (a consolidated.safetensors of another format): what
    # transformers and the learner do not read, refused in one line before torchrun starts a rank
    save_file({"x": torch.zeros(1)}, str(folder / "consolidated.safetensors"))
    with pytest.raises(ValueError, match=r"megatron cannot load model.path=.*: .* has neither model.safetensors nor "
                                         r"model.safetensors.index.json"):
        check_megatron_model(megatron)
    save_file({"x": torch.zeros(1)}, str(folder / "model.safetensors"))
    check_megatron_model(megatron)
    (folder / "config.json").write_text(json.dumps(LLAMA31))  # Llama 3.1's own RoPE scaling: megatron builds it
    check_megatron_model(megatron)


def test_the_megatron_learner_refuses_a_checkpoint_with_dropout(tmp_path):
    """The learner's own check (its API, without the command line's preflight): before any process group or model,
    so no launch is needed. It had built the model with dropout 0 and trained without a word."""
    pytest.importorskip("megatron.core")
    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.learner.megatron.learner import MegatronLearner

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**QWEN, **SMALL, "attention_dropout": 0.25}))
    with pytest.raises(ValueError, match=r"^hf_config has attention_dropout=0.25: the megatron learner trains "
                                         r"without dropout \(the torch learner applies it\)"):
        MegatronLearner(folder, algo=AlgoConfig(name="grpo"), learner=LearnerConfig(backend="megatron"))
    from pacs_fast.learner.megatron.model import check_no_dropout

    check_no_dropout({"attention_dropout": 0.0, "use_dropout": True})  # (0, and a flag that is not a probability)
    with pytest.raises(ValueError, match="embd_pdrop=0.1, resid_pdrop=0.2"):
        from transformers import PretrainedConfig
        check_no_dropout(PretrainedConfig(resid_pdrop=0.2, embd_pdrop=0.1))


def test_varlen_attention_a_model_cannot_take_is_refused_before_the_model_loads(tmp_path, capsys):
    """learner.packed_attention=varlen with a model whose attention it would not reproduce (here Qwen2's
    sliding windows) was refused at the first packed forward, after the model and the engine had loaded."""
    from pacs_fast.trainer.preflight import check_packed_attention

    folder = qwen_folder(tmp_path)
    (folder / "config.json").write_text(json.dumps({**QWEN, **SMALL, "use_sliding_window": True,
                                                    "sliding_window": 4096, "max_window_layers": 0}))
    runs = tmp_path / "runs"
    code, err = cli([f"model.path={folder}", "data.dataset=math500", "learner.packing=on",
                     "learner.packed_attention=varlen", f"train.out_dir={runs}"], capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"learner.packed_attention=varlen cannot run model.path={folder}: the model has sliding-window" in err, err
    assert not runs.exists()
    for ok in (["learner.packed_attention=auto"], ["learner.packing=off"], ["model.attention=flash_attention_2"]):
        check_packed_attention(load_config(None, [f"model.path={folder}", "learner.packing=on",
                                                  "learner.packed_attention=varlen", *ok]))  # (the last one wins)
    (folder / "config.json").write_text(json.dumps({**QWEN, **SMALL}))
    check_packed_attention(load_config(None, [f"model.path={folder}", "learner.packing=on",
                                              "learner.packed_attention=varlen"]))


@pytest.mark.parametrize("name,value", [("PACS_FAST_VARLEN_LONG", "4k"), ("PACS_FAST_VARLEN_LONG", "-1"),
                                        ("PACS_FAST_VARLEN_BACKEND", "flash")])
def test_a_bad_varlen_environment_variable_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch,
                                                                            name, value):
    """Both are read at the first packed forward, after the model and the engine have loaded."""
    folder = qwen_folder(tmp_path)
    monkeypatch.setenv(name, value)
    runs = tmp_path / "runs"
    code, err = cli([f"model.path={folder}", "data.dataset=math500", f"train.out_dir={runs}"], capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert name in err and repr(value) in err, err
    assert not runs.exists()


def test_a_model_folder_without_tokenizer_files(tmp_path, capsys):
    folder = qwen_folder(tmp_path, tokenizer=False)
    code, err = cli([f"model.path={folder}", "data.dataset=math500", f"train.out_dir={tmp_path / 'runs'}"], capsys)
    assert code == 2 and err.count("\n") == 1 and f"model.path '{folder}' has no tokenizer files" in err, err


def test_a_config_json_transformers_cannot_build_is_one_line(tmp_path, capsys):
    """num_hidden_layers 28 with 2 layer_types passed every check and stopped the run with transformers'
    StrictDataclassClassValidationError traceback when the model loaded (sweep of 2026-11-29); eval alike."""
    from pacs_fast.eval import main as eval_main

    folder = qwen_folder(tmp_path)
    (folder / "config.json").write_text(json.dumps({**QWEN, "num_hidden_layers": 28,
                                                    "layer_types": ["full_attention"] * 2}))
    code, err = cli([f"model.path={folder}", "data.dataset=math500", f"train.out_dir={tmp_path / 'runs'}"], capsys)
    want = (f"model.path '{folder}': {folder / 'config.json'} cannot be read by transformers: ")
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: " + want), err
    assert "`num_hidden_layers` (28) must be equal to the number of `layer_types` (2)" in err, err
    assert not (tmp_path / "runs").exists()
    code = eval_main(["--model", str(folder)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "cannot be read by transformers" in err, err


@pytest.mark.parametrize("patch, reason", [
    ({"num_attention_heads": 5, "num_key_value_heads": 5},
     "hidden_size=896 is not a multiple of num_attention_heads=5 (and no head_dim is given)"),
    ({"num_key_value_heads": 3}, "num_attention_heads=14 is not a multiple of num_key_value_heads=3"),
    ({"vocab_size": -5}, "vocab_size=-5: must be >= 1"),
])
def test_a_config_json_with_an_impossible_shape_is_one_line(tmp_path, capsys, patch, reason):
    """transformers builds these configs, then the run failed loading the weights with a reshape traceback and left
    a run folder that blocked its name (sweep of 2026-11-29)."""
    folder = qwen_folder(tmp_path)
    (folder / "config.json").write_text(json.dumps({**QWEN, **patch}))
    code, err = cli([f"model.path={folder}", "data.dataset=math500", f"train.out_dir={tmp_path / 'runs'}"], capsys)
    assert code == 2 and err.count("\n") == 1 and err.rstrip().endswith(f"{folder / 'config.json'}: {reason}"), err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("out_dir,match", [("/sys/pacs_fast_runs", "is not writable"),
                                           ("{tmp}/file.txt/runs", "is a file")])
def test_an_unwritable_out_dir_is_one_line(tmp_path, capsys, out_dir, match):
    (tmp_path / "file.txt").write_text("x")
    code, err = cli([f"train.out_dir={out_dir.format(tmp=tmp_path)}"], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: train.out_dir") and match in err, err


def test_dataset_errors_name_file_and_line(tmp_path):
    rows = [{"problem": "1+1", "answer": "2"}, {"problem": "2+2", "answer": 4.0}]
    good = "\n".join(json.dumps(r) for r in rows) + "\n"
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(good.encode() + b'{"problem": "caf\xe9", "answer": "1"}\n')
    with pytest.raises(ValueError, match=rf"{bad}:3: not UTF-8 text"):
        load_dataset(bad)
    gz = tmp_path / "bad.jsonl.gz"
    gz.write_bytes(gzip.compress(b'\n{"problem": "x\xff", "answer": "1"}\n'))
    with pytest.raises(ValueError, match=rf"{gz}:2: not UTF-8 text"):
        load_dataset(gz)
    js = tmp_path / "bad.json"
    js.write_bytes(b'[\n{"problem": "a", "answer": "1"},\n{"problem": "\xff", "answer": "1"}]')
    with pytest.raises(ValueError, match=rf"{js}:3: not UTF-8 text"):
        load_dataset(js)
    nan = tmp_path / "nan.jsonl"
    nan.write_text(good + '{"problem": "3+3", "answer": NaN}\n')
    with pytest.raises(ValueError, match=rf"{nan}:3: field 'answer' is not a finite number \(nan\)"):
        load_dataset(nan)
    (tmp_path / "good.jsonl").write_text(good)
    assert [p.answer for p in load_dataset(tmp_path / "good.jsonl")] == ["2", "4"]
    # a file that cannot be read at all (a copy cut short, a plain file named .gz, a damaged parquet): a
    # ValueError naming it, as a bad line is (they were EOFError / BadGzipFile tracebacks, or no file named)
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(good.encode())[:20])
    plain = tmp_path / "plain.jsonl.gz"
    plain.write_text(good)
    parquet = tmp_path / "bad.parquet"
    parquet.write_text("not parquet")
    for path, why in ((cut, "EOFError"), (plain, "BadGzipFile"), (parquet, "ArrowInvalid")):
        with pytest.raises(ValueError, match=rf"^{path}: cannot be read \({why}: "):
            load_dataset(path)


def test_a_new_run_that_fails_on_its_data_leaves_no_folder(tmp_path, capsys):
    """Its folder held only ``.run.lock`` (a folder per failed start under an automatic name)."""
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(b'{"problem": "1+1", "answer": "2"}\n')[:20])
    runs, model = tmp_path / "runs", qwen_folder(tmp_path)
    for name in ([], ["train.run_name=r"]):
        code, err = cli([f"data.dataset={cut}", f"model.path={model}", f"train.out_dir={runs}"] + name, capsys)
        assert code == 2 and err.startswith(f"error: {cut}: cannot be read (EOFError"), err
        assert list(runs.iterdir()) == []


def test_missing_field_names_the_trainers_keys(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"question": "1+1", "answer": "2"}) + "\n")
    from pacs_fast.trainer.problems import load_problems
    cfg = load_config(None, [f"data.dataset={data}", f"model.path={qwen_folder(tmp_path)}"])
    with pytest.raises(ValueError, match=r"missing field 'problem'.*choose the field with data.problem_key= / "
                                         r"data.answer_key="):
        load_problems(cfg)
    with pytest.raises(ValueError, match=r"choose the field with problem_field="):
        load_dataset(data)  # the library function names its own arguments


@pytest.mark.parametrize("text", ["5-", "0-200000", "-1", "4-2", "x", "1,1"])
def test_experiment_seeds_are_bounded_and_named(text):
    with pytest.raises(ValueError, match=r"^--seeds "):
        parse_seeds(text)


def test_prompts_per_step_alone_is_a_valid_run():
    for P, mini in ((4, 4), (64, 32), (48, 24), (7, 7)):
        cfg = load_config(None, [f"train.prompts_per_step={P}"])
        validate(cfg)
        assert cfg.learner.mini_batch_prompts == mini and cfg.learner.micro_batch_prompts == mini
    cfg = load_config(None, ["train.prompts_per_step=8", "learner.mini_batch_prompts=4"])
    assert (cfg.learner.mini_batch_prompts, cfg.learner.micro_batch_prompts) == (4, 4)
    with pytest.raises(ValueError, match="learner.mini_batch_prompts=32 must divide train.prompts_per_step=4"):
        validate(load_config(None, ["train.prompts_per_step=4", "learner.mini_batch_prompts=32"]))


@pytest.mark.parametrize("word", ["off", "no", "on", "yes", "true", "null", "1e3"])
def test_a_str_key_takes_the_text_as_written(word):
    cfg = load_config(None, [f"train.run_name={word}", "train.tensorboard=off", 'reward.step_split=" "'])
    assert cfg.train.run_name == word and cfg.train.tensorboard is False and cfg.reward.step_split == " "


@pytest.mark.parametrize("overrides, match", [
    (["data.arith_train_size=0"], r"^data.arith_train_size must be >= 1, got 0$"),
    (["data.arith_max_digits=1", "data.eval_size=100"],
     r"^data.eval_size=100 leaves no training problems: .* data.arith_max_digits=1, data.arith_ops='\+' and "
     r"data.arith_terms=2 has 100$"),
    (["data.arith_max_digits=1", "data.arith_ops=+-", "data.eval_size=200"], r"has 200$"),  # 2 operators
])
def test_the_built_in_task_sizes_name_their_keys(overrides, match):
    """They were the data module's own words ('train_size must be >= 1 ...'), without the key."""
    with pytest.raises(ValueError, match=match):
        validate(load_config(None, overrides))
    fewer = [o if not o.startswith("data.eval_size") else "data.eval_size=99" for o in overrides]
    if fewer != overrides:
        validate(load_config(None, fewer))  # one problem is left to train on


def test_more_threads_or_reward_workers_than_cpus_is_one_line(tmp_path, capsys):
    """train.reward_workers=1000 on this machine was still starting processes after two minutes;
    train.threads=1000000 crashed the process (the tokenizer's thread pool could not start)."""
    from pacs_fast.reward.batch import usable_cpus
    n = usable_cpus()
    code, err = cli([f"train.reward_workers={n + 1}", f"train.out_dir={tmp_path / 'runs'}"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: train.reward_workers={n + 1} is more than the {n} CPUs this process may use")
    code, err = cli([f"train.threads={n + 1}", f"train.out_dir={tmp_path / 'runs'}"], capsys)
    assert code == 2 and err.startswith(f"error: train.threads={n + 1} is more than the {n} CPUs"), err
    check_cpus(load_config(None, ["train.reward_workers=16", "train.threads=16"]), cpus=16)
    with pytest.raises(ValueError, match="use at most 16"):
        check_cpus(load_config(None, ["train.reward_workers=17"]), cpus=16)


def test_empty_folder_arguments_are_refused(tmp_path, capsys, monkeypatch):
    """`--resume ""` had started a fresh default run (300 steps, exit 0) and `experiment --out ''` had written its
    spec, tables and runs into the current folder: one line each, exit 2, nothing written."""
    monkeypatch.chdir(tmp_path)
    code, err = cli(["--resume", ""], capsys)
    assert code == 2 and err.count("\n") == 1 and "--resume: give the run folder" in err, err
    from pacs_fast.experiment import main as experiment_main
    with pytest.raises(SystemExit) as e:
        experiment_main(["--out", "", "--arms", "grpo", "--seeds", "0"])
    assert e.value.code == 2 and "--out: give the experiment's folder" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_an_unfinished_checkpoint_is_refused_naming_a_finished_one(tmp_path):
    """A run killed while writing a checkpoint leaves RUN/checkpoints/.tmp-step_*: eval (and model.path) had taken it
    as a model, its files possibly cut short, and named the results after it."""
    import shutil

    from pacs_fast.evaluation.args import UsageError, check_model

    model = qwen_folder(tmp_path)
    ckpts = tmp_path / "run" / "checkpoints"
    shutil.copytree(model, ckpts / "step_000002")
    shutil.copytree(model, ckpts / ".tmp-step_000004")
    check_model(str(ckpts / "step_000002"))
    with pytest.raises(UsageError, match=r"unfinished checkpoint .* the newest, .*step_000002$"):
        check_model(str(ckpts / ".tmp-step_000004"))
    cfg = load_config(None, [f"model.path={ckpts / '.tmp-step_000004'}"])
    with pytest.raises(ValueError, match=r"^model.path .*: an unfinished checkpoint"):
        validate(cfg)
