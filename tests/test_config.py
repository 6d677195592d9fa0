"""Config: defaults, YAML + dotted overrides, type checks, --help, and clear errors for bad input."""
import dataclasses
import random

import pytest
import yaml

from pacs_fast import config as C


def test_defaults_are_valid_and_every_key_is_settable():
    cfg = C.Config()
    C.validate(cfg)
    keys = C.all_keys()
    assert "algo.beta" in keys and "rollout.n" in keys and "learner.backend" in keys
    for key in keys:  # every key round-trips through set_value with its own default
        s, k = key.split(".")
        C.set_value(cfg, key, getattr(getattr(C.Config(), s), k))
    assert C.to_dict(cfg) == C.to_dict(C.Config())


def test_yaml_then_overrides(tmp_path, seed):
    rng = random.Random(seed)
    beta, n = round(rng.uniform(0.1, 3), 3), rng.choice([2, 4, 8, 16])
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"algo": {"beta": beta, "name": "grpo"}, "rollout": {"n": n}}))
    cfg = C.load_config(p, ["algo.name=pacs", "learner.betas=[0.8, 0.95]", "train.progress=false",
                            "model.path=", "learner.lr=3e-5"])
    assert cfg.algo.beta == beta and cfg.rollout.n == n
    assert cfg.algo.name == "pacs"  # the override wins over the file
    assert cfg.learner.betas == [0.8, 0.95] and cfg.train.progress is False
    assert cfg.model.path == "" and cfg.learner.lr == pytest.approx(3e-5)
    # save -> load round trip
    C.save_config(cfg, tmp_path / "out.yaml")
    assert C.to_dict(C.load_config(tmp_path / "out.yaml")) == C.to_dict(cfg)


@pytest.mark.parametrize("override, match", [
    ("algo.betaa=1", "unknown config key 'algo.betaa'.*algo.beta"),
    ("algoo.beta=1", "unknown config key"),
    ("beta=1", "unknown config key"),
    ("rollout.n=two", "rollout.n.*expects int"),
    ("train.progress=3", "expects bool"),
    ("learner.lr=[1]", "expects float"),
    ("algo.beta", "must look like section.key=value"),
])
def test_bad_overrides_name_the_key(override, match):
    with pytest.raises(ValueError, match=match):
        C.load_config(None, [override])


def test_unknown_yaml_section_and_missing_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("algorithm:\n  beta: 1\n")
    with pytest.raises(ValueError, match="unknown config key 'algorithm'"):
        C.load_config(p)
    with pytest.raises(ValueError, match="does not exist"):
        C.load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize("text, line, key", [("algo:\n  beta: 1\n  beta: 2\n", 3, "beta"),
                                             ("algo:\n  beta: 1\ntrain:\n  steps: 3\nalgo:\n  name: grpo\n", 5, "algo")])
def test_a_key_given_twice_in_a_yaml_file_is_refused(tmp_path, text, line, key):
    """PyYAML keeps the last of two equal keys: the run silently used ``beta: 2`` (or dropped a whole first
    ``algo:`` section) that the file's reader may take for the first (hostile sweep, 2026-11-28)."""
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ValueError, match=f"line {line}, .*key '{key}' is given twice"):
        C.load_config(p)
    p.write_text("algo: &b {beta: 3, name: grpo}\ntrain: {steps: 7}\n")
    assert C.load_config(p).algo.beta == 3
    from pacs_fast.config.loading import read_yaml
    p.write_text("a: &b {beta: 1, name: grpo}\nalgo:\n  <<: *b\n  beta: 2\n")  # a merge key, then an override
    assert read_yaml(p)["algo"] == {"beta": 2, "name": "grpo"}


def test_on_and_off_in_a_yaml_file_are_text_for_a_text_key(tmp_path):
    """YAML 1.1 reads on / off / yes / no as booleans: ``packing: on`` in a config file failed with "expects str,
    got True" (its values are auto / on / off), while learner.packing=on worked on the command line (long-response
    sweep, 2026-11-28). A config file now has YAML 1.2's booleans (true / false); a bool key takes the words."""
    p = tmp_path / "c.yaml"
    p.write_text("learner:\n  packing: on\n  shared_prefix: no\nmodel:\n  gradient_checkpointing: Yes\n"
                 "train:\n  run_name: off\n  progress: false\n  plots: TRUE\n")
    cfg = C.load_config(p)
    assert (cfg.learner.packing, cfg.learner.shared_prefix, cfg.model.gradient_checkpointing) == ("on", False, True)
    assert (cfg.train.run_name, cfg.train.progress, cfg.train.plots) == ("off", False, True)
    p.write_text("train:\n  progress: maybe\n")
    with pytest.raises(ValueError, match="config key 'train.progress' expects bool, got 'maybe'"):
        C.load_config(p)


def test_numbers_in_a_yaml_file_keep_their_text_for_a_text_key_and_octal_is_refused(tmp_path):
    """YAML 1.1 reads ``040`` as octal 32 and ``1:30`` as 90: ``run_name: 040`` named the run "32" and
    ``steps: 040`` trained 32 steps, silently (hostile sweep, 2026-11-30)."""
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  run_name: 040\n  steps: 12\n  project: 1.50\nlearner:\n  betas: [0.9, 0.95]\n")
    cfg = C.load_config(p, ["learner.eps=1e-8"])
    assert (cfg.train.run_name, cfg.train.project, cfg.train.steps) == ("040", "1.50", 12)
    # plain numbers underneath (config.yaml is written by yaml.safe_dump, which refuses subclasses)
    assert [type(x) for x in [cfg.train.steps, *cfg.learner.betas, cfg.learner.eps]] == [int, float, float, float]
    C.save_config(cfg, tmp_path / "saved.yaml")
    assert C.load_config(tmp_path / "saved.yaml").train.run_name == "040"
    for text, read in [("040", 32), ("1:30", 90), ("1:30.5", 90.5)]:
        p.write_text(f"train:\n  steps: {text}\n")
        with pytest.raises(ValueError, match=f"config key 'train.steps': {text} reads as {read} in YAML 1.1"):
            C.load_config(p)
    with pytest.raises(ValueError, match="config key 'train.steps': 010 reads as 8"):
        C.load_config(None, ["train.steps=010"])  # an override is read as a config file reads it


@pytest.mark.parametrize("overrides, match", [
    (["train.prompts_per_step=12", "learner.mini_batch_prompts=8"], "mini_batch_prompts=8 must divide"),
    (["learner.mini_batch_prompts=8", "learner.micro_batch_prompts=3"], "micro_batch_prompts=3 must divide"),
    (["rollout.n=1"], "rollout.n must be >= 2"),
    (["rollout.n=1", "algo.name=grpo"], "rollout.n must be >= 2"),
    (["rollout.n=1", "algo.name=ppo", "rollout.filter_groups=true"], "rollout.filter_groups=true needs rollout.n >= 2"),
    (["rollout.temperature=1e-40"], r"rollout.temperature must be in \[0.01, inf\)"),  # logits / T: inf, NaN loss
    (["rollout.eval_temperature=1e-40"], "rollout.eval_temperature must be 0 \\(greedy\\) or >= 0.01"),
    (["reward.time_limit_s=1e10"], r"reward.time_limit_s must be in \(0, 1e\+06\]"),  # overflowed the timer
    (["reward.user_fn_timeout_s=1e10"], r"reward.user_fn_timeout_s must be in \(0, 1e\+06\]"),
    # PACS's dr_grpo score r - mean is 0 for a group of one: accepted, it never trained (grad_norm 0)
    (["rollout.n=1", "algo.score=dr_grpo"], "rollout.n must be >= 2 for algo.score=dr_grpo"),
    (["rollout.n=0", "algo.score=naive"], "rollout.n must be >= 1"),
    (["algo.name=a2c"], "algo.name must be one of"),
    (["rollout.engine=sglang"], "rollout.engine must be one of"),
    (["learner.backend=jax"], "learner.backend must be one of"),
    (["algo.ref=fixed", "algo.name=grpo"], "algo.ref applies to"),
    (["algo.reset_every=2"], "algo.reset_every=2 resets a fixed reference and needs algo.ref=fixed"),
    (["algo.reset_every=2", "algo.name=grpo"], "needs algo.kl_coef > 0"),
    # it crashed at the first reset (no reference model is kept for a proxy that uses none)
    (["algo.ref=fixed", "algo.proxy=mean_logp", "algo.reset_every=2"], "algo.ref=fixed needs algo.proxy=logratio"),
    (["rollout.top_p=0"], "rollout.top_p"),
    (["rollout.top_k=-1"], "rollout.top_k must be >= 0"),
    (["rollout.eval_top_k=-5"], "rollout.eval_top_k must be >= 0"),
    (["rollout.min_p=1"], r"rollout.min_p must be in \[0, 1\)"), (["rollout.eval_min_p=-0.1"], "rollout.eval_min_p"),
    (["rollout.temperature=0"], "rollout.temperature"),
    (["model.path=/definitely/not/here"], "model.path .* does not exist"),
    (["data.dataset=/definitely/not/here.jsonl"], "data.dataset"),
    (["train.steps=0"], "train.steps must be >= 1"),
])
def test_impossible_settings_are_rejected(overrides, match):
    cfg = C.load_config(None, overrides)
    with pytest.raises(ValueError, match=match):
        C.validate(cfg)


def test_group_size_one_is_fine_without_group_baseline():
    C.validate(C.load_config(None, ["rollout.n=1", "algo.score=naive"]))
    C.validate(C.load_config(None, ["rollout.n=1", "algo.name=ppo"]))


def test_help_lists_every_key_with_its_default(capsys):
    from pacs_fast.train import parse_args
    with pytest.raises(SystemExit) as e:
        parse_args(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    defaults = C.Config()
    for section in dataclasses.fields(defaults):
        for f in dataclasses.fields(getattr(defaults, section.name)):
            default = getattr(getattr(defaults, section.name), f.name)
            assert f"{section.name}.{f.name} (" in out
            assert f"default {default!r})" in out


def test_cli_reports_bad_config_before_any_work(capsys):
    from pacs_fast.train import main
    with pytest.raises(SystemExit) as e:
        main(["algo.bta=1"])
    assert e.value.code == 2
    assert "unknown config key 'algo.bta'" in capsys.readouterr().err


@pytest.mark.parametrize("overrides,match", [
    (["train.out_dir="], "train.out_dir is empty"),  # wrote the run folder into the current directory
    (["train.run_name= "], "train.run_name ' ' must be a plain folder name"),
    (["data.arith_ops=+-+"], "data.arith_ops must be a non-empty subset of '\\+-\\*', each operator once"),
])
def test_names_and_operators_a_sweep_found_accepted(overrides, match):
    with pytest.raises(ValueError, match=match):
        C.validate(C.load_config(None, overrides))


def test_an_unwritable_warm_up_cache_is_named_before_any_work(tmp_path):
    """warmup.cache_dir on a file was a NotADirectoryError traceback after the data had loaded."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ValueError, match="warmup.cache_dir .* cannot be created: .* is a file"):
        C.validate(C.load_config(None, [f"warmup.cache_dir={afile / 'sub'}"]))
    C.validate(C.load_config(None, [f"warmup.cache_dir={tmp_path / 'new' / 'cache'}"]))


def test_sampling_filters_reach_the_engines():
    """rollout.top_k / min_p shape the rollouts' SamplingParams, rollout.eval_top_k / eval_min_p the held-out
    evaluation's (its greedy pass takes none), each engine then applies them (tests/test_hf_sampler.py,
    tests/test_vllm_engine.py)."""
    from pacs_fast.rollout.base import Completion
    from pacs_fast.trainer.evaluation import evaluate_share
    from pacs_fast.trainer.rollout_step import sampling_params

    cfg = C.load_config(None, ["rollout.top_k=20", "rollout.min_p=0.05", "rollout.eval_top_k=7",
                               "rollout.eval_min_p=0.01", "rollout.eval_temperature=0.6"])
    params = sampling_params(cfg, 5)
    assert (params.top_k, params.min_p, params.top_p) == (20, 0.05, 1.0)
    seen = []

    class Recording:
        def generate(self, prompts, p):
            seen.append(p)
            return [[Completion([5], "1", "stop") for _ in range(p.n)] for _ in prompts]

    problems = [{"prompt_ids": [1, 2, 3], "answer": "1"}]
    evaluate_share(cfg, Recording(), lambda texts, answers, **_: [1.0] * len(texts), problems, 0)
    assert [(p.temperature, p.top_k, p.min_p) for p in seen] == [(0.6, 7, 0.01), (0.0, 0, 0.0)]
