"""A model folder whose tokenizer, generation or chat template files are damaged (a partial download) stops a run or an
eval with one line naming the setting, the folder and, where it does not parse, the file, before any model loads
(pacs_fast/config/model_files.py ``json_file_problem``, pacs_fast/data/tokenizer_files.py). A truncated
``tokenizer.json`` had given "error: Expecting value: line 388 column 16 (char 6571)" with no file named, one of the
wrong shape (valid JSON) transformers' traceback (``KeyError: 'added_tokens'``), and a truncated
``generation_config.json`` nothing at all: transformers logged a warning and the run went on without its stop ids."""
import json

import pytest

from test_data_path_sweep import qwen_chatml_folder
from test_hostile_inputs import cli


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokenizer") / "qwen"
    qwen_chatml_folder(folder)
    return folder


def damaged(folder, tmp_path, text):
    """A copy of ``folder`` (links to its files) whose tokenizer.json holds ``text``."""
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in folder.iterdir():
        (copy / f.name).symlink_to(f)
    (copy / "tokenizer.json").unlink()
    (copy / "tokenizer.json").write_text(text)
    return copy


def test_a_good_folder_loads_as_auto_tokenizer_loads_it(folder):
    from transformers import AutoTokenizer

    from pacs_fast.data.tokenizer_files import load_tokenizer

    ours, theirs = load_tokenizer(folder, key="model.path"), AutoTokenizer.from_pretrained(folder)
    assert type(ours) is type(theirs) and ours("1+1=<|im_end|>")["input_ids"] == theirs("1+1=<|im_end|>")["input_ids"]


@pytest.mark.parametrize("kind", ["truncated", "wrong shape"])
def test_a_damaged_tokenizer_json_is_one_line_naming_the_folder_and_the_file(folder, tmp_path, kind):
    from pacs_fast.data.tokenizer_files import load_tokenizer

    text = (folder / "tokenizer.json").read_text()
    copy = damaged(folder, tmp_path, text[: len(text) // 2] if kind == "truncated" else json.dumps({"version": "1.0"}))
    with pytest.raises(ValueError) as e:
        load_tokenizer(copy, key="--model")
    said = str(e.value)
    assert said.startswith(f"--model {str(copy)!r}: its tokenizer cannot be loaded (") and "\n" not in said, said
    if kind == "truncated":
        assert f"{copy / 'tokenizer.json'} is not valid JSON (JSONDecodeError: " in said, said
    else:  # (valid JSON: transformers' own error, in the line)
        assert "KeyError" in said, said


@pytest.mark.parametrize("name", ["tokenizer.json", "generation_config.json"])
def test_train_and_eval_stop_in_one_line_before_any_model_loads(folder, tmp_path, capsys, name):
    from pacs_fast.eval import main as eval_main

    copy = damaged(folder, tmp_path, (folder / "tokenizer.json").read_text())
    (copy / name).unlink()
    (copy / name).write_text((folder / name).read_text()[:40])
    said = f"{copy / name} is not valid JSON (JSONDecodeError: "
    code, err = cli([f"model.path={copy}", "data.dataset=math500", f"train.out_dir={tmp_path / 'runs'}",
                     "train.steps=1"], capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: model.path {str(copy)!r}: {said}"), err
    assert err.rstrip().endswith("copy the model's files again"), err
    assert not (tmp_path / "runs").exists()
    code = eval_main(["--model", str(copy), "--benchmarks", "math500", "--out", str(tmp_path / "eval")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"error: --model {copy}: {said}"), err
    assert not (tmp_path / "eval").exists()


def test_a_chat_template_that_cannot_render_names_its_folder_and_file(folder, tmp_path, capsys):
    """A chat_template.jinja cut short (a partial download): one line naming the folder and the file (it had said
    "the tokenizer's chat template", naming neither), in train and eval."""
    from pacs_fast.eval import main as eval_main

    copy = damaged(folder, tmp_path, (folder / "tokenizer.json").read_text())
    (copy / "chat_template.jinja").unlink()
    (copy / "chat_template.jinja").write_text((folder / "chat_template.jinja").read_text()[:-40])
    said = f"the chat template of {copy} (chat_template.jinja) cannot render the prompt (TemplateSyntaxError: "
    code, err = cli([f"model.path={copy}", "data.dataset=math500", f"train.out_dir={tmp_path / 'runs'}",
                     "train.steps=1"], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"error: {said}"), err
    code = eval_main(["--model", str(copy), "--benchmarks", "math500", "--out", str(tmp_path / "eval")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: {said}") and "Traceback" not in err, err
