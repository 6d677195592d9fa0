"""A run's ``config.yaml`` as a recipe (given back as ``--config``, or read by ``--resume``), and how the config's
inputs combine: defaults, a YAML file, command-line overrides. Config-time checks only (no model), but the last
test, which trains the tiny model twice for one step.

Every comparison is exact: no value here is computed in floating point, only parsed and written, so a
difference of any size is a value that changed."""
from __future__ import annotations

import json

import pytest

from pacs_fast.config import load_config, save_config, to_dict, validate


def _same(a, b) -> list:
    """``(section, key, a's, b's)`` of every key whose value or type differs (1000.0 == 1000, "1e3" != 1000.0)."""
    da, db = to_dict(a), to_dict(b)
    return [(s, k, da[s][k], db[s][k]) for s in da for k in da[s]
            if da[s][k] != db[s][k] or repr(da[s][k]) != repr(db[s][k])]


def test_a_saved_config_reads_back_key_for_key(tmp_path):
    """Strings that look like exponent floats ("1e3", "-2E+5") inside lists and mappings were written unquoted,
    which the loader (YAML 1.2's floats) read back as numbers: rollout.stop=["1e3"] came back as [1000.0] (so
    the run's --resume was refused) and a chat template's text variable as a number (kept silently)."""
    overrides = ['rollout.stop=["1e3", "-2E+5", "#x", "a: b", "null", "~", "yes", "040", " sp "]',
                 'data.chat_template_kwargs={v: "1e3", n: 3, x: 1e-3, on: true, t: null, l: [1, "9e-1"]}',
                 "reward.fn_fields=[1e3, tests]", "learner.betas=[9e-1,0.95]", "learner.lr=1e-3", "train.steps=7",
                 "data.system_prompt=a=b: c #d \u00fc ~", "train.run_name=1e3", "reward.step_split=' '",
                 "warmup.cache_dir=~/cache", "train.plots=off", "model.lora_alpha=1e308"]
    cfg = load_config(None, overrides)
    assert cfg.rollout.stop[:2] == ["1e3", "-2E+5"] and cfg.data.chat_template_kwargs["v"] == "1e3"
    save_config(cfg, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert _same(cfg, again) == []
    save_config(again, tmp_path / "again.yaml")
    assert (tmp_path / "again.yaml").read_text() == (tmp_path / "config.yaml").read_text()


def test_a_recorded_default_an_override_would_change_is_kept_with_a_warning(tmp_path, capsys):
    """config.yaml records the defaults that follow other keys (algo.clip_* follow algo.name, the batch sizes
    train.prompts_per_step). Given back with algo.name=gspo it keeps PACS's 0.2 / 0.2 (GSPO's are 3e-4 / 4e-4),
    with train.prompts_per_step=64 the mini-batch of 4 (16 optimiser steps a batch instead of 2): kept, as a
    value given is (tests/test_sequence_losses.py), but that had been without a word."""
    from pacs_fast.config.loading import kept_file_defaults
    from pacs_fast.train import parse_args, resolve
    base = ["train.prompts_per_step=4", "rollout.n=2", f"train.out_dir={tmp_path}"]
    recipe = tmp_path / "config.yaml"
    save_config(load_config(None, base), recipe)
    expected = {"algo.name=gspo": ["algo.clip_low=0.2 ", "algo.clip_high=0.2 "],
                "algo.name=dppo_tv": ["algo.clip_low=0.2 ", "algo.clip_high=0.2 ", "algo.clip_c=3.0 "],
                "train.prompts_per_step=64": ["learner.mini_batch_prompts=4 "], "algo.name=grpo": []}
    for override, starts in expected.items():
        fresh = load_config(None, base + [override])
        lines = kept_file_defaults(recipe, [override])
        assert [line[:len(s)] for line, s in zip(lines, starts)] == starts and len(lines) == len(starts), lines
        for line in lines:  # each names the value a fresh run takes
            key = line.split("=")[0]
            section, name = key.split(".")
            assert f"the default is {getattr(getattr(fresh, section), name)!r}" in line, line
    assert kept_file_defaults(recipe, ["algo.name=gspo", "algo.clip_low=0.2", "algo.clip_high=0.2"]) == []
    # a value the file chose (not its own settings' default) says nothing
    (tmp_path / "dapo.yaml").write_text("algo: {name: grpo, clip_high: 0.28}\n")
    assert kept_file_defaults(tmp_path / "dapo.yaml", ["algo.name=gspo"]) == []
    # the command line prints them, and the values are kept
    cfg, _ = resolve(parse_args(["--config", str(recipe), "algo.name=gspo", "train.run_name=x"]))
    assert (cfg.algo.clip_low, cfg.algo.clip_high) == (0.2, 0.2)
    err = capsys.readouterr().err
    assert err.count("warning: algo.clip_") == 2 and "the default is 0.0003" in err, err


def test_null_in_a_text_key_on_the_command_line_is_warned_about(tmp_path):
    """data.instruction=null appends the text "null" to every problem (a text key takes the command line's text as
    written: tests/test_hostile_inputs.py), where ``instruction: null`` in a config file is none."""
    from pacs_fast.config import hazard_warnings
    (tmp_path / "c.yaml").write_text("data: {instruction: null, system_prompt: ~}\n")
    from_file = load_config(tmp_path / "c.yaml")
    assert (from_file.data.instruction, from_file.data.system_prompt) == ("", "")
    assert not [w for w in hazard_warnings(from_file) if w.startswith("data.")]
    cli = load_config(None, ["data.instruction=null", "data.system_prompt=~"])
    warned = [w for w in hazard_warnings(cli) if w.startswith("data.")]
    assert [w.split(" ")[0] for w in warned] == ["data.system_prompt='~'", "data.instruction='null'"], warned


@pytest.mark.parametrize("value", ["$HOME/runs", "${HOME}/runs", "runs/$PACS_NOT_SET"])
def test_an_unexpanded_variable_in_a_path_is_refused(tmp_path, monkeypatch, value):
    """A quoted override or a config file keeps ``$HOME`` as text: train.out_dir=$HOME/runs had made a folder
    named "$HOME" in the current one and trained there."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"^train\.out_dir .* holds \$\{?\w+\}?, which is not expanded"):
        validate(load_config(None, [f"train.out_dir={value}"]))
    with pytest.raises(ValueError, match=r"^warmup\.cache_dir .* which is not expanded"):
        validate(load_config(None, [f"warmup.cache_dir={value}"]))
    assert not any(tmp_path.iterdir())
    (tmp_path / "$HOME").mkdir()  # a folder that is named so is taken as it is
    validate(load_config(None, ["train.out_dir=$HOME"]))


def test_config_errors_name_the_key_and_the_fix(tmp_path):
    with pytest.raises(ValueError, match=r"^config key 'learner' is a section, not a key: give learner.KEY=value"):
        load_config(None, ["learner=3"])
    with pytest.raises(ValueError, match=r"expects bool, got 1 \(true or false\)$"):
        load_config(None, ["train.plots=1"])
    (tmp_path / "c.yaml").write_text("3\n")
    with pytest.raises(ValueError, match=r"must hold a mapping of sections, got int$"):  # (not "_YamlInt")
        load_config(tmp_path / "c.yaml")


def test_help_says_which_input_wins(capsys):
    from pacs_fast.train import parse_args
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "the defaults, then the --config file, then the overrides in their order" in out
    assert "a key given twice: the last one wins" in out
    assert load_config(None, ["algo.beta=0.1", "algo.beta=0.2"]).algo.beta == 0.2


def test_a_run_config_given_back_reproduces_the_run(tmp_path, warm_cache):
    """A run with overrides of every kind, then a new run from its config.yaml alone: the same config (but its
    name) and the same metrics and samples, time keys aside (a seeded CPU run is deterministic)."""
    from pacs_fast.train import main
    from pacs_fast.trainer.metrics import read_jsonl
    from test_train import TINY
    main(TINY + [f"warmup.cache_dir={warm_cache}", f"train.out_dir={tmp_path}", "train.run_name=a", "train.steps=1",
                 "train.seed=5", 'rollout.stop=["1e3", "#x"]', "data.system_prompt=a=b: c #d \u00fc",
                 "learner.betas=[0.9,0.95]", "train.plots=False", "train.tensorboard=off", "train.log_samples=2"])
    main(["--config", str(tmp_path / "a" / "config.yaml"), "train.run_name=b"])
    a, b = (load_config(tmp_path / x / "config.yaml") for x in "ab")
    assert [d for d in _same(a, b)] == [("train", "run_name", "a", "b")]

    def untimed(path):
        return [{k: v for k, v in r.items() if "time" not in k and "per_s" not in k and "/s" not in k
                 and not k.endswith("_s") and "mem" not in k} for r in read_jsonl(path)]
    first, second = (untimed(tmp_path / x / "metrics.jsonl") for x in "ab")
    assert len(first) >= 2 and max(map(len, first)) > 10  # (records with their values, not only the time keys)
    assert json.dumps(first) == json.dumps(second)
    assert (tmp_path / "a" / "samples.jsonl").read_text() == (tmp_path / "b" / "samples.jsonl").read_text()
