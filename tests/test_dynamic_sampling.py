"""DAPO's dynamic sampling (``rollout.filter_groups``, pacs_fast/trainer/rollout_step.py): against a
hand-built set of groups (which are kept, in which order, how many rounds, what the sampler consumed),
the shortfall warning and the all-equal stop, what filtering means for PACS vs GRPO, the config
checks, and a short run on the built-in task that resumes exactly."""
import json
import shutil
from types import SimpleNamespace

import pytest
import torch

from pacs_fast.config import load_config, validate
from pacs_fast.rollout.base import Completion
from pacs_fast.trainer.parallel import World
from pacs_fast.trainer.rollout_step import NoGroupKept, batch_seed, rollout_step
from pacs_fast.trainer.sampler import PromptSampler
from pacs_fast.trainer.metrics import deterministic_view, read_jsonl

G = 2
# problem id -> its group's rewards in every round (the fake verifier reads them from the text)
PATTERN = {0: [1, 1], 1: [0, 1], 2: [0, 0], 3: [1, 0], 4: [1, 1], 5: [0, 0], 6: [0, 1], 7: [0, 0],
           8: [1, 0], 9: [1, 1], 10: [0, 0], 11: [0, 0]}


class FakeEngine:
    def __init__(self):
        self.calls = []

    def generate(self, prompt_ids, params):
        self.calls.append(([p[0] for p in prompt_ids], params.seed))
        return [[Completion(token_ids=[5, 6], text=str(PATTERN[p[0]][j]), finish_reason="stop", logprobs=[-1.0, -1.0])
                 for j in range(params.n)] for p in prompt_ids]

    def sleep(self):
        pass


def session(overrides, *, shuffle=False):
    cfg = load_config(None, [f"rollout.n={G}", "train.prompts_per_step=4", *overrides])
    problems = [{"id": i, "prompt_ids": [i, 1, 2], "answer": "1"} for i in range(len(PATTERN))]
    logs = []
    scorer = lambda texts, answers, step, first, **_: [float(t == a) for t, a in zip(texts, answers)]  # noqa: E731
    return SimpleNamespace(cfg=cfg, world=World(), engine=FakeEngine(), scorer=scorer, credit=None, batches=0,
                           sampler=PromptSampler(len(problems), seed=0, shuffle=shuffle), train_problems=problems,
                           tokenizer=SimpleNamespace(pad_token_id=0), log=logs.append, logs=logs)


def test_keeps_the_groups_whose_rewards_differ_in_draw_order():
    s = session(["rollout.filter_groups=true", "rollout.max_gen_batches=5"])
    tm = {}
    r = rollout_step(s, 3, tm)
    # round 0 draws 0-3 (keeps 1, 3), round 1 draws 4-7 (keeps 6): 3 kept; round 2 draws 8-11 (keeps 8)
    assert [p["id"] for p in r.problems] == [1, 3, 6, 8]
    assert r.rewards == [0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    assert r.batch.num_groups == 4 and r.batch.rewards.tolist() == r.rewards
    # generation throughput: every round's 24 responses of 2 tokens, not only the 8 that train
    assert r.metrics.pop("perf/rollout_tokens_per_s") == pytest.approx(3 * 4 * G * 2 / tm["time/rollout"])
    assert r.metrics == {"rollout/gen_rounds": 3.0, "rollout/prompts_drawn": 12.0, "rollout/trained_groups": 4.0,
                         "rollout/kept_frac": 4 / 12}
    assert s.sampler.position == 12 and not s.logs  # every drawn prompt consumed (resume draws what comes next)
    assert [c[1] for c in s.engine.calls] == [batch_seed(s.cfg, b) for b in (1, 2, 3)] and s.batches == 3
    assert "time/rollout" in tm and "time/reward" in tm


def test_off_is_one_round_as_drawn():
    s = session([])
    r = rollout_step(s, 1, {})
    assert [p["id"] for p in r.problems] == [0, 1, 2, 3] and r.metrics == {} and len(s.engine.calls) == 1


def test_a_shortfall_trains_on_what_was_kept_with_one_warning():
    s = session(["rollout.filter_groups=true", "rollout.max_gen_batches=1"])
    r = rollout_step(s, 2, {})
    assert [p["id"] for p in r.problems] == [1, 3] and r.metrics["rollout/trained_groups"] == 2
    assert len(s.logs) == 1 and "kept 2 of train.prompts_per_step=4 groups" in s.logs[0]


def test_no_group_kept_stops_with_the_reason():
    s = session(["rollout.filter_groups=true", "rollout.max_gen_batches=2"])
    s.train_problems = [p for p in s.train_problems if p["id"] in (0, 2, 4, 5)]  # every group all-equal
    s.sampler = PromptSampler(4, seed=0, shuffle=False)
    with pytest.raises(NoGroupKept, match=r"kept no group in 2 generation rounds of 4 prompts"):
        rollout_step(s, 1, {})


class NoisyScorer:
    """A noisy verifier as :class:`pacs_fast.trainer.rewards.Scorer` is one: ``clean`` gives the verifier's labels,
    a call flips the responses named in ``flip`` ((problem id, response index), read from the text) and leaves
    its own flip rate in ``last``."""

    def __init__(self, flip):
        self.flip, self.last = set(flip), {}

    def clean(self, texts, answers, problems=None, fields=None):
        return [float(t.split(":")[2] == a) for t, a in zip(texts, answers)]

    def __call__(self, texts, answers, step, first, problems=None, fields=None):
        clean = self.clean(texts, answers)
        noisy = [1 - r if tuple(map(int, t.split(":")[:2])) in self.flip else r for t, r in zip(texts, clean)]
        self.last = {"reward/flipped_frac": sum(a != b for a, b in zip(noisy, clean)) / len(clean)}
        return noisy


def test_the_flip_rate_of_a_noisy_verifier_is_the_trained_rows(monkeypatch):
    """With dynamic sampling the scorer runs once per round; the step's reward/flipped_frac is over the rows that
    train, as reward/* are (it was the last round's: 0.25 recorded against 0.31 trained in a sweep)."""
    s = session(["rollout.filter_groups=true", "rollout.max_gen_batches=5"])
    s.engine.generate = lambda prompt_ids, params: [
        [Completion(token_ids=[5, 6], text=f"{p[0]}:{j}:{PATTERN[p[0]][j]}", finish_reason="stop", logprobs=[-1.0] * 2)
         for j in range(params.n)] for p in prompt_ids]
    s.scorer = NoisyScorer({(0, 0), (1, 1), (2, 0), (6, 0), (9, 1), (10, 0), (10, 1)})
    r = rollout_step(s, 3, {})
    trained = [(p["id"], j) for p in r.problems for j in range(G)]
    want = sum(t in s.scorer.flip for t in trained) / len(trained)
    assert r.metrics["reward/flipped_frac"] == want
    assert s.scorer.last["reward/flipped_frac"] != want  # the last round's own rate (what the record held)


def test_what_filtering_removes_for_pacs_and_for_grpo(seed):
    """An all-correct group gives GRPO zero gradient (nothing to filter out), PACS a non-zero one
    (filtering changes PACS's objective): why rollout.filter_groups is off by default for PACS."""
    import pacs_fast as pf

    gen = torch.Generator().manual_seed(seed)
    logp = torch.randn(4, 6, generator=gen, dtype=torch.float64).requires_grad_()
    old = logp.detach() + 0.1 * torch.randn(4, 6, generator=gen, dtype=torch.float64)
    mask = torch.ones(4, 6, dtype=torch.float64)
    rewards = torch.ones(4, dtype=torch.float64)  # one group of 4, all correct
    pf.pacs_loss(logp, old, mask, rewards, group_size=4).backward()
    assert logp.grad.abs().max() > 1e-6
    logp.grad = None
    pf.grpo_loss(logp, old, mask, rewards, group_size=4)[0].backward()
    assert logp.grad.abs().max() == 0


@pytest.mark.parametrize("overrides,match", [
    (["rollout.filter_groups=true", "rollout.max_gen_batches=0"], "rollout.max_gen_batches must be >= 1"),
])
def test_config_errors(overrides, match):
    with pytest.raises(ValueError, match=match):
        validate(load_config(None, overrides), world=2)


def test_a_run_with_dynamic_sampling_resumes_exactly(tmp_path, capsys, warm_cache):
    from pacs_fast.train import main
    from test_train import TINY

    common = TINY + [f"warmup.cache_dir={warm_cache}", f"train.out_dir={tmp_path}", "train.steps=4",
                     "train.save_every=2", "train.eval_every=4", "rollout.filter_groups=true",
                     "rollout.max_gen_batches=3", "train.tensorboard=false",
                     "reward.noise_fp=0.3"]  # the barely warmed-up model solves nothing: flipped labels mix the groups
    main(common + ["train.run_name=full"])
    full = tmp_path / "full"
    recs = [r for r in read_jsonl(full / "metrics.jsonl") if r["kind"] == "train"]
    assert len(recs) == 4 and all(r["rollout/gen_rounds"] >= 1 for r in recs)
    assert any(r["rollout/gen_rounds"] > 1 for r in recs)  # refill rounds ran: the resume below must replay them
    assert all(r["rollout/prompts_drawn"] == 4 * r["rollout/gen_rounds"] for r in recs)
    # the same run killed after checkpoint 2 (steps 3-4 logged) and resumed: the same records
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    shutil.rmtree(cut / "checkpoints" / "step_000004")
    (cut / "checkpoints" / "latest").write_text("step_000002\n")
    (cut / "summary.json").unlink()
    main(["--resume", str(cut)])
    assert deterministic_view(read_jsonl(cut / "metrics.jsonl")) == deterministic_view(read_jsonl(full / "metrics.jsonl"))
    assert json.loads((cut / "summary.json").read_text())["acc_after"] == \
        json.loads((full / "summary.json").read_text())["acc_after"]
