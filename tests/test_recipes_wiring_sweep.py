"""Hostile sweep of how the trainer wires the recipes (DAPO's dynamic sampling and overlong shaping, the
aggregation and clip defaults each algorithm names, PACS's options, micro-batch splits), end to end through
:func:`pacs_fast.trainer.train` on the built-in tiny model, checked against what the step itself recorded
(``samples.jsonl`` / ``metrics.jsonl``) recomputed by hand with DESIGN.md's and the papers' formulas.

The verifier is replaced by a deterministic reward of the response text (its length's parity), so that groups
have mixed rewards on a barely warmed-up model (the math verifier gives all-zero groups there)."""
import math

import pytest
import torch

from pacs_fast.trainer.metrics import read_jsonl

G, P, MAX_NEW, BUFFER = 4, 4, 4, 2
TINY = ["data.arith_ops=+", "data.arith_max_digits=1", "data.eval_size=2", f"rollout.n={G}", "rollout.eval_n=1",
        f"rollout.max_new_tokens={MAX_NEW}", f"train.prompts_per_step={P}", f"learner.mini_batch_prompts={P}",
        "warmup.steps=30", "warmup.batch_size=32", "model.tiny_hidden_size=64", "model.tiny_num_layers=1",
        "learner.lr=3e-3", "train.progress=false", "train.tensorboard=false", "train.plots=false", "train.steps=1",
        "train.eval_every=0", "train.save_every=0", f"train.log_samples={P * G}",
        "reward.fn=test_recipes_wiring_sweep:parity"]


def parity(problems, responses, answers):
    """A reward in {0, 1} of the response text alone (mixed groups on any policy)."""
    return [float(len(r) % 2) for r in responses]


def constant(problems, responses, answers):
    return [1.0 for _ in responses]


@pytest.fixture(scope="module")
def cache(warm_cache):
    return str(warm_cache)


def run(tmp_path, cache, name, extra):
    """One step; ``(train record, samples rows)``."""
    from pacs_fast.config import load_config
    from pacs_fast.trainer import train
    out = tmp_path / name
    train(load_config(None, TINY + [f"warmup.cache_dir={cache}", *extra]), out)
    rec = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "train"]
    rows = [r for r in read_jsonl(out / "samples.jsonl") if "row" in r]
    assert len(rec) == 1
    return rec[0], rows


def groups_of(rows, key="reward"):
    return [[r[key] for r in rows[i:i + G]] for i in range(0, len(rows), G)]


# ---------------------------------------------------------------- DAPO dynamic sampling

def test_dynamic_sampling_trains_only_mixed_groups_and_reports_it(tmp_path, cache):
    rec, rows = run(tmp_path, cache, "ds", ["algo.name=grpo", "rollout.filter_groups=true",
                                             "rollout.max_gen_batches=6"])
    assert len(rows) == P * G
    for g in groups_of(rows):  # no all-equal group trains
        assert max(g) != min(g), g
    assert rec["rollout/trained_groups"] == P
    assert rec["rollout/prompts_drawn"] == rec["rollout/gen_rounds"] * P
    # kept_frac: kept over generated groups, at least what trained
    assert P / rec["rollout/prompts_drawn"] <= rec["rollout/kept_frac"] <= 1.0
    # the step's reward metrics are those of the kept rows, not of every round's
    R = torch.tensor([r["reward"] for r in rows], dtype=torch.float64)
    assert rec["reward/mean"] == pytest.approx(float(R.mean()), abs=1e-7)  # float32 sum of 16 values in {0, 1}
    assert rec["reward/all_correct_groups"] == 0 and rec["reward/all_wrong_groups"] == 0


def test_dynamic_sampling_with_nothing_left_stops_the_run(tmp_path, cache):
    from pacs_fast.trainer.loop import TrainingStopped
    with pytest.raises(TrainingStopped, match=r"kept no group in 2 generation rounds"):
        run(tmp_path, cache, "none", ["algo.name=grpo", "rollout.filter_groups=true", "rollout.max_gen_batches=2",
                                      "reward.fn=test_recipes_wiring_sweep:constant"])


# ---------------------------------------------------------------- DAPO overlong shaping

OL_MAX_NEW, OL_BUFFER = 8, 6  # (at 4 / 2 every response was 4 tokens long: one penalty for all, any row order passed)


def _penalty(L, factor, max_new=OL_MAX_NEW, buffer=OL_BUFFER):
    return min(max(-(L - (max_new - buffer)) / buffer * factor, -factor), 0.0)


@pytest.mark.parametrize("name", ["grpo", "pacs"])
def test_overlong_penalty_lands_on_the_right_rows_before_the_group_statistics(tmp_path, cache, name):
    factor = 0.5
    rec, rows = run(tmp_path, cache, f"ol_{name}", [f"algo.name={name}", f"rollout.max_new_tokens={OL_MAX_NEW}",
                                                    f"reward.overlong_buffer_len={OL_BUFFER}",
                                                    f"reward.overlong_penalty={factor}"])
    assert len(rows) == P * G
    # lengths that differ within the batch (4, 5 and 8 tokens on this seed): a penalty on the wrong row fails below
    assert len({_penalty(r["response_tokens"], factor) for r in rows}) >= 2, [r["response_tokens"] for r in rows]
    shaped = []
    for r in rows:  # each row's own length: response tokens, EOS included (verl's valid_response_length)
        want = r["reward"] + _penalty(r["response_tokens"], factor)
        if name == "pacs":
            want = min(max(want, 0.0), 1.0)  # PACS's BCE label
        assert r["trained_reward"] == pytest.approx(want, abs=1e-6), r  # float32 of a value with 2 binary digits
        shaped.append(want)
    pen = [_penalty(r["response_tokens"], factor) for r in rows]
    assert rec["reward/overlong_frac"] == pytest.approx(sum(p < 0 for p in pen) / len(pen))
    assert rec["reward/overlong_penalty_mean"] == pytest.approx(sum(pen) / len(pen), abs=1e-6)
    assert rec["reward/shaped_mean"] == pytest.approx(sum(shaped) / len(shaped), abs=1e-6)
    assert rec["reward/mean"] == pytest.approx(sum(r["reward"] for r in rows) / len(rows), abs=1e-6)  # verifier's
    if name == "grpo":  # the advantages are the shaped rewards' group statistics (penalty before normalising)
        S = torch.tensor(shaped, dtype=torch.float64).view(-1, G)
        adv = (S - S.mean(1, keepdim=True)) / (S.std(1, keepdim=True) + 1e-6)
        # float32 advantages; a near-zero std turns 1e-7 of rounding into 1e-1, so compare the mean of |A|
        assert rec["learner/adv_abs_mean"] == pytest.approx(float(adv.abs().mean()), abs=1e-4)


# ---------------------------------------------------------------- micro-batch splits

SPLIT_CASES = {
    "grpo": ["algo.name=grpo"],
    "dapo": ["algo.name=grpo", "algo.clip_high=0.28", "reward.overlong_buffer_len=2", "learner.mask_truncated=true"],
    "dr_grpo": ["algo.name=dr_grpo"],
    "gspo": ["algo.name=gspo"],
    "cispo": ["algo.name=cispo"],
    "pacs": ["algo.name=pacs", "algo.proxy=mean_logp"],
}


@pytest.mark.parametrize("case", sorted(SPLIT_CASES))
def test_micro_batch_split_leaves_the_step_unchanged(tmp_path, cache, monkeypatch, case):
    """One mini-batch of 4 groups in one micro-batch vs four: the same rollouts (same seeds), so the loss and the
    gradient norm (before clipping) must agree to float32 accumulation error (sums of <= 64 terms: 1e-5 relative).
    The learner's micro-batch cuts are recorded: the update of each run cut its mini-batch as asked."""
    from pacs_fast.learner.torch_learner import TorchLearner

    cuts, real = [], TorchLearner._micro_batches
    monkeypatch.setattr(TorchLearner, "_micro_batches", lambda self, *a, **k: cuts.append(real(self, *a, **k))
                        or cuts[-1])
    whole, _ = run(tmp_path, cache, f"{case}_1", SPLIT_CASES[case] + [f"learner.micro_batch_prompts={P}"])
    assert cuts and all(len(c) == 1 for c in cuts), cuts
    cuts.clear()
    split, _ = run(tmp_path, cache, f"{case}_4", SPLIT_CASES[case] + ["learner.micro_batch_prompts=1"])
    assert any(len(c) == P for c in cuts) and all(len(c) in (1, P) for c in cuts), cuts
    for key in ("learner/loss", "learner/grad_norm"):
        assert split[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-6), key


# ---------------------------------------------------------------- PACS's options, from the recorded terms

def _pacs_loss(proxy, R, score, weight):
    r = torch.tensor(proxy, dtype=torch.float64).view(-1, G)
    y = torch.tensor(R, dtype=torch.float64).view(-1, G)
    S = r.sum(1, keepdim=True)
    psi = {"rloo": r - (S - r) / (G - 1), "grpo": (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6),
           "dr_grpo": r - r.mean(1, keepdim=True), "naive": r}[score]
    if weight == "question":
        n1 = y.sum(1, keepdim=True)
        n = torch.where(y > 0.5, n1, G - n1)
        mixed = (n1 > 0) & (n1 < G)
        w = torch.where(mixed, G / (2 * n), torch.ones_like(y))
    else:
        w = {"none": torch.ones_like(y), "only_positive": y, "only_negative": 1 - y}[weight]
    return float((w * (torch.nn.functional.softplus(psi) - y * psi)).mean()), psi.flatten().tolist()


@pytest.mark.parametrize("score, weight, beta", [("rloo", "question", 1.0), ("grpo", "none", 1.0),
                                                 ("dr_grpo", "only_positive", 0.5), ("naive", "only_negative", 1.0)])
def test_pacs_options_reach_the_loss(tmp_path, cache, score, weight, beta):
    """PACS's loss of the step from its recorded per-row proxies (mean_logp: non-zero at the rollout policy) and
    rewards, with DESIGN.md section 1's score / weight formulas; one mini-batch, so learner/loss is that loss."""
    rec, rows = run(tmp_path, cache, f"pacs_{score}_{weight}",
                    ["algo.name=pacs", "algo.proxy=mean_logp", f"algo.score={score}", f"algo.weight={weight}",
                     f"algo.beta={beta}"])
    proxy = [r["proxy"] for r in rows]
    want, psi = _pacs_loss(proxy, [r["reward"] for r in rows], score, weight)
    # the recorded proxy is float32 (about 1e-7 relative on values near 1); the grpo score divides by a std of order 1
    assert [r["psi"] for r in rows] == pytest.approx(psi, abs=1e-4)
    assert rec["learner/loss"] == pytest.approx(want, abs=1e-5)


# ---------------------------------------------------------------- clip defaults and aggregation reach the loss

@pytest.mark.parametrize("name, clips, agg", [("gspo", (3e-4, 4e-4), "seq-mean-token-mean"),
                                              ("cispo", (10.0, 0.2), "token-mean")])
def test_the_algorithm_s_clip_defaults_and_aggregation_reach_its_loss(tmp_path, cache, monkeypatch, name, clips, agg):
    from pacs_fast.algorithms import sequence_losses
    seen = []
    real = getattr(sequence_losses, f"{name}_policy_loss")

    def spy(*a, **kw):
        seen.append((kw["clip_low"], kw["clip_high"], kw["loss_agg_mode"], kw["global_count"]))
        return real(*a, **kw)

    monkeypatch.setattr(sequence_losses, f"{name}_policy_loss", spy)
    rec, rows = run(tmp_path, cache, f"clip_{name}", [f"algo.name={name}", "learner.micro_batch_prompts=1"])
    assert seen and all(s[:3] == (*clips, agg) for s in seen), seen
    # the global denominators are the mini-batch's (sequences for seq-mean-*, tokens for token-mean)
    want = rec["response/tokens"] if agg == "token-mean" else float(P * G - sum(r["response_tokens"] == 0
                                                                                  for r in rows))
    assert all(s[3] == want for s in seen), (seen, want)
