"""The shipped configs load and validate (the GPU recipes once their two paths point at files)."""
import json
from pathlib import Path

import pytest

from pacs_fast.config import load_config, validate

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
RECIPES = ["pacs_qwen2.5_7b_deepscaler.yaml", "pacs_qwen2.5_3b_deepscaler.yaml"]


@pytest.mark.parametrize("name", RECIPES)
def test_paper_recipe(name, tmp_path):
    cfg = load_config(CONFIGS / name)
    # the paper's settings (arXiv 2509.02522): batch 1,024 prompts, G = 8, mini-batch 256, lr 1e-6, beta = 1,
    # prompt <= 512, response <= 4,096, no KL
    assert cfg.train.prompts_per_step == 1024 and cfg.rollout.n == 8 and cfg.learner.mini_batch_prompts == 256
    assert cfg.learner.lr == 1e-6 and cfg.algo.beta == 1.0 and cfg.algo.name == "pacs" and cfg.algo.kl_coef == 0
    assert cfg.data.max_prompt_tokens == 512 and cfg.rollout.max_new_tokens == 4096
    # with the placeholders, validation names the path the user must fill in
    with pytest.raises(ValueError, match="model.path"):
        validate(cfg, world=8)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (model / "tokenizer.json").write_text("{}")  # a model folder needs its tokenizer (checked too)
    (model / "pytorch_model.bin").write_bytes(b"")  # and a weights file (its presence is checked)
    data = tmp_path / "deepscaler.jsonl"
    data.write_text(json.dumps({"problem": "1+1", "answer": "2"}) + "\n")
    cfg = load_config(CONFIGS / name, [f"model.path={model}"])
    with pytest.raises(ValueError, match="data.dataset"):
        validate(cfg, world=8)
    cfg = load_config(CONFIGS / name, [f"model.path={model}", f"data.dataset={data}"])
    validate(cfg, world=8)  # 8 GPUs: tensor parallel x data parallel
    with pytest.raises(ValueError, match="WORLD_SIZE|processes"):
        validate(cfg, world=3)


@pytest.mark.parametrize("path", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_every_shipped_config_loads(path):
    cfg = load_config(CONFIGS / path)
    if cfg.data.dataset == "arithmetic" and not cfg.model.path:
        validate(cfg, world=1)  # CPU-runnable presets validate as they are


BASELINES = {  # recipe -> (launch size, its published settings)
    # the PACS paper's GRPO baseline (ritzz-ai/PACS scripts/baseline/grpo.sh): the PACS recipe's batch, verl's GRPO
    "grpo_qwen2.5_7b_deepscaler.yaml": (8, {"algo.name": "grpo", "algo.clip_low": 0.2, "algo.clip_high": 0.2,
                                             "algo.loss_agg": "token-sum-norm", "algo.kl_coef": 0.0,
                                             "train.prompts_per_step": 1024, "rollout.n": 8,
                                             "learner.mini_batch_prompts": 256, "learner.lr": 1e-6,
                                             "data.max_prompt_tokens": 512, "rollout.max_new_tokens": 4096}),
    # DAPO (arXiv 2503.14476) at the scale of verl's recipe/dapo/test_dapo_7b_math.sh, 8 nodes x 8 GPUs
    "dapo_qwen2.5_7b_dapo17k.yaml": (64, {"algo.name": "grpo", "algo.clip_low": 0.2, "algo.clip_high": 0.28,
                                          "algo.loss_agg": "token-mean", "algo.kl_coef": 0.0,
                                          "rollout.filter_groups": True, "rollout.max_gen_batches": 10,
                                          "reward.overlong_buffer_len": 4096, "rollout.max_new_tokens": 8192,
                                          "train.prompts_per_step": 512, "rollout.n": 16,
                                          "learner.mini_batch_prompts": 32, "learner.lr": 1e-6,
                                          "learner.lr_warmup_steps": 10, "learner.weight_decay": 0.1,
                                          "data.max_prompt_tokens": 2048, "rollout.eval_top_p": 0.7}),
}


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_baseline_recipe(name, tmp_path):
    """The baselines' recipes hold their published settings and validate at their launch size once the two paths
    are filled in; DAPO's verl-format parquet (chat-message prompts, reward_model.ground_truth) reads as the recipe's
    keys say."""
    import pandas as pd

    from pacs_fast.data.datasets import load_dataset

    world, published = BASELINES[name]
    cfg = load_config(CONFIGS / name)
    for key, value in published.items():
        section, field = key.split(".")
        assert getattr(getattr(cfg, section), field) == value, key
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (model / "tokenizer.json").write_text("{}")
    (model / "pytorch_model.bin").write_bytes(b"")
    if cfg.data.problem_key == "prompt":  # verl's format, as DAPO-Math-17k ships it
        data = tmp_path / "train.parquet"
        pd.DataFrame({"prompt": [[{"role": "user", "content": "Solve 1+1. Answer: $Answer"}]],
                      "reward_model": [{"ground_truth": "2", "style": "rule-lighteval/MATH_v2"}]}).to_parquet(data)
    else:
        data = tmp_path / "train.jsonl"
        data.write_text(json.dumps({"problem": "1+1", "answer": "2"}) + "\n")
    cfg = load_config(CONFIGS / name, [f"model.path={model}", f"data.dataset={data}"])
    validate(cfg, world=world)
    rows = load_dataset(str(data), problem_field=cfg.data.problem_key, answer_field=cfg.data.answer_key)
    assert [(r.problem, r.answer) for r in rows][:1] in ([("Solve 1+1. Answer: $Answer", "2")], [("1+1", "2")])
