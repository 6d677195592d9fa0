"""The resume sweep: a model folder edited in place between a run and its ``--resume``.

The policy's weights come from the checkpoint, but the tokenizer, chat template, generation config (stop ids) and
``config.json`` (architecture) are read from ``model.path`` again. A chat template edited there (or a hub snapshot
updated) had the resumed steps train on other prompts than the first ones without a word; the resume now refuses
in one line naming the file, before the model loads, and an unchanged folder resumes exactly as before."""
from __future__ import annotations

import json
import shutil

import pytest

from pacs_fast.trainer.metrics import read_jsonl

from test_data_path_sweep import qwen_chatml_folder
from test_run_safety import cli

RUN = ["rollout.n=4", "rollout.eval_n=1", "rollout.max_new_tokens=8", "train.prompts_per_step=2",
       "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=1", "train.tensorboard=false", "train.plots=false",
       "data.eval_size=4", "train.progress=false", "train.eval_every=0", "train.save_every=1", "train.threads=1"]


@pytest.fixture(scope="module")
def qwen_run(tmp_path_factory):
    """A Qwen2.5-shaped model folder, a data file, and a 1-step run on them (copied by each test)."""
    root = tmp_path_factory.mktemp("resume_sweep")
    qwen_chatml_folder(root / "m", num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    (root / "d.jsonl").write_text("".join(json.dumps({"problem": f"What is {i}+{i}?", "answer": str(2 * i)}) + "\n"
                                          for i in range(40)))
    return root


def _start(root, tmp_path, capsys):
    model = tmp_path / "m"
    shutil.copytree(root / "m", model)
    code, _, err = cli(RUN + [f"model.path={model}", f"data.dataset={root / 'd.jsonl'}", f"train.out_dir={tmp_path}",
                              "train.run_name=r", "train.steps=1"], capsys)
    assert code == 0, err
    return model, tmp_path / "r"


@pytest.mark.parametrize("edit", ["chat_template.jinja", "generation_config.json", "config.json"])
def test_a_resume_on_a_model_folder_edited_in_place_is_one_line_before_the_model_loads(qwen_run, tmp_path, capsys,
                                                                                       monkeypatch, edit):
    model, run = _start(qwen_run, tmp_path, capsys)
    f = model / edit
    if edit == "chat_template.jinja":
        f.write_text(f.read_text().replace("<|im_start|>assistant\\n", "<|im_start|>assistant\\nAnswer: "))
    else:
        f.write_text(json.dumps({**json.loads(f.read_text()), "eos_token_id": 0}))
    import pacs_fast.trainer.session as session

    def no_model(*a, **k):
        raise AssertionError("a model was loaded")
    monkeypatch.setattr(session, "build_learner", no_model)
    monkeypatch.setattr(session, "build_engine", no_model)
    before = (run / "metrics.jsonl").read_bytes()
    code, _, err = cli(["--resume", str(run), "train.steps=2"], capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"changed since step_000001 was written ({edit} " in err and "model.path=" in err, err
    assert (run / "metrics.jsonl").read_bytes() == before  # (nothing appended: no resume marker)


def test_an_unchanged_model_folder_resumes_with_the_first_sessions_prompts(qwen_run, tmp_path, capsys):
    _, run = _start(qwen_run, tmp_path, capsys)
    code, _, err = cli(["--resume", str(run), "train.steps=2"], capsys)
    assert code == 0, err
    prompts = {r["step"]: r["prompt"] for r in read_jsonl(run / "samples.jsonl")}
    assert sorted(prompts) == [1, 2] and prompts[1].endswith(prompts[2][-30:])


def test_the_record_reads_json_values_less_the_transformers_version(tmp_path):
    """A model folder rebuilt under another transformers (the built-in model's warm-up cache, deleted and made again)
    differs only in each JSON file's ``transformers_version``: not an edit; any other value is."""
    from pacs_fast.trainer.checkpoint import changed_model_files, model_files_record

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "transformers_version": "5.19.0"}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "transformers_version": "5.19.0"}))
    (tmp_path / "tokenizer.json").write_text("{}")
    record = model_files_record(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"transformers_version": "5.20.0", "model_type": "qwen2"}, indent=2))
    assert changed_model_files(record, tmp_path) == []
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 0, "transformers_version": "5.19.0"}))
    (tmp_path / "tokenizer.json").unlink()
    assert changed_model_files(record, tmp_path) == ["generation_config.json", "tokenizer.json"]
