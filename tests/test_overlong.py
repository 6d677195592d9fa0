"""DAPO's overlong reward shaping (``reward.overlong_buffer_len`` / ``reward.overlong_penalty``) and
overlong filtering (``learner.mask_truncated``): the penalty against verl's DAPO reward manager and a
float64 statement of its formula, PACS's label, the batch and the step record, the loss of truncated
rows (zero gradient; PACS's groups scored over the members left, as the TRL adapter does), exact
micro-batch accumulation, the config's one-line errors, and 2-step runs."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from pacs_fast.algorithms import grpo_loss, pacs_loss
from pacs_fast.algorithms.overlong import loss_over_members, overlong_penalty, shaped_rewards


def _formula(L: float, L_max: int, buffer: int, factor: float) -> float:
    """verl's DAPO reward manager, restated in float64."""
    return min(-(L - (L_max - buffer)) / buffer * factor, 0.0)


def test_penalty_equals_verl_dapo_reward_manager(seed):
    np = pytest.importorskip("numpy")
    dapo = pytest.importorskip("verl.workers.reward_manager.dapo", reason="verl's DAPO reward manager")
    from verl import DataProto

    gen = torch.Generator().manual_seed(seed)
    B, P, L_max = 16, 3, int(torch.randint(4, 40, (1,), generator=gen))
    buffer = int(torch.randint(1, L_max + 1, (1,), generator=gen))
    factor = float(torch.rand((), generator=gen, dtype=torch.float64)) * 2
    lengths = torch.randint(0, L_max + 1, (B,), generator=gen)
    lengths[:3] = torch.tensor([L_max, L_max - buffer, max(L_max - buffer - 1, 0)])  # the boundaries
    score = torch.randint(0, 2, (B,), generator=gen).double()
    data = DataProto.from_dict(
        tensors={"prompts": torch.ones(B, P, dtype=torch.long), "responses": torch.ones(B, L_max, dtype=torch.long),
                 "attention_mask": torch.cat([torch.ones(B, P, dtype=torch.long),
                                              (torch.arange(L_max)[None] < lengths[:, None]).long()], 1)},
        non_tensors={"reward_model": np.array([{"ground_truth": str(i)} for i in range(B)], dtype=object),
                     "data_source": np.array(["t"] * B, dtype=object)})
    manager = dapo.DAPORewardManager(
        SimpleNamespace(decode=lambda ids, skip_special_tokens=True: "", eos_token="</s>"), 0,
        compute_score=lambda data_source, solution_str, ground_truth, extra_info: float(score[int(ground_truth)]),
        max_resp_len=L_max,
        overlong_buffer_cfg=SimpleNamespace(enable=True, len=buffer, penalty_factor=factor, log=True))
    out = manager(data, return_dict=True)
    verl_reward = out["reward_tensor"].double().sum(-1)  # one entry per row (its last response token)
    verl_penalty = torch.tensor([float(p) for p in out["reward_extra_info"]["overlong_reward"]], dtype=torch.float64)
    ours = overlong_penalty(lengths.double(), L_max, buffer, factor)
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, verl_penalty, rtol=1e-6, atol=1e-7)  # verl computes it in float32
    torch.testing.assert_close(shaped_rewards(score, ours, label=False), verl_reward, rtol=1e-6, atol=1e-7)


def test_penalty_formula_in_float64(seed):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(20):
        L_max = int(torch.randint(1, 300, (1,), generator=gen))
        buffer = int(torch.randint(1, L_max + 1, (1,), generator=gen))
        factor = float(torch.rand((), generator=gen, dtype=torch.float64)) * 3
        lengths = torch.randint(0, L_max + 1, (64,), generator=gen).double()
        ours = overlong_penalty(lengths, L_max, buffer, factor)
        torch.testing.assert_close(ours, torch.tensor([_formula(float(L), L_max, buffer, factor) for L in lengths],
                                                      dtype=torch.float64), rtol=1e-15, atol=0)
        edge = overlong_penalty(torch.tensor([0.0, L_max - buffer, L_max - buffer + 1, L_max], dtype=torch.float64),
                                L_max, buffer, factor)
        assert edge[0] == 0 and edge[1] == 0  # L <= L_max - buffer: no penalty
        assert math.isclose(edge[2], -factor / buffer, rel_tol=1e-14) and math.isclose(edge[3], -factor, rel_tol=1e-14)
    full = overlong_penalty(torch.tensor([0.0, 5.0, 10.0], dtype=torch.float64), 10, 10, 1.0)  # buffer = L_max
    assert full.tolist() == [0.0, -0.5, -1.0]
    for bad in (0, 11, -1, 2.5):
        with pytest.raises(ValueError, match="buffer_len"):
            overlong_penalty(torch.ones(2), 10, bad)
    with pytest.raises(ValueError, match="penalty_factor"):
        overlong_penalty(torch.ones(2), 10, 5, -1.0)


def test_pacs_label_is_the_clipped_shaped_reward():
    R = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.5])
    pen = torch.tensor([0.0, -0.25, -1.5, -0.5, 0.0, -0.2])
    assert shaped_rewards(R, pen, label=True).tolist() == pytest.approx([1.0, 0.75, 0.0, 0.0, 0.0, 0.3])
    assert shaped_rewards(R, pen, label=False).tolist() == pytest.approx([1.0, 0.75, -0.5, -0.5, 0.0, 0.3])


# ----------------------------------------------------------------------------- the step

def _comps(lengths, reasons, G):
    from pacs_fast.rollout.base import Completion
    flat = [Completion(token_ids=[5] * n, text="x", finish_reason=r) for n, r in zip(lengths, reasons)]
    return [flat[i:i + G] for i in range(0, len(flat), G)]


@pytest.mark.parametrize("name", ["pacs", "grpo"])
def test_shape_batch_and_the_step_record(name):
    from pacs_fast.config import load_config
    from pacs_fast.trainer.batch import build_batch
    from pacs_fast.trainer.overlong import shape_batch
    from pacs_fast.trainer.step import step_record

    cfg = load_config(None, [f"algo.name={name}", "rollout.max_new_tokens=8", "reward.overlong_buffer_len=4",
                             "reward.overlong_penalty=0.8", "learner.mask_truncated=true", "rollout.n=4"])
    lengths = [2, 4, 5, 8, 8, 6, 1, 7]
    reasons = ["stop", "stop", "stop", "length", "stop", "stop", "stop", "stop"]
    rewards = [1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    comps = _comps(lengths, reasons, 4)
    batch = build_batch([[1, 2], [3]], [[c.token_ids for c in cs] for cs in comps], rewards, pad_id=0)
    metrics = shape_batch(cfg, batch, comps)
    penalty = [_formula(L, 8, 4, 0.8) for L in lengths]
    shaped = [r + p for r, p in zip(rewards, penalty)]
    if name == "pacs":
        shaped = [min(max(x, 0.0), 1.0) for x in shaped]
    assert batch.rewards.tolist() == pytest.approx(shaped)
    assert batch.verifier_rewards.tolist() == rewards
    assert batch.truncated.tolist() == [r == "length" for r in reasons]
    batch.old_entropy = torch.zeros_like(batch.response_mask)
    assert metrics == pytest.approx({"reward/overlong_penalty_mean": sum(penalty) / 8, "reward/overlong_frac": 5 / 8,
                                     "reward/shaped_mean": sum(shaped) / 8})
    rec = step_record(batch, comps, {}, {}, {}, {"time/step": 1.0, "time/rollout": 1.0, **metrics}, epoch=0)
    assert rec["reward/mean"] == pytest.approx(sum(rewards) / 8) and rec["reward/acc"] == pytest.approx(5 / 8)
    assert rec["reward/shaped_mean"] == pytest.approx(sum(shaped) / 8)
    assert rec["response/truncated_frac"] == pytest.approx(1 / 8)
    assert rec["response/length"] == pytest.approx(sum(lengths) / 8)  # all generated tokens, truncated ones too


# ----------------------------------------------------------------------------- truncated rows leave the loss

def _batch(gen, G=4, groups=3, T=6):
    from pacs_fast.learner.base import RolloutBatch
    B = G * groups
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    old = -2 * torch.rand(B, T, generator=gen, dtype=torch.float64) * mask
    rewards = torch.tensor([1.0, 0, 1, 0, 0, 1, 1, 1, 1, 0, 0, 1])[:B]
    # group 0 loses one row (3 left), group 1 none, group 2 three (1 left)
    truncated = torch.tensor([0, 0, 1, 0, 0, 0, 0, 0, 1, 1, 0, 1], dtype=torch.bool)[:B]
    mb = RolloutBatch(input_ids=torch.zeros(B, T, dtype=torch.long), attention_mask=torch.ones(B, T, dtype=torch.long),
                      response_mask=mask, rewards=rewards, group_size=G, old_logp=old,
                      ref_logp=old - 0.1 * mask * torch.randn(B, T, generator=gen, dtype=torch.float64),
                      truncated=truncated)
    logp = old + 0.05 * torch.randn(B, T, generator=gen, dtype=torch.float64) * mask
    return mb, logp


def _objective(algo, mb, logp, counts=None):
    from pacs_fast.learner.objective import minibatch_counts, objective
    x = logp.clone().requires_grad_()
    loss, met = objective(algo, mb, x, None, None, minibatch_counts(mb) if counts is None else counts, horizon=6)
    (g,) = torch.autograd.grad(loss, x)
    return loss.detach(), g, met


@pytest.mark.parametrize("name", ["grpo", "rloo", "dr_grpo", "gspo", "cispo"])
def test_truncated_rows_leave_the_baselines_loss(seed, name):
    """Their tokens leave the loss and its denominators; the advantages still come from the whole group."""
    from pacs_fast.config import load_config
    from pacs_fast.learner.objective import resolve_loss_agg
    wide = ["algo.clip_low=0.2", "algo.clip_high=0.2"] if name == "gspo" else []  # not every row clipped out
    algo = load_config(None, [f"algo.name={name}"] + wide).algo
    mb, logp = _batch(torch.Generator().manual_seed(seed))
    loss, g, _ = _objective(algo, mb, logp)
    assert float(g[mb.truncated].abs().max()) == 0.0 and float(g[~mb.truncated].abs().max()) > 0
    kept = mb.response_mask * (~mb.truncated).float()[:, None]
    kw = dict(clip_low=algo.clip_low, clip_high=algo.clip_high, loss_agg_mode=resolve_loss_agg(algo), horizon=6.0)
    if name in ("gspo", "cispo"):
        from pacs_fast.algorithms import cispo_policy_loss, group_advantages, gspo_policy_loss
        fn = gspo_policy_loss if name == "gspo" else cispo_policy_loss
        expected, _ = fn(logp, mb.old_logp, group_advantages(mb.rewards, 4, "grpo"), kept, **kw)
    else:
        expected, _ = grpo_loss(logp, mb.old_logp, kept, mb.rewards, group_size=4, advantage=name, **kw)
    torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize("score", ["rloo", "naive"])
def test_truncated_rows_leave_pacs_groups(seed, score):
    """PACS: a truncated row has no label, weight or part in its group's score; each group is scored
    over the members it has left (rloo: a group left with one member drops out); the loss is the mean
    over the rows that stay; a truncated row's reward changes nothing; micro-batches sum exactly."""
    from pacs_fast.config import load_config
    from pacs_fast.learner.objective import minibatch_counts
    algo = load_config(None, ["algo.name=pacs", f"algo.score={score}"]).algo
    mb, logp = _batch(torch.Generator().manual_seed(seed))
    loss, g, met = _objective(algo, mb, logp)
    keep = {0: [0, 1, 3], 1: [4, 5, 6, 7], 2: [10]}
    if score == "rloo":
        keep.pop(2)
    total, rows = 0.0, 0
    for idx in keep.values():
        part, _ = pacs_loss(logp[idx], mb.ref_logp[idx], mb.response_mask[idx], mb.rewards[idx], group_size=len(idx),
                            score=score, return_terms=True)
        total, rows = total + part * len(idx), rows + len(idx)
    torch.testing.assert_close(loss, total / rows)
    gone = [i for i in range(12) if i not in sum(keep.values(), [])]
    assert float(g[gone].abs().max()) == 0.0
    assert torch.isnan(met["psi"][gone]).all() and torch.isfinite(met["psi"][sum(keep.values(), [])]).all()
    flipped = mb.groups([0, 1, 2])
    flipped.rewards = flipped.rewards.clone()
    flipped.rewards[2] = 1 - flipped.rewards[2]
    loss2, g2, _ = _objective(algo, flipped, logp)
    assert torch.equal(loss, loss2) and torch.equal(g, g2)
    counts = minibatch_counts(mb)
    parts = sum(_objective(algo, mb.groups([k]), logp[4 * k:4 * k + 4], counts)[0] for k in range(3))
    torch.testing.assert_close(parts, loss)


def test_same_semantics_as_the_trl_adapter(seed):
    pytest.importorskip("trl")
    from pacs_fast.config import load_config
    from pacs_fast.integrations.trl import loss_over_members as trl_members
    algo = load_config(None, ["algo.name=pacs"]).algo
    mb, logp = _batch(torch.Generator().manual_seed(seed))
    loss, _, _ = _objective(algo, mb, logp)
    ref, _ = trl_members(lambda lp, r, m, R, k: pacs_loss(lp, r, m, R, group_size=k, return_terms=True),
                         logp, mb.ref_logp, mb.response_mask, mb.rewards, 4, ~mb.truncated, 2)
    torch.testing.assert_close(loss, ref)


def test_loss_over_members_without_survivors():
    none_valid = torch.zeros(4, dtype=torch.bool)
    total, terms, rows = loss_over_members(lambda idx, k: (torch.tensor(1.0), {}), none_valid, 2, 2)
    assert total is None and terms == {} and rows == 0


# ----------------------------------------------------------------------------- config and runs

@pytest.mark.parametrize("overrides, message", [
    (["reward.overlong_buffer_len=-1"], "reward.overlong_buffer_len must be >= 0"),
    (["rollout.max_new_tokens=8", "reward.overlong_buffer_len=9"],
     "reward.overlong_buffer_len=9 must be <= rollout.max_new_tokens=8"),
    (["reward.overlong_buffer_len=4", "reward.overlong_penalty=-1"], "reward.overlong_penalty must be in [0, inf)"),
    (["learner.mask_truncated=maybe"], "config key 'learner.mask_truncated' expects bool"),
])
def test_config_errors_name_the_key(overrides, message, tmp_path):
    from pacs_fast.config import load_config, validate
    with pytest.raises(ValueError) as e:
        validate(load_config(None, overrides + [f"train.out_dir={tmp_path}"]))
    assert message in str(e.value) and "\n" not in str(e.value)
    from pacs_fast.config import unused_settings
    assert unused_settings(load_config(None, ["reward.overlong_penalty=0.5"])) == [
        "reward.overlong_penalty=0.5 has no effect with reward.overlong_buffer_len=0 (no overlong shaping)"]


TINY = ["data.arith_ops=+", "data.arith_max_digits=1", "data.eval_size=8", "rollout.n=4", "rollout.eval_n=2",
        "rollout.max_new_tokens=4", "train.prompts_per_step=4", "learner.mini_batch_prompts=2",
        "learner.micro_batch_prompts=1", "warmup.steps=30", "warmup.batch_size=32", "model.tiny_hidden_size=64",
        "model.tiny_num_layers=1", "learner.lr=3e-3", "train.progress=false", "train.tensorboard=false",
        "train.plots=false", "reward.overlong_buffer_len=2", "learner.mask_truncated=true"]


@pytest.fixture(scope="module")
def cache(warm_cache):
    return str(warm_cache)  # the session's shared warm-up cache (conftest.py)


@pytest.mark.parametrize("name", ["pacs", "cispo"])
def test_two_step_run_with_overlong_shaping_and_filtering(tmp_path, cache, name):
    """max_new_tokens=4, buffer 2: responses run into the buffer and some are cut; the run trains with
    finite metrics and records the shaping (with every row of a group cut, PACS trains nothing on it)."""
    from pacs_fast.config import load_config
    from pacs_fast.trainer import train
    from pacs_fast.trainer.metrics import read_jsonl

    cfg = load_config(None, TINY + [f"warmup.cache_dir={cache}", f"algo.name={name}", "train.steps=2",
                                    "train.eval_every=0", "train.save_every=0", "train.log_samples=4"])
    train(cfg, tmp_path / "run")
    recs = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        for key in ("learner/loss", "learner/grad_norm", "reward/mean", "reward/shaped_mean",
                    "reward/overlong_penalty_mean", "reward/overlong_frac", "response/truncated_frac"):
            assert key in r and math.isfinite(r[key]), (key, r.get(key))
        assert r["reward/overlong_penalty_mean"] <= 0 and 0 <= r["response/truncated_frac"] <= 1
    assert any(r["reward/overlong_frac"] > 0 for r in recs)
    # samples.jsonl: the verifier's reward and, beside it, what trained (it held the verifier's alone)
    rows = [r for r in read_jsonl(tmp_path / "run" / "samples.jsonl") if "row" in r]
    assert len(rows) == 8 and all(r["trained_reward"] <= r["reward"] for r in rows)
    if name == "pacs":  # labels clipped into [0, 1]
        assert all(0.0 <= r["trained_reward"] <= 1.0 for r in rows)
    assert any(r["trained_reward"] < r["reward"] for r in rows) or not any(r["reward"] for r in rows)
    # each row's length and ending: cut rows hold max_new_tokens = 4; only rows past 4 - buffer 2 tokens are shaped
    for r in rows:
        assert r["finish_reason"] in ("stop", "length") and 1 <= r["response_tokens"] <= 4, r
        assert r["finish_reason"] == "stop" or r["response_tokens"] == 4, r
        assert r["trained_reward"] == r["reward"] or r["response_tokens"] > 2, r
    assert {r["finish_reason"] for r in rows} >= {"length"}  # (a barely warmed-up model runs long)


def test_a_batch_cut_everywhere_is_a_warning():
    """learner.mask_truncated with every response of a batch cut at max_new_tokens (a random model that
    never stops; the Qwen-width trial of issue 40): the step would train nothing, silently (loss 0,
    gradient 0); the trainer says so in one line. Two responses of a group that stop: no warning (one alone: PACS's
    rloo score drops its group, tests/test_combination_sweep.py)."""
    from types import SimpleNamespace

    from pacs_fast.config import load_config
    from pacs_fast.trainer.step import score_and_batch

    cfg = load_config(None, ["learner.mask_truncated=true", "rollout.n=2", "rollout.max_new_tokens=3"])
    lines = []
    s = SimpleNamespace(cfg=cfg, scorer=lambda texts, answers, **k: [1.0, 0.0] * (len(texts) // 2), credit=None,
                        tokenizer=SimpleNamespace(pad_token_id=0), log=lines.append,
                        world=SimpleNamespace(dp=1))

    def comp(reason):
        return SimpleNamespace(text="7", token_ids=[5, 6, 7], finish_reason=reason, logprobs=None)
    problems = [{"prompt_ids": [1, 2], "answer": "7"}] * 2
    _, _, batch = score_and_batch(s, 3, problems, [[comp("length")] * 2] * 2, {})
    assert bool(batch.truncated.all()) and len(lines) == 1
    assert lines[0].startswith("warning: step 3: learner.mask_truncated takes every response of this batch out "
                               "of the loss (all 4 ended at rollout.max_new_tokens=3 without EOS): its gradient is "
                               "zero (AdamW's momentum and weight decay still move the weights")  # (a sweep of
    # 2026-12-02 read "it trains nothing" and saw the weights move: a step is taken, as TRL and verl take it)
    score_and_batch(s, 4, problems, [[comp("stop")] * 2, [comp("length")] * 2], {})
    assert len(lines) == 1


def test_a_buffer_most_responses_fall_in_is_a_warning_at_the_first_step():
    """reward.overlong_buffer_len=4 at max_new_tokens=12 on a task whose answers take 11-12 tokens put every
    response in the buffer and collapsed every seed (docs/EFFICACY.md), without a word. The first step of
    a run (or of a resumed session) names the share and the keys; later steps and a buffer few responses
    reach stay quiet."""
    from types import SimpleNamespace

    from pacs_fast.config import load_config
    from pacs_fast.trainer.step import score_and_batch

    cfg = load_config(None, ["rollout.n=2", "rollout.max_new_tokens=12", "reward.overlong_buffer_len=4"])
    lines = []
    s = SimpleNamespace(cfg=cfg, scorer=lambda texts, answers, **k: [1.0, 0.0] * (len(texts) // 2), credit=None,
                        tokenizer=SimpleNamespace(pad_token_id=0), log=lines.append, start_step=0,
                        world=SimpleNamespace(dp=1))

    def comp(n):
        return SimpleNamespace(text="7", token_ids=list(range(3, 3 + n)), finish_reason="stop", logprobs=None)
    problems = [{"prompt_ids": [1, 2], "answer": "7"}] * 2
    long, short = [[comp(11), comp(12)]] * 2, [[comp(5), comp(6)]] * 2
    timings = {}
    score_and_batch(s, 1, problems, long, timings)
    assert timings["reward/overlong_frac"] == 1.0 and len(lines) == 1
    assert lines[0].startswith("warning: step 1: 100% of the responses are longer than rollout.max_new_tokens - "
                               "reward.overlong_buffer_len = 8 tokens and take the overlong penalty"), lines[0]
    score_and_batch(s, 2, problems, long, {})  # not the session's first step
    assert len(lines) == 1
    s.start_step, lines[:] = 5, []
    score_and_batch(s, 6, problems, short, {})  # a resumed session's first step, responses before the buffer
    assert lines == []


def test_sample_rows_put_each_row_s_trained_reward_beside_its_reward():
    """Row by row (2 prompts x 2 responses): ``trained_reward`` is the trained value of that row, and absent
    where nothing was shaped."""
    from types import SimpleNamespace

    from pacs_fast.trainer.step import sample_rows

    tok = SimpleNamespace(decode=lambda ids, **kw: "p" + "".join(map(str, ids)))
    from pacs_fast.rollout.base import Completion

    comps = [[Completion([1] * (i + j + 1), f"r{i}{j}", "length" if j else "stop") for j in range(2)] for i in range(2)]
    problems = [{"prompt_ids": [i], "answer": str(i)} for i in range(2)]
    rows = sample_rows(3, tok, problems, comps, [1.0, 0.0, 1.0, 1.0], {}, 4, trained=[0.5, 0.0, 1.0, 0.25])
    assert [(r["row"], r["response"], r["reward"], r["trained_reward"]) for r in rows] == [
        (0, "r00", 1.0, 0.5), (1, "r01", 0.0, 0.0), (2, "r10", 1.0, 1.0), (3, "r11", 1.0, 0.25)]
    assert [(r["response_tokens"], r["finish_reason"]) for r in rows] == [(1, "stop"), (2, "length"), (2, "stop"),
                                                                          (3, "length")]
    assert all("trained_reward" not in r for r in sample_rows(3, tok, problems, comps, [1.0] * 4, {}, 4))


def test_a_negative_zero_metric_is_recorded_as_zero(tmp_path):
    import json

    from pacs_fast.trainer.metrics import MetricsLogger

    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log("train", 1, {"learner/loss": -0.0, "x": -1.5})
    logger.close()
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["learner/loss"] == 0.0
    assert '"learner/loss": 0.0' in (tmp_path / "metrics.jsonl").read_text()
