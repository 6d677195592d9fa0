"""Staleness truth (asynchronous rollouts, K = 1, one HF engine process): the ``policy_version`` a step's
records and ``samples.jsonl`` rows claim is the policy that really generated them.

Independent check: with ``train.save_every=1`` checkpoint ``step_N`` holds the policy after step N and
version 0 is the run's input model (recorded by the checkpoints' ``trainer_state.json`` as
``model_files.path``). Every logged response's token log-probs are recomputed with a plain transformers
float64 forward of every version; the engine's own log-probs are not written out, but at temperature 1 the
step record compares them with the learner's (``rollout/logprob_diff_*`` = |engine - learner| per token)
and the off-policy correction's ``correction/kl_k1`` / ``seq_log_ratio_*`` are built from
(proximal - behaviour) with behaviour = the engine's log-probs. With behaviour = checkpoint v (the claimed
version) and proximal = checkpoint step-1 (the learner's policy when it trains step ``step``) the
recomputed statistics equal the recorded ones to fp32 rounding, and no other version does.
"""
import json

import pytest
import torch

from forked_torchrun import launch_env, torchrun_command
from pacs_fast.trainer.metrics import read_jsonl
from test_async_rollouts import TINY

pytestmark = [pytest.mark.distributed]

STEPS = 4


def _run(tmp_path, warm_cache):
    import subprocess

    args = TINY + [f"train.out_dir={tmp_path}", f"warmup.cache_dir={warm_cache}", f"train.steps={STEPS}",
                   "rollout.ranks=1", "rollout.max_staleness=1", "train.log_samples=1000",
                   f"train.keep_checkpoints={STEPS + 1}", "train.run_name=truth"]
    proc = subprocess.run(torchrun_command(2, "-m", "pacs_fast.train", *args), env=launch_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    return tmp_path / "truth"


def _token_logprobs(model, prompt_ids, response_ids, vocab):
    """Log-probs of the response tokens at temperature 1 over the tokenizer's ``vocab`` ids (the tiny model's LM
    head has padded rows >= len(tokenizer), cut by the engine and the learner alike: pacs_fast/rollout/hf.py)."""
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :, :vocab].double()
    lp = torch.log_softmax(logits[len(prompt_ids) - 1:-1], -1)
    return lp.gather(-1, torch.tensor(response_ids)[:, None])[:, 0]


def _stats(behaviour, proximal):
    """The step record's statistics from per-row (behaviour, proximal) token log-prob tensors."""
    diff = torch.cat([(b - p).abs() for b, p in zip(behaviour, proximal)])
    lr = torch.cat([p - b for b, p in zip(behaviour, proximal)])
    seq = torch.stack([(p - b).sum() for b, p in zip(behaviour, proximal)])
    return {"rollout/logprob_diff_mean": float(diff.mean()), "rollout/logprob_diff_max": float(diff.max()),
            "correction/kl_k1": float((-lr).mean()), "correction/seq_log_ratio_mean": float(seq.mean()),
            "correction/seq_log_ratio_min": float(seq.min()), "correction/seq_log_ratio_max": float(seq.max())}


@pytest.mark.timeout(300)
def test_recorded_policy_version_is_the_generating_policy(tmp_path, warm_cache):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = _run(tmp_path, warm_cache)
    recs = {r["step"]: r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"}
    samples = read_jsonl(run / "samples.jsonl", raw=True)

    # the README's promises at K = 1: generated one update ahead after the first step, never staler than 1
    assert sorted(recs) == list(range(1, STEPS + 1))
    assert [recs[s]["rollout/staleness"] for s in recs] == [0] + [1] * (STEPS - 1)
    assert [recs[s]["rollout/policy_version"] for s in recs] == [0] + list(range(STEPS - 1))
    for s, r in recs.items():
        assert r["rollout/policy_version"] == s - 1 - r["rollout/staleness"] and 0 <= r["rollout/staleness"] <= 1
    # every row of every step logged, each with its group's version = the step's record (no dynamic sampling)
    per_step = {s: [x for x in samples if x["step"] == s] for s in recs}
    n = 16  # train.prompts_per_step=4 x rollout.n=4
    assert all(len(rows) == n and sorted(x["row"] for x in rows) == list(range(n)) for rows in per_step.values())
    assert all(x["policy_version"] == recs[x["step"]]["rollout/policy_version"] for x in samples)

    state = json.loads((run / "checkpoints" / f"step_{STEPS:06d}" / "trainer_state.json").read_text())
    paths = {0: state["model_files"]["path"]}
    paths.update({v: str(run / "checkpoints" / f"step_{v:06d}") for v in range(1, STEPS)})
    tok = AutoTokenizer.from_pretrained(paths[0])
    models = {v: AutoModelForCausalLM.from_pretrained(p, dtype=torch.float64).eval() for v, p in paths.items()}
    # the versions really differ (lr 3e-3): otherwise the check below could not tell them apart
    w = {v: next(m.parameters()) for v, m in models.items()}
    assert all(not torch.equal(w[a], w[a + 1]) for a in range(STEPS - 1))

    # the exact tokens and the engine's own log-probs: with train.save_every=1 checkpoint step_N keeps the batch in
    # flight (batch N+1, the one step N+1 trains; README) with its completions. Step 1's batch is kept by no checkpoint
    # (its logged text drops sampled special tokens, so it cannot be re-encoded): its record is checked below.
    for s in range(2, STEPS + 2):
        kept = torch.load(run / "checkpoints" / f"step_{s - 1:06d}" / "trainer_state.pt", weights_only=False)
        (batch,) = [b for b in kept["in_flight"] if b["index"] == s]
        claimed = batch["version"]
        c = batch["comps"]
        assert all(c["has_logprobs"]) and c["per_prompt"] == [4] * 4
        ends = torch.cumsum(c["lengths"], 0).tolist()
        starts = [0] + ends[:-1]
        resp = [c["token_ids"][a:b].tolist() for a, b in zip(starts, ends)]
        engine = [c["logprobs"][a:b].double() for a, b in zip(starts, ends)]
        prompts = [list(pr["prompt_ids"]) for pr, k in zip(batch["problems"], c["per_prompt"]) for _ in range(k)]
        lps = {v: [_token_logprobs(m, p, r, len(tok)) for p, r in zip(prompts, resp)] for v, m in models.items()}
        # the engine's log-probs are checkpoint `claimed`'s (fp32 engine vs float64 here) and no other version's
        err = {v: max(float((e - lp).abs().max()) for e, lp in zip(engine, lps[v])) for v in models}
        assert err[claimed] < 1e-5, (s, claimed, err)  # seen: <= 6e-7
        assert all(err[v] > 0.1 for v in models if v != claimed), (s, claimed, err)  # seen: >= 0.7
        if s > STEPS:  # requested past train.steps: generated, never trained
            assert claimed == STEPS - 1
            continue
        rec = recs[s]
        assert claimed == rec["rollout/policy_version"]
        # samples.jsonl's rows of step s are this batch (its texts, in order) and carry its version
        rows = sorted(per_step[s], key=lambda x: x["row"])
        assert [x["response"] for x in rows] == c["texts"] and [x["response_tokens"] for x in rows] == c["lengths"].tolist()
        assert all(x["policy_version"] == claimed for x in rows)
        # the record's mismatch / correction statistics: behaviour = the engine (= checkpoint `claimed`),
        # proximal = checkpoint s-1, the learner's policy when it trains step s
        for behaviour in (engine, lps[claimed]):
            got = _stats(behaviour, lps[s - 1])
            for k, v in got.items():  # fp32 engine and learner vs float64: seen <= 9e-7
                assert abs(rec[k] - v) <= 5e-6 + 1e-5 * abs(v), (s, k, rec[k], v)
        for other in set(models) - {claimed, s - 1}:  # another behaviour version would not give the record
            alt = _stats(lps[other], lps[s - 1])
            assert max(abs(rec[k] - alt[k]) for k in alt) > 1e-3, (s, claimed, other)

    # step 1: staleness 0, the learner's proximal policy is the engine's (version 0): every statistic ~0
    r1 = recs[1]
    assert r1["rollout/logprob_diff_max"] < 1e-5 and abs(r1["correction/kl_k1"]) < 1e-6
    assert max(abs(r1[k]) for k in ("correction/seq_log_ratio_min", "correction/seq_log_ratio_max")) < 1e-5
