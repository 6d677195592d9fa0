"""A model folder's weights and tokenizer, checked before any model loads (pacs_fast/config/model_files.py): a
folder copied without its tokenizer, or with a weights file cut short, was a traceback from the loader in
both command lines (hostile sweep, 2026-11-28)."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from pacs_fast import eval as ev
from pacs_fast.config.model_files import has_tokenizer, safetensors_problem, weights_problem


@pytest.fixture
def weights(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"a.weight": torch.randn(7, 3), "b.bias": torch.randn(5, dtype=torch.bfloat16)}, str(path))
    return path


def test_an_intact_file_passes_and_loads(weights):
    assert safetensors_problem(weights) is None and weights_problem(weights.parent) is None
    assert set(load_file(str(weights))) == {"a.weight", "b.bias"}


@pytest.mark.parametrize("damage, match", [
    ("cut_data", "is cut short"), ("cut_header", "its header alone says"), ("four_bytes", "not even a safetensors"),
    ("appended", "bytes after its last tensor"), ("garbage", "unreadable header")])
def test_a_damaged_file_is_named_and_safetensors_agrees_it_is_broken(weights, damage, match):
    data = weights.read_bytes()
    weights.write_bytes({"cut_data": data[:-9], "cut_header": data[:40], "four_bytes": data[:4],
                         "appended": data + b"\0" * 3, "garbage": (20).to_bytes(8, "little") + b"{not json}" * 2 + data[28:]
                         }[damage])
    problem = weights_problem(weights.parent)
    assert problem and str(weights) in problem and match in problem, problem
    if damage != "appended":  # the loader itself fails on these (extra bytes it ignores, but they mean damage)
        with pytest.raises(Exception):
            load_file(str(weights))


def test_an_index_naming_a_missing_shard_is_named(weights):
    index = weights.parent / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a.weight": weights.name, "c": "model-00002-of-00002.safetensors"}}))
    assert "names 1 shard(s) the folder lacks (model-00002-of-00002.safetensors)" in weights_problem(weights.parent)
    index.write_text("{")
    assert "unreadable" in weights_problem(weights.parent)


def test_tokenizer_files(tmp_path):
    assert not has_tokenizer(tmp_path)
    (tmp_path / "vocab.json").write_text("{}")
    assert has_tokenizer(tmp_path)


def test_token_ids_are_read_from_the_tokenizer_files_as_transformers_counts_them(tmp_path):
    """tokenizer_ids (no transformers) against len(tokenizer): the BPE tokenizer.json of the tiny model, then
    with added tokens (tokenizer.json's added_tokens, tokenizer_config.json's added_tokens_decoder)."""
    from transformers import AutoTokenizer

    from pacs_fast.config.model_files import tokenizer_ids, vocab_problem
    from pacs_fast.data.tiny import make_tiny_model

    model = make_tiny_model(tmp_path / "m", seed=0)
    tok = AutoTokenizer.from_pretrained(model)
    rows = json.loads((model / "config.json").read_text())["vocab_size"]
    assert tokenizer_ids(model) == len(tok) <= rows and vocab_problem(model) is None
    tok.add_tokens([f"<x{i}>" for i in range(rows - len(tok) + 2)])
    tok.save_pretrained(model)
    assert tokenizer_ids(model) == len(AutoTokenizer.from_pretrained(model)) == rows + 2
    assert f"token ids up to {rows + 1} but the model has {rows} embedding rows" in vocab_problem(model)
    assert tokenizer_ids(tmp_path) is None and vocab_problem(tmp_path) is None  # nothing to read: not judged


@pytest.mark.parametrize("damage", ["no_tokenizer", "cut_weights", "tokens_past_the_rows", "adapter_beside"])
def test_both_command_lines_refuse_the_folder_before_loading(tmp_path, capsys, monkeypatch, damage):
    from pacs_fast.data.tiny import make_tiny_model
    from pacs_fast.config.model_files import TOKENIZER_FILES
    from pacs_fast.train import main as train_main

    model = make_tiny_model(tmp_path / "m", seed=0)
    capsys.readouterr()  # the model writer's progress bar
    if damage == "no_tokenizer":
        for name in TOKENIZER_FILES + ("special_tokens_map.json",):
            (model / name).unlink(missing_ok=True)
        needles = ("tokenizer files",)
    elif damage == "cut_weights":
        w = model / "model.safetensors"
        w.write_bytes(w.read_bytes()[:1000])
        needles = (str(w), "is cut short")
    elif damage == "adapter_beside":  # (the next test: transformers would load another model than the folder's)
        (model / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "base_model_name_or_path": "b"}))
        needles = ("adapter_config.json) beside config.json", "move adapter_config.json")
    else:  # tokens added to the tokenizer, the model not resized: a traceback after loading (hostile sweep)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model)
        rows = json.loads((model / "config.json").read_text())["vocab_size"]
        tok.add_tokens([f"<x{i}>" for i in range(rows - len(tok) + 3)])
        tok.save_pretrained(model)
        needles = (f"embedding rows", "resize_token_embeddings")
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"problem": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(40)))
    monkeypatch.setattr(ev, "_make_engine", lambda *args: pytest.fail("the eval CLI loaded the model"))
    assert ev.main(["--model", str(model), "--benchmarks", str(data), "--out", str(tmp_path / "ev")]) == 2
    monkeypatch.setattr("pacs_fast.trainer.build.build_learner", lambda *a, **k: pytest.fail("model work started"))
    code = None
    try:
        train_main([f"model.path={model}", f"data.dataset={data}", f"train.out_dir={tmp_path / 'runs'}"])
    except SystemExit as e:
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in err, err
    assert lines[0].startswith(f"error: --model {model}") and lines[1].find(f"model.path {str(model)!r}") >= 0, err
    assert all(n in line for n in needles for line in lines), err
    assert not (tmp_path / "ev").exists() and not (tmp_path / "runs").exists()


def test_train_checks_the_loaded_tokenizer_when_its_files_cannot_be_read(tmp_path, capsys, monkeypatch):
    """A tokenizer whose files tokenizer_ids cannot read (a sentencepiece tokenizer.model alone) passes
    validation; the loaded tokenizer's length is checked before the learner is built."""
    from transformers import AutoTokenizer

    import pacs_fast.config.model_files as model_files
    from pacs_fast.data.tiny import make_tiny_model
    from pacs_fast.train import main as train_main

    model = make_tiny_model(tmp_path / "m", seed=0)
    tok = AutoTokenizer.from_pretrained(model)
    rows = json.loads((model / "config.json").read_text())["vocab_size"]
    tok.add_tokens([f"<x{i}>" for i in range(rows - len(tok) + 1)])
    tok.save_pretrained(model)
    capsys.readouterr()
    monkeypatch.setattr(model_files, "tokenizer_ids", lambda folder: None)
    monkeypatch.setattr("pacs_fast.trainer.session.build_learner", lambda *a, **k: pytest.fail("model work started"))
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"problem": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(40)))
    with pytest.raises(SystemExit) as e:
        train_main([f"model.path={model}", f"data.dataset={data}", f"train.out_dir={tmp_path / 'runs'}",
                    "train.progress=false"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err, err
    assert f"token ids up to {rows} but the model has {rows} embedding rows" in err.strip().splitlines()[-1], err


def test_a_peft_adapter_beside_the_weights_is_refused_as_transformers_applies_it(tmp_path):
    """A model folder holding config.json and its weights and also a PEFT adapter (one saved into the folder of its
    own merge, a common slip): transformers (PEFT installed) loads the folder's weights with the adapter on top --
    a merged folder gets the update twice -- while vLLM loads the weights alone. Before 2026-12-03 the trainer took
    such a folder, set up, evaluated step 0 and failed at the first backward with a traceback (the adapter loaded
    frozen: "element 0 of tensors does not require grad"), and the eval CLI's two engines evaluated two different
    models without a word. Now both command lines refuse it in one line (the parametrized test above)."""
    pytest.importorskip("peft")
    import shutil

    from transformers import AutoModelForCausalLM

    from pacs_fast.config.model_files import model_folder_problem
    from pacs_fast.data.tiny import make_tiny_model
    from pacs_fast.learner.lora import add_lora, save_adapter

    folder = make_tiny_model(tmp_path / "a", seed=0)
    plain = shutil.copytree(folder, tmp_path / "plain")
    assert model_folder_problem(folder) is None
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    add_lora(model, rank=2, alpha=4, dropout=0.0, target_modules="q_proj")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 1.0)
    save_adapter(model, folder, base=str(folder))  # adapter_config.json + adapter_model.safetensors beside the weights
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    with torch.no_grad():
        got = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)(ids).logits
        weights_alone = AutoModelForCausalLM.from_pretrained(plain, dtype=torch.float32)(ids).logits
    assert not torch.allclose(got, weights_alone, atol=1e-3)  # the hazard: not the folder's weights' model
    problem = model_folder_problem(folder)
    assert problem and "adapter_config.json) beside config.json" in problem, problem
