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
