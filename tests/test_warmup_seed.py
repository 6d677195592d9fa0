"""The warm-up has its own seed: train.seed changes the RL run, not the starting model or problems."""
import pytest
from safetensors.torch import load_file

from pacs_fast.config import load_config
from pacs_fast.trainer.problems import load_problems
from pacs_fast.trainer.warmup import default_model, warmup_key, warmup_seed


def test_key_follows_the_warmup_seed_not_the_rl_seed():
    base = load_config(None, [])
    assert warmup_key(load_config(None, ["train.seed=7"])) == warmup_key(base)
    assert warmup_key(load_config(None, ["warmup.seed=1"])) != warmup_key(base)
    follow = load_config(None, ["warmup.seed=-1", "train.seed=3"])
    assert warmup_seed(follow) == 3
    assert warmup_key(follow) == warmup_key(load_config(None, ["warmup.seed=3", "train.seed=9"]))
    # everything that changes the warmed model is in the key
    for override in ("warmup.target_acc=0.2", "warmup.check_every=25", "data.arith_terms=3", "data.arith_seed=1", "data.arith_max_digits=3", "warmup.steps=10",
                     "warmup.lr=0.001", "model.tiny_hidden_size=64", "data.arith_ops=+-"):
        assert warmup_key(load_config(None, [override])) != warmup_key(base), override
    with pytest.raises(ValueError, match="warmup.seed"):
        from pacs_fast.config import validate
        validate(load_config(None, ["warmup.seed=-2"]), world=1)


def test_problems_do_not_depend_on_the_rl_seed():
    a = load_problems(load_config(None, ["train.seed=0", "data.arith_train_size=200"]))
    b = load_problems(load_config(None, ["train.seed=5", "data.arith_train_size=200"]))
    c = load_problems(load_config(None, ["data.arith_seed=1", "data.arith_train_size=200"]))
    assert a == b and a != c


def test_warmup_is_deterministic_in_its_seed(tmp_path):
    tiny = [f"warmup.cache_dir={tmp_path}", "warmup.steps=3", "warmup.batch_size=4", "model.tiny_hidden_size=32",
            "model.tiny_num_layers=1", "data.arith_train_size=50", "data.eval_size=4"]

    def build(*extra, cache=None):
        cfg = load_config(None, tiny + list(extra) + ([f"warmup.cache_dir={cache}"] if cache else []))
        return load_file(default_model(cfg, load_problems(cfg)[0], log=lambda *a: None) / "model.safetensors")

    first = build("train.seed=0")
    again = build("train.seed=4", cache=tmp_path / "other")  # built afresh elsewhere, other RL seed
    assert first.keys() == again.keys() and all((first[k] == again[k]).all() for k in first)
    other = build("warmup.seed=1")
    assert any(not (first[k] == other[k]).all() for k in first)


def test_warmup_stops_at_the_target(monkeypatch, tmp_path):
    """The warm-up stops at the first check (every check_every steps, from 2 x check_every on) whose
    sampled accuracy reaches warmup.target_acc; without a target it runs every step."""
    import pacs_fast.trainer.warmup as wu
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pacs_fast.data.tiny import make_tiny_model

    make_tiny_model(tmp_path / "m", seed=0, hidden_size=32, num_layers=1, num_heads=1, num_kv_heads=1,
                    intermediate_size=64)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    tok = AutoTokenizer.from_pretrained(tmp_path / "m")
    records = load_problems(load_config(None, ["data.arith_train_size=40", "data.eval_size=4"]))[0]
    checks = []

    def fake_probe(model, tokenizer, recs, *, max_new_tokens, seed=0):
        checks.append(len(recs))
        return 0.1 * len(checks)  # 0.1, 0.2, 0.3, ... (running means of two: 0.1, 0.15, 0.25)

    monkeypatch.setattr(wu, "probe_accuracy", fake_probe)
    kw = dict(batch_size=2, lr=1e-3, seed=0, log=lambda *a: None, check_every=2, probe_size=16)
    # checks at 4, 6, 8, 10: the mean of the last two (0.1, 0.15, 0.25, 0.35) first reaches 0.25 at step 8
    assert wu.supervised_warmup(model, tok, records, steps=40, target_acc=0.25, **kw) == 8
    assert checks == [16, 16, 16]
    assert wu.supervised_warmup(model, tok, records, steps=6, target_acc=0.0, **kw) == 6
    assert len(checks) == 3  # no target: no checks
    # a check_every whose first check (step 2 x check_every) lies past warmup.steps: said so, not "did not reach"
    said = []
    assert wu.supervised_warmup(model, tok, records, steps=5, target_acc=0.25, **{**kw, "check_every": 3,
                                                                                   "log": said.append}) == 5
    assert len(checks) == 3 and said[-1].startswith("warning: the warm-up ran all warmup.steps=5 steps without "
                                                    "checking its accuracy: warmup.check_every=3"), said
    monkeypatch.undo()
    # the real probe: deterministic in its seed; an untrained model answers (almost) nothing right
    a = wu.probe_accuracy(model, tok, records[:16], max_new_tokens=8)
    assert a == wu.probe_accuracy(model, tok, records[:16], max_new_tokens=8) and 0.0 <= a <= 0.25
