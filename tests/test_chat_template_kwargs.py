"""``data.chat_template_kwargs`` / ``eval --chat-template-kwargs``: variables of the model's chat template (TRL's
``chat_template_kwargs``, verl's ``apply_chat_template_kwargs``), e.g. ``{enable_thinking: false}`` for Qwen3's,
which then closes an empty think block in the generation prompt.

- The prompt builder hands them to the template; the trainer's prompts (samples.jsonl) and eval's carry them.
- A template that reads none of them, or no template, is a warning naming the key; a name that is one of
  ``apply_chat_template``'s own arguments, or not a mapping, is one line before any model loads.
- eval records them in run_config.json: a resume with other ones is refused.
"""
import json

import pytest

from pacs_fast.config import load_config, validate
from pacs_fast.data.prompts import build_prompt, encode_prompts, template_kwargs_effect
from pacs_fast.data.tiny import build_char_tokenizer

from test_run_safety import cli  # noqa: F401

# Qwen3's way (without its blank lines): with enable_thinking false the generation prompt closes an empty think block
THINKING = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n"
            "{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}"
            "{% endif %}")
PLAIN_CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
OFF = "<think></think>"  # (Qwen3's has blank lines in it, which the char tokenizer's decode drops)


def _tokenizer(template):
    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = template
    return tok


def test_the_builder_hands_them_to_the_template():
    tok = _tokenizer(THINKING)
    on, off = build_prompt(tok, "Q?"), build_prompt(tok, "Q?", template_kwargs={"enable_thinking": False})
    assert not on.endswith(OFF) and off == on + OFF
    ids = encode_prompts(tok, ["Q?"], template_kwargs={"enable_thinking": False})[0]
    assert ids == tok(off, add_special_tokens=False)["input_ids"] != encode_prompts(tok, ["Q?"])[0]
    assert template_kwargs_effect(tok, {"enable_thinking": False}) is None
    idle = template_kwargs_effect(_tokenizer(PLAIN_CHATML), {"enable_thinking": False})
    assert "reads none of enable_thinking" in idle
    assert "has no chat template" in template_kwargs_effect(build_char_tokenizer(), {"enable_thinking": False})


@pytest.mark.parametrize("value,message", [
    ("{tokenize: true}", r"data.chat_template_kwargs: 'tokenize' is not a chat template variable"),
    ("{'enable thinking': true}", r"data.chat_template_kwargs: 'enable thinking' is not a chat template variable"),
    ("[enable_thinking]", r"config key 'data.chat_template_kwargs' expects dict, got \['enable_thinking'\] "
                          r"\(a mapping"),
])
def test_settings_it_cannot_take(value, message):
    with pytest.raises(ValueError, match=message):
        validate(load_config(None, [f"data.chat_template_kwargs={value}"]))


def templated_tiny_model(path, template: str, seed: int):
    """The tiny model at ``path`` under the ChatML-style ``template`` (``<|im_start|>`` / ``<|im_end|>`` added as
    special tokens; its EOS stays the character tokenizer's)."""
    from pacs_fast.data.tiny import make_tiny_model
    from transformers import AutoTokenizer

    path = make_tiny_model(path, seed=seed)
    tok = AutoTokenizer.from_pretrained(path)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = template
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory):
    return templated_tiny_model(tmp_path_factory.mktemp("think") / "m", THINKING, seed=2)


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    rows = [{"id": f"q{i}", "problem": f"{i}+{i}=", "answer": str(2 * i)} for i in range(12)]
    path = tmp_path_factory.mktemp("data") / "toy.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_run_prompts_with_them_and_warns_where_they_do_nothing(thinking_model, problems, tmp_path, capsys):
    common = [f"model.path={thinking_model}", f"data.dataset={problems}", "data.eval_size=4", "rollout.n=2",
              "rollout.eval_n=1", "rollout.max_new_tokens=4", "train.prompts_per_step=2", "train.steps=1",
              "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=1", "train.progress=false",
              f"train.out_dir={tmp_path}", "train.tensorboard=false", "data.max_prompt_tokens=512"]
    for name, kwargs in (("off", "{enable_thinking: false}"), ("on", "{}")):
        code, out, err = cli(common + [f"train.run_name={name}", f"data.chat_template_kwargs={kwargs}"], capsys)
        assert code == 0, err
        assert "data.chat_template_kwargs" not in out + err
        rows = [json.loads(x) for x in (tmp_path / name / "samples.jsonl").read_text().splitlines()]
        prompts = [r["prompt"] for r in rows if "prompt" in r]
        assert prompts and all(p.endswith(OFF) == (name == "off") for p in prompts), prompts[:1]
    # a key the template does not read: the run warns, naming it
    code, out, err = cli(common + ["train.run_name=idle", "data.chat_template_kwargs={enable_reasoning: false}"],
                         capsys)
    assert code == 0, err
    assert ("warning: data.chat_template_kwargs={'enable_reasoning': False}: the chat template renders the same "
            "prompt with and without them (it reads none of enable_reasoning)") in out + err


def test_eval_prompts_with_them_records_them_and_refuses_others(thinking_model, problems, tmp_path, capsys):
    from pacs_fast import eval as ev
    from pacs_fast.evaluation.results import read_samples

    def eval_args(folder):
        return ["--model", str(thinking_model), "--benchmarks", str(problems), "--n", "1", "--max-tokens", "4",
                "--engine", "hf", "--out", str(folder), "--no-progress", "--limit", "2", "--temperature", "0"]

    out = tmp_path / "run"
    args = eval_args(out)
    assert ev.main(args + ["--chat-template-kwargs", '{"enable_thinking": false}']) == 0
    recs = read_samples(out / "samples_toy.jsonl")
    assert recs and all(r["prompt"].endswith(OFF) for r in recs.values())
    assert json.loads((out / "run_config.json").read_text())["template_kwargs"] == {"enable_thinking": False}
    capsys.readouterr()
    assert ev.main(args) == 2  # (the same folder without them)
    assert "template_kwargs" in capsys.readouterr().err
    for bad, message in (("{nope", "--chat-template-kwargs '{nope' is not JSON"),
                         ('{"tokenize": true}', "--chat-template-kwargs: 'tokenize' is not a chat template variable"),
                         ('[1]', "--chat-template-kwargs must be a mapping")):
        assert ev.main(eval_args(tmp_path / "bad") + ["--chat-template-kwargs", bad]) == 2
        errors = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
        assert len(errors) == 1 and errors[0].startswith(f"error: {message}"), errors
    assert not (tmp_path / "bad").exists()


def test_nested_values_reach_the_run_config_and_names_the_builder_sets_are_refused(tmp_path):
    """A number below the first level kept YAML's own int type, which config.yaml's dump could not write (a
    traceback after the model loaded, a run folder holding nothing but its lock); the names apply_chat_template
    hands the template itself (messages, tools, a special token) failed inside the template, naming no key."""
    import yaml

    from pacs_fast.config import save_config

    cfg = load_config(None, ["data.chat_template_kwargs={x: [1, 2], y: {a: 1.5, b: [true]}}"])
    assert cfg.data.chat_template_kwargs == {"x": [1, 2], "y": {"a": 1.5, "b": [True]}}
    assert type(cfg.data.chat_template_kwargs["x"][0]) is int and type(cfg.data.chat_template_kwargs["y"]["a"]) is float
    save_config(cfg, tmp_path / "config.yaml")
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["data"]["chat_template_kwargs"]["x"] == [1, 2]
    cfg.data.chat_template_kwargs = {"x": object()}  # what YAML cannot write: an error, and no file left behind
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(yaml.YAMLError):
        save_config(cfg, other / "config.yaml")
    assert list(other.iterdir()) == []
    for name in ("messages", "tools", "documents", "eos_token"):
        with pytest.raises(ValueError, match=f"data.chat_template_kwargs: '{name}' is not a chat template variable"):
            validate(load_config(None, [f"data.chat_template_kwargs={{{name}: x}}"]))


@pytest.mark.parametrize("bad,message", [
    ('{"x": NaN}', "error: --chat-template-kwargs holds NaN, which JSON does not have"),
    ('{"a": 1, "a": 2}', "error: --chat-template-kwargs gives 'a' twice"),
    ('{"messages": 1}', "error: --chat-template-kwargs: 'messages' is not a chat template variable"),
])
def test_eval_refuses_json_it_would_misread(tmp_path, capsys, bad, message):
    from pacs_fast import eval as ev

    args = ["--model", str(tmp_path / "none"), "--benchmarks", "x.jsonl", "--out", str(tmp_path / "out")]
    assert ev.main(args + ["--chat-template-kwargs", bad]) == 2
    errors = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(message), errors


def test_a_template_without_a_system_role_is_still_checked_for_them():
    """Gemma's template raises "System role not supported" on the probe's system message: the check gave up and
    said nothing, though the prompts (the system text folded into the user message) do not change."""
    tok = _tokenizer("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
                     "{% endif %}" + PLAIN_CHATML)
    assert "reads none of enable_thinking" in template_kwargs_effect(tok, {"enable_thinking": False})
    tok.chat_template = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no') }}{% endif %}" + THINKING
    assert template_kwargs_effect(tok, {"enable_thinking": False}) is None
