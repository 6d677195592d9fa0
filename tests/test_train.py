"""The trainer end to end on CPU: outputs of a run, exact resume after SIGKILL, early errors."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pacs_fast.trainer.metrics import deterministic_view, read_jsonl

# A tiny run: 1-digit sums, 3 prompts x 4 samples, short warm-up (cached per test session).
TINY = ["data.arith_ops=+", "data.arith_max_digits=1", "data.eval_size=8", "rollout.n=4", "rollout.eval_n=2", "rollout.max_new_tokens=6",
        "train.prompts_per_step=4", "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=1",
        "warmup.steps=30", "warmup.batch_size=32", "model.tiny_hidden_size=64", "model.tiny_num_layers=1",
        "learner.lr=3e-3", "train.progress=false", "train.tensorboard=true"]


@pytest.fixture(scope="module")
def cache(warm_cache):
    return str(warm_cache)  # the session's shared warm-up cache (conftest.py)


def run_cli(args, **kw):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "pacs_fast.train", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def test_run_outputs(tmp_path, cache, seed):
    from pacs_fast.config import load_config
    from pacs_fast.trainer import train
    # a fixed reference, reset to the policy before step 3; one optimiser step per update, and an entropy
    # bonus so that it moves the policy even where every group's rewards are equal
    cfg = load_config(None, TINY + [f"warmup.cache_dir={cache}", "train.steps=3", "train.eval_every=2",
                                    "train.save_every=2", f"train.seed={seed % 1000}", "algo.ref=fixed",
                                    "algo.reset_every=2", "learner.mini_batch_prompts=4", "algo.entropy_coef=0.05"])
    run = tmp_path / "run"
    summary = train(cfg, run)
    records = read_jsonl(run / "metrics.jsonl")
    kinds = [(r["kind"], r["step"]) for r in records]
    assert kinds == [("eval", 0), ("train", 1), ("train", 2), ("eval", 2), ("checkpoint", 2), ("train", 3),
                     ("eval", 3), ("checkpoint", 3)]
    train_rec = [r for r in records if r["kind"] == "train"]
    for key in ("reward/mean", "entropy", "learner/grad_norm", "response/length", "pacs/psi_mean",
                "pacs/brier", "pacs/pred_reward_mean", "time/rollout", "time/update", "perf/tokens_per_s",
                "rollout/logprob_diff_mean", "rollout/logprob_diff_max"):
        assert key in train_rec[0], key
    assert all(r["rollout/logprob_diff_max"] < 1e-3 for r in train_rec)  # the engine shares the policy
    # |log pi - log pi_ref| before each step's update: 0 at step 1 (reference = initial policy), one update
    # away at step 2 (measured ~3.9), ~0 at step 3 (the reset; measured 0.0)
    proxy = [r["pacs/proxy_abs_mean"] for r in train_rec]
    assert proxy[0] < 1e-4 and proxy[1] > 1e-2 and proxy[2] < 1e-4, proxy
    assert 0 <= summary["acc_before"] <= 1 and summary["acc_after"] == records[-2]["eval/acc"]
    assert json.loads((run / "summary.json").read_text())["steps"] == 3
    assert any((run / "tb").iterdir()) and (run / "plots" / "curves.png").stat().st_size > 0
    # checkpoints: the newest two, complete, loadable by transformers
    ckpts = sorted(p.name for p in (run / "checkpoints").glob("step_*"))
    assert ckpts == ["step_000002", "step_000003"]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000003"
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_000003")
    tok = AutoTokenizer.from_pretrained(run / "checkpoints" / "step_000003")
    assert model.config.hidden_size == 64 and tok.eos_token_id is not None
    assert not list((run / "checkpoints").glob(".tmp-*"))


def test_resume_after_sigkill_matches_uninterrupted_run(tmp_path, cache):
    # a fixed reference reset before steps 3, 5, 7, 9: the resumed step 4 equals the uninterrupted one only if
    # step 3's checkpoint restored it; an entropy bonus moves the policy even when every reward is 0
    common = TINY + [f"warmup.cache_dir={cache}", "train.steps=10", "train.eval_every=5", "train.save_every=3",
                     f"train.out_dir={tmp_path}", "train.seed=3", "algo.ref=fixed", "algo.reset_every=2",
                     "algo.entropy_coef=0.05"]
    # warm the cache in-process first so both runs start alike and quickly
    full = run_cli(common + ["train.run_name=full"])
    out, _ = full.communicate(timeout=300)
    assert full.returncode == 0, out
    killed_dir = tmp_path / "killed"
    proc = run_cli(common + ["train.run_name=killed"])
    deadline = time.time() + 300
    while time.time() < deadline:  # kill -9 right after the first checkpoint, mid-run
        recs = read_jsonl(killed_dir / "metrics.jsonl")
        if any(r["kind"] == "train" and r["step"] == 4 for r in recs):
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert (killed_dir / "checkpoints" / "step_000003").is_dir()
    resumed = run_cli(["--resume", str(killed_dir)])
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    assert "resumed from" in out
    a = deterministic_view(read_jsonl(tmp_path / "full" / "metrics.jsonl"))
    b = deterministic_view(read_jsonl(killed_dir / "metrics.jsonl"))
    assert [(r["kind"], r["step"]) for r in b] == [(r["kind"], r["step"]) for r in a]
    assert a == b
    assert json.loads((killed_dir / "summary.json").read_text())["acc_after"] == \
        json.loads((tmp_path / "full" / "summary.json").read_text())["acc_after"]


def write_jsonl(path: Path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("case", ["no_answers", "bad_model", "bad_key", "bad_batch", "no_checkpoint"])
def test_bad_input_fails_fast_with_a_clear_error(tmp_path, case, capsys):
    from pacs_fast.train import main
    data = write_jsonl(tmp_path / "d.jsonl", [{"problem": "1+1"}, {"problem": "2+2"}])
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"model_type": "qwen2"}')  # an HF folder: the data error comes first
    (model_dir / "tokenizer.json").write_text("{}")
    (model_dir / "pytorch_model.bin").write_bytes(b"")  # (a weights file is checked present)
    args = {
        "no_answers": [f"data.dataset={data}", f"model.path={model_dir}"],
        "bad_model": [f"model.path={tmp_path / 'missing'}"],
        "bad_key": ["rollout.temprature=0.5"],
        "bad_batch": ["train.prompts_per_step=6", "learner.mini_batch_prompts=4"],
        "no_checkpoint": ["--resume", str(tmp_path)],
    }[case]
    if case == "no_checkpoint":  # a damaged one (with none at all, --resume starts the run again from step 0)
        (tmp_path / "config.yaml").write_text("train:\n  steps: 2\n")
        (tmp_path / "checkpoints" / "step_000001").mkdir(parents=True)
    else:
        args = args + [f"train.out_dir={tmp_path / 'runs'}"]
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    want = {"no_answers": "missing field 'answer'", "bad_model": "does not exist", "bad_key": "rollout.temperature",
            "bad_batch": "must divide", "no_checkpoint": "no usable checkpoint"}[case]
    assert want in err, err
    assert not list(tmp_path.rglob("metrics.jsonl")) and not list(tmp_path.rglob("*.safetensors"))


def test_logprob_mismatch_compares_temperature_1_log_probs(seed):
    """The rollout-vs-learner metric: engine log-probs are temperature-1 ones, so at another sampling
    temperature the learner's temperature-1 log-probs (an extra forward) are compared, not old_logp."""
    import torch

    from pacs_fast.rollout.base import Completion
    from pacs_fast.trainer.batch import build_batch, response_values
    from pacs_fast.trainer.step import logprob_mismatch

    gen = torch.Generator().manual_seed(seed)
    prompts = [[1, 2], [3]]
    resp = [[[4, 5], [6]], [[7, 8, 9], []]]
    engine_lp = [[(-torch.rand(len(r), generator=gen)).tolist() for r in g] for g in resp]
    comps = [[Completion(r, "", "stop", lp) for r, lp in zip(g, lps)] for g, lps in zip(resp, engine_lp)]
    batch = build_batch(prompts, resp, [0.0] * 4, pad_id=0)
    mask = batch.response_mask
    noise = 1e-3 * torch.rand(mask.shape, generator=gen) * mask
    at_t1 = response_values(prompts, engine_lp, mask.shape) + noise
    want_mean, want_max = float(noise[mask > 0].double().mean()), float(noise[mask > 0].max())

    class FakeLearner:
        temperature = 0.5

        def compute_logprobs(self, b):
            return at_t1 if self.temperature == 1.0 else 2 * at_t1

    learner = FakeLearner()
    batch.old_logp = 2 * at_t1  # the learner's log-probs at the sampling temperature
    got = logprob_mismatch(learner, batch, prompts, comps, temperature=0.5, extra_forward=True)
    # (engine + noise) - engine in fp32 recovers the noise to ~1e-7 absolute (engine values ~ -1)
    assert got["rollout/logprob_diff_mean"] == pytest.approx(want_mean, abs=1e-6)
    assert got["rollout/logprob_diff_max"] == pytest.approx(want_max, abs=1e-6)
    assert learner.temperature == 0.5
    assert logprob_mismatch(learner, batch, prompts, comps, temperature=0.5, extra_forward=False) == {}
    batch.old_logp = at_t1  # at temperature 1 the step's old log-probs are used directly
    got = logprob_mismatch(learner, batch, prompts, comps, temperature=1.0, extra_forward=False)
    assert got["rollout/logprob_diff_max"] == pytest.approx(want_max, abs=1e-6)
    comps[0][0].logprobs = None  # an engine without log-probs: no metric
    assert logprob_mismatch(learner, batch, prompts, comps, temperature=1.0, extra_forward=True) == {}
