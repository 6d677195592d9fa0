"""Hostile sweep of the asynchronous-rollout layout (``rollout.ranks=R rollout.max_staleness=K``; 2026-12-06):
what tests/test_async_rollouts.py, test_async_scaleout.py and test_async_checkpoint_batches.py do not cover.

Found and fixed (each failed before its fix):
- ``data/epoch`` of a step was the sampler's epoch after the batches requested *ahead* (K of them), not the epoch of
  the batch the step trained: at K = 1 on 8 problems of 4 a step, step 2 (prompts 4-7, epoch 0) said epoch 1 and
  step 4 said 2. Each batch in flight now keeps the epoch of its prompts (kept by a checkpoint too).
- With dynamic sampling (``rollout.filter_groups``) every ``samples.jsonl`` row of a step said the *oldest* policy
  version among the step's groups: rows of a group generated one update later were labelled one update staler
  (step 4: ``rollout/staleness_mean`` 0.75, its rows' mean 1.0). Each row now has its own group's version.
- A learner that stopped on its own error (``RemoteEngines.close(wait=False)``) left the engine waiting for the learner
  to take its pending replies; the learner's exit broke the connection and the engine printed a second, misleading
  error line ("another rank of this launch stopped ... continue with --resume") and failed too. The stop message now
  says the replies are abandoned: the engine exits cleanly and the learner's line is the only one.

Checked and held (each can fail): a dead engine process ends the run at once with one error line and the run
resumes from its last checkpoint with the batch kept there; two HF engine processes in lock-step give the
one-process run's records and weights (the prompt split, the per-prompt seeds, the order of the replies); a
Qwen2.5-shaped model (tied embeddings, grouped-query heads, ChatML BPE tokenizer) trained through the engine process:
after every weight push the engine samples with exactly the learner's policy (its log-probs of the sampled tokens
equal the learner's to 1e-4 while the weights move).
"""
import os
import signal
import subprocess
import sys

import pytest
import torch

from forked_torchrun import BASE, launch_env, torchrun_command
from pacs_fast.trainer.async_loop import RemoteRounds
from pacs_fast.trainer.metrics import deterministic_view, read_jsonl
from test_async_checkpoint_batches import Engines, _session
from test_async_rollouts import TINY, _train

pytestmark = [pytest.mark.distributed]


def _launch(n: int, args, *, preload=BASE, env=None, ok=True, timeout=300):
    proc = subprocess.run(torchrun_command(n, "-m", "pacs_fast.train", *args, preload=preload),
                          env=env or launch_env(), capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    if ok:
        assert proc.returncode == 0, out[-5000:]
    return proc.returncode, out


def test_a_step_records_the_epoch_of_the_batch_it_trains():
    """In process (the engines a recorder): 10 problems, 2 a batch, K = 1. Step 5 trains batch 5 (the last prompts
    of epoch 0) while batch 6, requested ahead, has begun epoch 1; a checkpoint keeps each batch's epoch."""
    s, engines = _session(), Engines()
    rounds = RemoteRounds(s, engines)
    epochs = []
    for step in range(1, 7):
        rounds.begin_step()
        assert rounds.next().index == step
        epochs.append(rounds.epoch)
        if step == 4:
            kept, position = rounds.checkpoint_batches(), s.sampler.state_dict()
    assert epochs == [0, 0, 0, 0, 0, 1]
    assert [(b["index"], b["epoch"]) for b in kept] == [(5, 0)] and position["epoch"] == 0
    s2 = _session(batches=4)  # the resume from step 4's checkpoint: batch 5 is still epoch 0's
    s2.sampler.load_state_dict(position)
    resumed = RemoteRounds(s2, Engines(), saved=kept)
    got = []
    for _ in range(2):
        resumed.begin_step()
        resumed.next()
        got.append(resumed.epoch)
    assert got == [0, 1]


# K = 1 with dynamic sampling on 8 training problems (4 a batch): epochs turn every 2 batches, and a step takes one or
# two batches (label noise mixes the groups), so that a step's groups come from batches of different versions
EPOCHS = TINY + ["rollout.ranks=1", "rollout.max_staleness=1", "rollout.filter_groups=true",
                 "rollout.max_gen_batches=3", "reward.noise_fp=0.3", "data.arith_train_size=8", "data.shuffle=false",
                 "train.log_samples=16"]


@pytest.mark.timeout(300)
def test_epoch_and_sample_versions_are_those_of_the_trained_batches(tmp_path, warm_cache):
    common = EPOCHS + [f"train.out_dir={tmp_path}", f"warmup.cache_dir={warm_cache}"]
    _launch(2, common + ["train.run_name=full", "train.steps=6"])
    recs = _train(tmp_path / "full")
    assert [r["step"] for r in recs] == list(range(1, 7))
    batches = 0
    for r in recs:  # a step's epoch: that of its last batch's prompts (batch b holds prompts 4(b-1)..4b-1 of 8)
        batches += int(r["rollout/gen_rounds"])
        assert r["data/epoch"] == (4 * batches - 1) // 8, (r["step"], batches, r["data/epoch"])
    samples = read_jsonl(tmp_path / "full" / "samples.jsonl", raw=True)
    mixed = 0
    for r in recs:  # every trained group's rows are logged (16 = 4 groups x 4): their versions are the groups'
        rows = [x["step"] - 1 - x["policy_version"] for x in samples if x["step"] == r["step"]]
        assert len(rows) == 16 and max(rows) == r["rollout/staleness"]
        assert sum(rows) / len(rows) == pytest.approx(r["rollout/staleness_mean"]), r["step"]
        mixed += min(rows) != max(rows)
    assert mixed, "no step trained groups of two versions: the case is not exercised"

    # stopped after step 3 and extended to 6: the kept batches keep their epochs, the records and rows are the same
    split = tmp_path / "split"
    _launch(2, common + ["train.run_name=split", "train.steps=3"])
    _launch(2, ["--resume", str(split), "train.steps=6"])
    last = {r["step"]: r for r in deterministic_view(_train(split))}
    assert list(last.values()) == deterministic_view(recs)
    rows = {(x["step"], x["row"]): x["policy_version"] for x in read_jsonl(split / "samples.jsonl", raw=True)
            if "row" in x}  # (the resumed run's rows last: they replace the stopped run's, which match them anyway)
    assert rows == {(x["step"], x["row"]): x["policy_version"] for x in samples}


ENGINE_DIES = '''
import os
import signal

from pacs_fast.rollout import hf

_generate, _calls = hf.HFEngine.generate, [0]


def generate(self, *args, **kwargs):
    if os.environ.get("PACS_FAST_LAUNCH_RANK") == "0":  # the engine process (rollout.ranks=1), not the learner's
        _calls[0] += 1
        if _calls[0] == int(os.environ["ENGINE_DIES_AT"]):
            os.kill(os.getpid(), signal.SIGKILL)
    return _generate(self, *args, **kwargs)


hf.HFEngine.generate = generate
'''


@pytest.mark.timeout(300)
def test_a_dead_engine_process_ends_the_run_and_it_resumes(tmp_path, warm_cache):
    """The engine process is killed (SIGKILL) when asked for batch 4 (K = 1: during step 3): the learner stops at once
    (no hang) without a traceback, and ``--resume`` trains every step once from the last checkpoint, whose batch in
    flight was kept. Two endings race, both right: the learner notices the lost engine first and prints the one
    "another rank of this launch stopped" line, or torchrun (which polls its ranks every 0.1 s) stops it first, while
    it computes step 3, and torchrun's own report naming rank 0's SIGKILL is the launch's account (the learner, rank 1,
    prints no "stopped by" line: a user's stop is printed by rank 0). On the CI's loaded 2 cores both happen; the
    line's own path (and torchrun's stop arriving while the loss unwinds) is held in test_user_reward.py."""
    (tmp_path / "engine_dies.py").write_text(ENGINE_DIES)
    run = tmp_path / "run"
    common = TINY + [f"train.out_dir={tmp_path}", f"warmup.cache_dir={warm_cache}", "train.run_name=run",
                     "train.steps=5", "rollout.ranks=1", "rollout.max_staleness=1"]
    env = launch_env(PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]), ENGINE_DIES_AT="4")
    code, out = _launch(2, common, preload=BASE + ("engine_dies",), env=env, ok=False)
    assert code != 0, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) <= 1 and "stopped by" not in out, out[-3000:]
    assert all("another rank of this launch stopped" in e and f"--resume {run}" in e for e in errors), errors
    assert "pacs_fast/" not in out, out[-3000:]  # (no traceback of the library's)
    assert "SIGKILL" in out or f"exitcode: {-signal.SIGKILL}" in out, out[-3000:]  # (torchrun names the engine's end)
    latest = (run / "checkpoints" / "latest").read_text().strip()
    assert latest == "step_000002", latest
    assert [r["step"] for r in _train(run)] == [1, 2, 3] or [r["step"] for r in _train(run)] == [1, 2]
    _, out = _launch(2, ["--resume", str(run)])
    assert "1 batch(es) in flight at the step-2 checkpoint" in out
    assert sorted({r["step"] for r in _train(run)}) == [1, 2, 3, 4, 5]
    assert [r["step"] for r in deterministic_view(_train(run))] == [1, 2, 3, 4, 5]


@pytest.mark.timeout(300)
def test_a_learner_error_is_the_only_error_line(tmp_path, warm_cache):
    """The learner stops on its own error (dynamic sampling keeps no group of the barely warmed-up model) while the
    engine holds its reply to the batch requested ahead: the learner's line is the launch's only error line. The
    engine had waited for the learner to take that reply until the learner's exit broke the connection, then printed
    "another rank of this launch stopped while this one waited for it ... continue with --resume" (no checkpoint
    existed) after the learner's line and exited with an error of its own."""
    code, out = _launch(2, TINY + [f"train.out_dir={tmp_path}", f"warmup.cache_dir={warm_cache}", "train.run_name=run",
                                   "train.steps=3", "rollout.ranks=1", "rollout.max_staleness=1",
                                   "rollout.filter_groups=true", "rollout.max_gen_batches=1"], ok=False)
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert code != 0 and len(errors) == 1, out[-3000:]
    assert "step 1: rollout.filter_groups kept no group" in errors[0]
    assert "pacs_fast/" not in out  # (no traceback of the library's)


@pytest.mark.timeout(300)
def test_two_engine_processes_in_lockstep_equal_the_one_process_run(tmp_path, warm_cache):
    """R = 2 HF engines, K = 0: each engine generates its half of a step's prompts with the seeds the one-process
    engine gives them, and the driver puts the replies back in prompt order; records and weights are the one-process
    run's (the engines' own log-probs differ in the last bits: another batch composition)."""
    from safetensors.torch import load_file

    common = TINY + [f"train.out_dir={tmp_path}", f"warmup.cache_dir={warm_cache}", "train.steps=3",
                     "train.log_samples=16"]
    proc = subprocess.run([sys.executable, "-m", "pacs_fast.train", *common, "train.run_name=one"], env=launch_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _launch(3, common + ["train.run_name=two", "rollout.ranks=2", "rollout.max_staleness=0"])
    skip = ("rollout/generating_ranks", "rollout/logprob_diff_max", "rollout/logprob_diff_mean")
    one = deterministic_view(read_jsonl(tmp_path / "one" / "metrics.jsonl"))
    two = deterministic_view(read_jsonl(tmp_path / "two" / "metrics.jsonl"))
    assert [(r["kind"], r["step"]) for r in one] == [(r["kind"], r["step"]) for r in two]
    for a, b in zip(one, two):
        shared = set(a) & set(b) - set(skip)
        assert len(shared) >= len(a) - len(skip) and {k: a[k] for k in shared} == {k: b[k] for k in shared}
    for r in _train(tmp_path / "two"):
        assert r["rollout/generating_ranks"] == 2 and r["rollout/logprob_diff_max"] <= 1e-4
    rows = [[(x["prompt"], x["response"], x["reward"]) for x in read_jsonl(tmp_path / run / "samples.jsonl", raw=True)]
            for run in ("one", "two")]
    assert len(rows[0]) == 48 and rows[0] == rows[1]
    got, want = (load_file(tmp_path / run / "checkpoints" / "step_000003" / "model.safetensors")
                 for run in ("two", "one"))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)


@pytest.fixture(scope="module")
def qwen25_folder(tmp_path_factory):
    """A Qwen2.5-shaped model folder (0.5B's layout scaled down: tied embeddings, 2 query heads per key-value head,
    q/k/v biases) with the ChatML BPE tokenizer, in bf16 as Qwen2.5 ships, and a jsonl of problems."""
    import json

    from test_data_path_sweep import qwen_chatml_folder

    folder = tmp_path_factory.mktemp("qwen25") / "model"
    qwen_chatml_folder(folder, dtype=torch.bfloat16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       tie_word_embeddings=True)
    data = folder.parent / "problems.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"What is {i}+{i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(24)))
    return folder, data


@pytest.mark.timeout(300)
def test_the_engine_samples_with_the_pushed_policy_on_a_qwen25_shaped_model(tmp_path, qwen25_folder):
    """K = 0, a tied-embedding Qwen2.5-shaped model: before each update the engine's log-probs of its sampled tokens
    equal the learner's (a weight push that missed the tied head / embeddings, a bucket out of order or a stale copy
    would be off by the update's effect), while the weights move from step to step."""
    from safetensors.torch import load_file

    folder, data = qwen25_folder
    _launch(2, [f"model.path={folder}", f"data.dataset={data}", "data.eval_size=4", "rollout.n=4", "rollout.eval_n=1",
                "rollout.max_new_tokens=8", "train.prompts_per_step=4", "learner.mini_batch_prompts=2",
                "learner.micro_batch_prompts=1", "learner.lr=1e-2", "reward.noise_fp=0.3", "train.progress=false",
                "train.plots=false", "train.eval_every=0", "train.save_every=1", f"train.out_dir={tmp_path}",
                "train.run_name=run", "train.steps=3", "rollout.ranks=1", "rollout.max_staleness=0"])
    recs = _train(tmp_path / "run")
    assert [r["step"] for r in recs] == [1, 2, 3]
    for r in recs:
        assert r["rollout/policy_version"] == r["step"] - 1 and 0 <= r["rollout/logprob_diff_max"] <= 1e-4, r
    first = load_file(folder / "model.safetensors")
    last = load_file(tmp_path / "run" / "checkpoints" / "step_000003" / "model.safetensors")
    assert "lm_head.weight" not in last  # (tied: saved once, as the engine's folder has it)
    assert (first["model.embed_tokens.weight"].float() - last["model.embed_tokens.weight"].float()).abs().max() > 1e-3
