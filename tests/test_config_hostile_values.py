"""Hostile values for every config key (a systematic sweep of 2026-11-30: 122 keys x 11-19 values each, and
combinations): what it found, each now one line naming the key before any model loads, or a true warning.

- a path component over 255 bytes (model.path, train.run_name, train.out_dir, warmup.cache_dir) was an
  OSError traceback ("File name too long");
- a 400-digit integer for a float key was an OverflowError traceback;
- learner.betas=[9e-1,0.999] was refused ("9e-1" is text in YAML 1.1) by a message whose rule the values meet;
- data.dataset= (empty) trained on whatever data files the current folder held;
- coefficients past float32's range (algo.beta=1e39) stopped the run at step 1 blaming learner.lr; a weight
  decay with lr x weight_decay >= 1 (AdamW multiplies the weights by 1 - lr x wd) and a warm-up batch of 2**63
  were accepted; model.attention=flash_attention_2 without flash-attn or a GPU failed after the model loaded;
- --config of a folder or /dev/null and data.dataset=/dev/null said "does not exist"; a run name with a newline
  was accepted; correction.is_cap below 1 said nothing.
"""
import pytest

from pacs_fast.config import load_config, validate
from pacs_fast.config.hazards import hazard_warnings

LONG = "x" * 300


def refused(overrides, match):
    with pytest.raises(ValueError, match=match):
        validate(load_config(None, overrides))


@pytest.mark.parametrize("key", ["model.path", "train.run_name", "train.out_dir", "warmup.cache_dir"])
def test_a_path_too_long_for_the_file_system_names_its_key(tmp_path, key):
    value = LONG if key == "train.run_name" else str(tmp_path / LONG)
    refused([f"{key}={value}"], rf"^{key} .* is too long for a path: a name of 300 bytes")


def test_paths_near_the_limits_and_odd_text(tmp_path):
    """A run folder whose path leaves no room for its files (the lock fitted, config.yaml's temporary did not:
    a traceback after the warm-up); ~nosuchuser (Path.expanduser raised); text no file name can hold."""
    out = str(tmp_path / "/".join(["d" * 200] * 20))[:4000]
    refused([f"train.out_dir={out}", "train.run_name=r"], r"train.out_dir / train.run_name .* less 200 for the files")
    refused([f"train.out_dir={out}"], r"train.out_dir / train.run_name")  # an automatic name counted too
    validate(load_config(None, ["train.run_name=~nosuchuser"]))  # a plain name, as before (Path.expanduser raised)
    refused(["data.dataset=~nosuchuser/d.jsonl"], r"data.dataset '~nosuchuser/d.jsonl' is neither a shipped dataset")
    refused(["train.run_name=caf\udce9"], r"train.run_name .* is not UTF-8 text")
    from pacs_fast.config.paths import check_path_length
    with pytest.raises(ValueError, match=r"data.dataset .* is not text a file name can hold"):
        check_path_length("data.dataset", "a\ud800b")
    with pytest.raises(ValueError, match=r"config key 'train.steps' expects int, got 1e3$"):
        load_config(None, ["train.steps=1e3"])  # the user's text, not 1000.0


def test_numbers_a_float_cannot_hold_or_float32_cannot(tmp_path):
    with pytest.raises(ValueError, match=r"config key 'learner.lr': 1000.* is beyond a float's range"):
        load_config(None, ["learner.lr=1" + "0" * 400])
    refused(["algo.beta=1e39"], r"algo.beta=1e\+39 is beyond float32's range")
    refused(["learner.weight_decay=1e300"], "learner.weight_decay=1e.300 is beyond float32's range")
    refused(["learner.lr=1", "learner.weight_decay=2"], r"learner.lr x learner.weight_decay = 2 >= 1")
    refused(["warmup.batch_size=9223372036854775808"], r"warmup.batch_size must be in 1..65536")
    validate(load_config(None, ["learner.weight_decay=0.1", "algo.beta=1e30"]))  # large, but meaningful


def test_an_exponent_without_a_point_is_a_number_in_a_list_too():
    cfg = load_config(None, ["learner.betas=[9e-1,0.999]", "learner.lr=1e-5"])
    assert cfg.learner.betas == [0.9, 0.999] and all(type(b) is float for b in cfg.learner.betas)
    validate(cfg)
    assert load_config(None, ["train.run_name=1e5"]).train.run_name == "1e5"  # a text key keeps its text


def test_an_empty_training_set_is_refused():
    refused(["data.dataset="], r"data.dataset is empty: give the training set")


def test_paths_that_exist_but_are_not_files(tmp_path):
    with pytest.raises(ValueError, match=r"config file .* is a folder: give a YAML file"):
        load_config(tmp_path)
    with pytest.raises(ValueError, match=r"config file '/dev/null' is not a regular file"):
        load_config("/dev/null")
    from pacs_fast.config.dataset_files import dataset_files
    with pytest.raises(FileNotFoundError, match=r"dataset /dev/null is not a regular file or folder"):
        dataset_files("/dev/null")


@pytest.mark.parametrize("name", ["a\nb", "a\tb", "a\x1bb"])
def test_a_run_name_with_a_control_character_is_refused(name):
    refused([f"train.run_name={name}"], r"train.run_name .* must be a plain folder name .* no control character")


def test_flash_attention_without_its_package_or_a_gpu_is_refused_before_loading(monkeypatch):
    import importlib.util

    from pacs_fast.trainer.build import check_installed
    for attention in ("flash_attention_2", "flash_attention_3"):
        with pytest.raises(ValueError, match=rf"model.attention={attention} needs .*; use model.attention=auto"):
            check_installed(load_config(None, [f"model.attention={attention}"]))
    # where no Hugging Face model runs (megatron learner, vLLM engine) model.attention is not read: not refused
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name in ("vllm", "megatron")
                        else real(name, *a))
    check_installed(load_config(None, ["model.attention=flash_attention_2", "learner.backend=megatron",
                                       "rollout.engine=vllm"]))


def test_huge_loss_coefficients_and_a_cap_below_one_are_warned():
    said = hazard_warnings(load_config(None, ["algo.entropy_coef=1e37"]))
    assert any(line.startswith("algo.entropy_coef=1e+37: a loss coefficient of 1e6 or more") for line in said), said
    assert not any("loss coefficient" in line for line in hazard_warnings(load_config(None, ["algo.entropy_coef=0.01"])))
    # a coefficient this algorithm does not read (vf_coef is PPO's): no warning, as unused_settings says
    assert not any("loss coefficient" in line for line in hazard_warnings(load_config(None, ["algo.vf_coef=1e7"])))
    assert any("algo.vf_coef=1e+07" in line for line in hazard_warnings(load_config(None, ["algo.name=ppo",
                                                                                           "algo.vf_coef=1e7"])))
    from pacs_fast.trainer.correction import correction_warnings
    low = correction_warnings(load_config(None, ["correction.is_level=sequence", "correction.is_cap=0.5"]))
    assert any(line.startswith("correction.is_cap=0.5 is below 1") for line in low), low
    assert correction_warnings(load_config(None, ["correction.is_level=sequence"])) == []


def test_a_setting_the_loaded_model_refuses_leaves_no_run_folder(tmp_path, capsys, monkeypatch, warm_cache):
    """An error raised while the learner or engine is built (after the model loaded): one line, exit 2, and the
    new run's folder (its config.yaml) removed; it had been a traceback, and the folder blocked the name."""
    from pacs_fast.trainer import session
    from test_train import TINY

    def refuses(*a, **k):
        raise ValueError("model.attention='sdpa' cannot be used with this model: simulated")

    monkeypatch.setattr(session, "build_learner", refuses)
    from pacs_fast.train import main
    with pytest.raises(SystemExit) as e:
        main(TINY + [f"warmup.cache_dir={warm_cache}", f"train.out_dir={tmp_path}", "train.run_name=r"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("error:") == 1, err
    assert err.rstrip("\n").split("\n")[-1] == "error: model.attention='sdpa' cannot be used with this model: simulated"
    assert not (tmp_path / "r").exists()


def test_a_resumed_run_whose_setup_fails_keeps_its_folder(tmp_path, capsys, monkeypatch, warm_cache):
    """The failed setup of a *resumed* run (its learner refused after the model loaded) leaves the run as it was:
    only a new run's folder is discarded."""
    from pacs_fast.trainer import session
    from pacs_fast.train import main
    from test_train import TINY
    main(TINY + [f"warmup.cache_dir={warm_cache}", f"train.out_dir={tmp_path}", "train.run_name=r", "train.steps=1",
                 "train.save_every=1"])
    before = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "r").rglob("*"))
    monkeypatch.setattr(session, "build_learner", lambda *a, **k: (_ for _ in ()).throw(ValueError("simulated")))
    with pytest.raises(SystemExit) as e:
        main(["--resume", str(tmp_path / "r"), "train.steps=2"])
    assert e.value.code == 2 and capsys.readouterr().err.rstrip().endswith("error: simulated")
    after = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "r").rglob("*"))
    assert after == before


def test_a_generation_batch_too_large_for_its_seed_range_is_refused():
    """Response j of prompt i in generation batch b samples with seed batch_seed(b) + i * rollout.n + j, batches
    2**20 apart: more responses per batch would repeat the next batch's seeds (a sweep of 2026-11-30)."""
    from pacs_fast.trainer.rollout_step import BATCH_SEED_STRIDE, batch_seed

    cfg = load_config(None, ["train.prompts_per_step=65536", "rollout.n=16", "learner.mini_batch_prompts=65536"])
    validate(cfg, world=1)  # 2**20 responses: the seeds fill the range exactly
    assert batch_seed(cfg, 2) - batch_seed(cfg, 1) == BATCH_SEED_STRIDE == 65536 * 16
    with pytest.raises(ValueError, match=r"train.prompts_per_step x rollout.n = 65536 x 17 = 1,114,112 responses"):
        validate(load_config(None, ["train.prompts_per_step=65536", "rollout.n=17",
                                    "learner.mini_batch_prompts=65536"]), world=1)
