"""Metrics truth sweep: every logged metric recomputed independently of the code that logged it.

Short runs (the built-in tiny model, and a Qwen2.5-shaped BPE / ChatML model folder) train in this process with the
rollout engine's ``generate`` recorded, so each test knows every completion the run drew: its tokens, text and
ending. A user reward (``reward.fn`` below, a pure function of the gold answer and the response) gives groups of
every kind (all correct, all wrong, all 0.5, mixed). From those, the config, the documented definitions (README.md,
docs/TRACKERS.md, the docstrings) and the checkpoints' weights, each test recomputes what the run logged:
``reward/*``, ``response/*``, ``entropy`` (a Hugging Face forward of the checkpoint before the step),
``eval/*``, ``data/epoch``, ``learner/lr`` (and the optimiser's own rate and step count in each checkpoint),
``perf/*``, ``pacs/*`` (from each row's score terms), dynamic sampling's ``rollout/*`` and ``reward/flipped_frac``,
the TensorBoard scalars against the JSONL, and a run resumed after a kill against the uninterrupted one.

Found and fixed: ``reward/all_wrong_groups`` counted a group only when every reward was below 0.5 (``max < 0.5``),
while ``reward/acc`` counts a reward of 0.5 wrong (``R > 0.5`` is correct): a group of partial-credit 0.5s was
neither all wrong nor all correct, its rows all wrong by ``reward/acc`` (pacs_fast/trainer/step.py).
"""
from __future__ import annotations

import contextlib
import json
import math
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from pacs_fast.trainer.metrics import deterministic_view, read_jsonl

G, P = 4, 4  # rollout.n, train.prompts_per_step
TINY = ["data.arith_ops=+", "data.arith_max_digits=1", "data.eval_size=8", f"rollout.n={G}", "rollout.eval_n=2",
        "rollout.max_new_tokens=6", f"train.prompts_per_step={P}", "learner.mini_batch_prompts=2",
        "learner.micro_batch_prompts=1", "warmup.steps=30", "warmup.batch_size=32", "model.tiny_hidden_size=64",
        "model.tiny_num_layers=1", "learner.lr=3e-3", "train.progress=false", "train.plots=false",
        f"train.log_samples={P * G}", "train.save_every=1", "train.keep_checkpoints=10"]


# ------------------------------------------------------------------------------------------- rewards (user functions)

def _kind(answer: str) -> int:
    return zlib.crc32(answer.encode()) % 4


def score(problems, responses, answers):
    """Groups of every kind by the gold answer: all 1, all 0, all 0.5 (soft: counted wrong by reward/acc), and
    mixed (a bit of the response's checksum)."""
    return [true_reward(a, r) for r, a in zip(responses, answers)]


def binary(problems, responses, answers):
    """0 / 1 rewards (label noise flips only those): all 1, all 0 or mixed by the answer, as :func:`score`."""
    return [min(1.0, round(true_reward(a, r) + 0.25)) if _kind(a) != 2 else float(zlib.crc32(r.encode()) % 2)
            for r, a in zip(responses, answers)]


def true_reward(answer: str, response: str) -> float:
    k = _kind(answer)
    return 1.0 if k == 0 else 0.0 if k == 1 else 0.5 if k == 2 else float(zlib.crc32(response.encode()) % 2)


# ------------------------------------------------------------------------------------------- running with a recorder

class Recorded:
    """A run folder and every ``generate`` call its engine answered: ``(prompt ids, SamplingParams, completions)``."""

    def __init__(self, cfg, run: Path, calls: list):
        self.cfg, self.run, self.calls = cfg, run, calls

    def records(self, kind):
        return [r for r in read_jsonl(self.run / "metrics.jsonl") if r["kind"] == kind]

    def samples(self):
        return [r for r in read_jsonl(self.run / "samples.jsonl") if "row" in r]

    def train_calls(self):
        """The training rollouts' calls (they ask for log-probs; evaluation does not)."""
        return [c for c in self.calls if c[1].return_logprobs]

    def eval_calls(self):
        """The held-out evaluation's calls: eval_n samples at eval_temperature, then greedy (not the warm-up's
        accuracy check of a fresh cache: one sample at temperature 1)."""
        rc = self.cfg.rollout
        return [c for c in self.calls if not c[1].return_logprobs and (
            (c[1].n, c[1].temperature) == (rc.eval_n, rc.eval_temperature) or (c[1].n, c[1].temperature) == (1, 0))]


@contextlib.contextmanager
def recorded_generate(transform=None):
    """Every ``HFEngine.generate`` call of the block, as ``(prompt ids, SamplingParams, completions)`` in the list it
    yields (``transform(params, completions)``: what the run gets instead, and what is recorded)."""
    from pacs_fast.rollout.hf import HFEngine

    calls = []
    original = HFEngine.generate

    def generate(self, prompts, params):
        out = original(self, prompts, params)
        out = out if transform is None else transform(params, out)
        calls.append(([list(p) for p in prompts], params, out))
        return out

    HFEngine.generate = generate
    try:
        yield calls
    finally:
        HFEngine.generate = original


def run_recorded(tmp: Path, name: str, overrides, *, resume_of: Path | None = None) -> Recorded:
    """Trains ``overrides`` in ``tmp / name`` (or resumes the run folder ``resume_of``) in this process, every
    ``HFEngine.generate`` call recorded."""
    from pacs_fast.config import load_config
    from pacs_fast.trainer import train

    with recorded_generate() as calls:
        if resume_of is not None:
            from pacs_fast.trainer.run_folder import resume_config
            cfg = resume_config(resume_of, list(overrides))
            train(cfg, resume_of, resume=True)
            return Recorded(cfg, resume_of, calls)
        cfg = load_config(None, list(overrides))
        train(cfg, tmp / name)
    return Recorded(cfg, tmp / name, calls)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("warm")  # (the tiny model warmed up once for this module)


@pytest.fixture(scope="module")
def pacs_run(tmp_path_factory, cache):
    """PACS, 3 steps (2 mini-batches each), a cosine schedule with a warm-up step, evaluations at 0, 2 and 3."""
    tmp = tmp_path_factory.mktemp("pacs")
    return run_recorded(tmp, "run", TINY + [
        f"warmup.cache_dir={cache}", "reward.fn=test_metrics_truth_sweep:score", "train.steps=3",
        "train.eval_every=2", "rollout.eval_temperature=1.0", "learner.lr_schedule=cosine",
        "learner.lr_warmup_steps=1", "learner.min_lr_ratio=0.1", "data.arith_train_size=10"])


def _problem_answer(tokenizer, prompt_ids) -> str:
    """The built-in task's gold answer, from its prompt (``"9+4="``) as the engine got it."""
    text = tokenizer.decode(prompt_ids)
    a, b = text.rstrip("=").split("+")
    return str(int(a) + int(b))


def _tokenizer(run: Path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(run / "checkpoints" / "step_000001")  # (the input model's files)


def _step_rows(rec: Recorded, step: int):
    """``(answers, completions)`` of ``step``'s training rows, prompt-major, from the recorded calls (one call a step
    without dynamic sampling)."""
    prompts, _, comps = rec.train_calls()[step - 1]
    tok = _tokenizer(rec.run)
    answers = [_problem_answer(tok, p) for p in prompts for _ in range(G)]
    return answers, [c for cs in comps for c in cs], prompts


def test_reward_metrics_equal_the_rewards_of_the_recorded_rollouts(pacs_run):
    """reward/mean, reward/acc (R > 0.5), reward/all_correct_groups / all_wrong_groups (every reward of the group
    counted correct / wrong as reward/acc counts it: a group of 0.5s is all wrong) from the recorded completions and
    the reward function, and samples.jsonl holds exactly those rows."""
    recs = pacs_run.records("train")
    assert [r["step"] for r in recs] == [1, 2, 3]
    seen_soft_group = False
    for r in recs:
        answers, comps, _ = _step_rows(pacs_run, r["step"])
        R = np.array([true_reward(a, c.text) for a, c in zip(answers, comps)])
        groups = R.reshape(-1, G)
        seen_soft_group |= bool((groups == 0.5).all(1).any())
        assert r["reward/mean"] == pytest.approx(R.mean(), abs=1e-7)
        assert r["reward/acc"] == pytest.approx((R > 0.5).mean(), abs=1e-7)
        assert r["reward/all_correct_groups"] == pytest.approx((groups > 0.5).all(1).mean())
        assert r["reward/all_wrong_groups"] == pytest.approx((groups <= 0.5).all(1).mean()), (r["step"], groups)
        rows = [s for s in pacs_run.samples() if s["step"] == r["step"]]
        assert [s["row"] for s in rows] == list(range(P * G))
        assert [s["response"] for s in rows] == [c.text for c in comps]
        assert [s["reward"] for s in rows] == R.tolist()
        assert [s["answer"] for s in rows] == answers
    assert seen_soft_group  # (the case where `max < 0.5` and `<= 0.5` differ)


def test_response_metrics_count_response_tokens_only(pacs_run):
    """response/tokens (every response token, EOS included, no prompt or padding), response/length (per response),
    response/stop_frac and response/truncated_frac (finish_reason stop / length; they add up to 1), and each
    samples.jsonl row's response_tokens / finish_reason, from the recorded completions."""
    for r in pacs_run.records("train"):
        _, comps, _ = _step_rows(pacs_run, r["step"])
        n = sum(len(c.token_ids) for c in comps)
        assert r["response/tokens"] == n
        assert r["response/length"] == pytest.approx(n / len(comps))
        assert r["response/stop_frac"] == pytest.approx(np.mean([c.finish_reason == "stop" for c in comps]))
        assert r["response/truncated_frac"] == pytest.approx(np.mean([c.finish_reason == "length" for c in comps]))
        rows = [s for s in pacs_run.samples() if s["step"] == r["step"]]
        assert [s["response_tokens"] for s in rows] == [len(c.token_ids) for c in comps]
        assert [s["finish_reason"] for s in rows] == [c.finish_reason for c in comps]
    assert {c.finish_reason for _, _, cs in pacs_run.train_calls() for g in cs for c in g} == {"stop", "length"}


def _hf_entropy_and_logp(folder: Path, prompts, comps, temperature: float = 1.0, vocab: int | None = None):
    """Token-mean entropy of softmax(logits / T) over the response tokens, and each response's token log-probs,
    from a plain transformers forward of ``folder``'s weights."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ents, lps = [], []
    with torch.no_grad():
        for i, c in enumerate(comps):
            p = prompts[i // G]
            ids = torch.tensor([list(p) + list(c.token_ids)])
            logits = model(ids).logits[0].double()
            if vocab is not None:
                logits = logits[:, :vocab]
            logits = logits[len(p) - 1:-1] / temperature
            logq = torch.log_softmax(logits, -1)
            ents += (-(logq.exp() * logq).sum(-1)).tolist()
            lps.append(logq.gather(1, torch.tensor(c.token_ids)[:, None])[:, 0].tolist())
    return float(np.mean(ents)), lps


def test_entropy_is_the_token_mean_of_the_policy_before_the_step(pacs_run):
    """entropy: the mean over the step's response tokens of the entropy of the policy that sampled them (the
    checkpoint of the step before), recomputed with transformers; rollout/logprob_diff_mean / _max against the
    engine's log-probs of the same tokens. Over the tokenizer's ids only (the head has padded rows: 128 for 99 ids,
    never sampled; README)."""
    for r in pacs_run.records("train")[1:]:
        _, comps, prompts = _step_rows(pacs_run, r["step"])
        folder = pacs_run.run / "checkpoints" / f"step_{r['step'] - 1:06d}"
        ent, lps = _hf_entropy_and_logp(folder, prompts, comps, vocab=len(_tokenizer(pacs_run.run)))
        assert r["entropy"] == pytest.approx(ent, rel=1e-4), r["step"]
        diff = np.abs(np.concatenate([np.array(c.logprobs) - np.array(lp) for c, lp in zip(comps, lps)]))
        assert r["rollout/logprob_diff_mean"] <= 1e-4 and r["rollout/logprob_diff_max"] <= 1e-4
        assert diff.max() <= 1e-4


def test_eval_metrics_equal_the_recorded_evaluation_rollouts(pacs_run):
    """eval/acc (mean reward of eval_n samples a problem), eval/pass@n (problems with a reward > 0.5), eval/greedy_acc,
    eval/response_length (sampled responses' tokens), each evaluation attributed to its step: the greedy responses at
    step s are those of a plain greedy decode of checkpoint step s."""
    from transformers import AutoModelForCausalLM

    evals = pacs_run.records("eval")
    assert [r["step"] for r in evals] == [0, 2, 3]
    calls = pacs_run.eval_calls()
    assert len(calls) == 2 * len(evals)
    tok, n = _tokenizer(pacs_run.run), pacs_run.cfg.rollout.eval_n
    for i, r in enumerate(evals):
        (prompts, sp, sampled), (gprompts, gp, greedy) = calls[2 * i], calls[2 * i + 1]
        assert sp.n == n and gp.temperature == 0 and gprompts == prompts
        answers = [_problem_answer(tok, p) for p in prompts]
        R = np.array([[true_reward(a, c.text) for c in cs] for a, cs in zip(answers, sampled)])
        assert R.shape == (8, n)
        assert r["eval/acc"] == pytest.approx(R.mean())
        assert r["eval/pass@n"] == pytest.approx((R > 0.5).any(1).mean())
        assert r["eval/response_length"] == pytest.approx(np.mean([len(c.token_ids) for cs in sampled for c in cs]))
        assert r["eval/greedy_acc"] == pytest.approx(np.mean([true_reward(a, cs[0].text)
                                                              for a, cs in zip(answers, greedy)]))
        if r["step"] == 2:  # the weights evaluated: the step's own
            model = AutoModelForCausalLM.from_pretrained(pacs_run.run / "checkpoints" / "step_000002").eval()
            vocab = len(tok)
            for p, cs in zip(prompts, greedy):
                ids = list(p)
                with torch.no_grad():
                    for _ in range(pacs_run.cfg.rollout.max_new_tokens):
                        nxt = int(model(torch.tensor([ids])).logits[0, -1, :vocab].argmax())
                        ids.append(nxt)
                        if nxt == tok.eos_token_id:
                            break
                assert ids[len(p):] == list(cs[0].token_ids)
    summary = json.loads((pacs_run.run / "summary.json").read_text())
    assert summary["acc_before"] == evals[0]["eval/acc"] and summary["acc_after"] == evals[-1]["eval/acc"]
    assert summary["greedy_acc_after"] == evals[-1]["eval/greedy_acc"]


def _lr(step: int, total: int, warmup: int, lr: float, min_ratio: float) -> float:
    """README's schedule: warm-up step s <= N at s / N, then cosine from the peak (trained twice: step N and the
    decay's first) toward min_ratio over the rest of train.steps."""
    if step <= warmup:
        return lr * step / warmup
    p = (step - 1 - warmup) / (total - warmup)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


def test_lr_optimizer_steps_and_epoch_are_what_trained(pacs_run):
    """learner/lr against the documented schedule and against the rate in each checkpoint's optimiser;
    learner/optimizer_steps against the optimiser's own step count (cumulative, per checkpoint) and epochs x
    mini-batches; data/epoch: the epoch of the step's last prompt (10 problems, 4 a step: step 3 crosses)."""
    cfg = pacs_run.cfg
    total = 0
    for r in pacs_run.records("train"):
        s = r["step"]
        assert r["learner/lr"] == pytest.approx(_lr(s, 3, 1, 3e-3, 0.1), rel=1e-9)
        state = torch.load(pacs_run.run / "checkpoints" / f"step_{s:06d}" / "learner.pt", weights_only=False)
        opt = state["optimizer"]
        assert opt["param_groups"][0]["lr"] == pytest.approx(r["learner/lr"], rel=1e-12)
        assert r["learner/optimizer_steps"] == cfg.learner.epochs * math.ceil(P / cfg.learner.mini_batch_prompts)
        total += r["learner/optimizer_steps"]
        assert {float(v["step"]) for v in opt["state"].values()} == {total}
        assert r["data/epoch"] == (s * P - 1) // cfg.data.arith_train_size


def test_throughput_counts_the_step_s_tokens(pacs_run):
    """perf/tokens_per_s: the step's tokens (prompt + response, as verl's perf/throughput) over time/step;
    perf/rollout_tokens_per_s: the response tokens over time/rollout; time/step covers its phases."""
    for r in pacs_run.records("train"):
        _, comps, prompts = _step_rows(pacs_run, r["step"])
        tokens = sum(len(p) for p in prompts) * G + sum(len(c.token_ids) for c in comps)
        assert r["perf/tokens_per_s"] == pytest.approx(tokens / r["time/step"], rel=1e-9)
        assert r["perf/rollout_tokens_per_s"] == pytest.approx(r["response/tokens"] / r["time/rollout"], rel=1e-9)
        phases = sum(r[k] for k in ("time/rollout", "time/reward", "time/logprobs", "time/update", "time/sync"))
        assert phases <= r["time/step"]


def test_pacs_metrics_equal_the_rows_score_terms(pacs_run):
    """pacs/*: psi (beta x RLOO of each group's proxy), pred_reward = sigmoid(psi), its mean / std, brier,
    calib_gap and pred_reward_pos / _neg (R > 0.5 / R <= 0.5), proxy_abs_mean, from samples.jsonl's rows (every row
    of the step logged) and the rewards recomputed."""
    beta = pacs_run.cfg.algo.beta
    for r in pacs_run.records("train"):
        rows = [s for s in pacs_run.samples() if s["step"] == r["step"]]
        answers, comps, _ = _step_rows(pacs_run, r["step"])
        R = np.array([true_reward(a, c.text) for a, c in zip(answers, comps)])
        proxy = np.array([s["proxy"] for s in rows]).reshape(-1, G)
        psi = beta * (proxy - (proxy.sum(1, keepdims=True) - proxy) / (G - 1))
        assert np.allclose(psi.ravel(), [s["psi"] for s in rows], atol=1e-5)
        psi = np.array([s["psi"] for s in rows])
        pred = 1 / (1 + np.exp(-psi))
        assert np.allclose(pred, [s["pred_reward"] for s in rows], atol=1e-6)
        want = {"pacs/psi_mean": psi.mean(), "pacs/psi_std": psi.std(ddof=1), "pacs/pred_reward_mean": pred.mean(),
                "pacs/pred_reward_std": pred.std(ddof=1), "pacs/brier": ((pred - R) ** 2).mean(),
                "pacs/calib_gap": abs(pred.mean() - R.mean()), "pacs/proxy_abs_mean": np.abs(proxy).mean(),
                "pacs/pred_reward_pos": pred[R > 0.5].mean() if (R > 0.5).any() else None,
                "pacs/pred_reward_neg": pred[R <= 0.5].mean() if (R <= 0.5).any() else None}
        for k, v in want.items():
            assert r[k] == (None if v is None else pytest.approx(v, abs=1e-6)), k
    assert any(abs(s["proxy"]) > 0 for s in pacs_run.samples())  # (the later mini-batch moved the policy)


def _tb_scalars(run: Path) -> dict:
    from tensorboard.backend.event_processing import event_accumulator
    acc = event_accumulator.EventAccumulator(str(run / "tb"), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _check_tb(run: Path):
    from pacs_fast.trainer.metrics import scalar_metrics
    tb = _tb_scalars(run)
    want = {}
    for r in read_jsonl(run / "metrics.jsonl"):
        if r["kind"] not in ("train", "eval"):
            continue
        for tag, v in scalar_metrics(r["kind"], {k: v for k, v in r.items() if k not in ("kind", "step")}).items():
            want.setdefault(tag, []).append((r["step"], v))
    assert set(want) <= set(tb), sorted(set(want) - set(tb))
    for tag, values in want.items():
        got = tb[tag]
        assert [s for s, _ in got] == [s for s, _ in values], tag
        assert np.allclose([v for _, v in got], np.float32([v for _, v in values]), rtol=1e-6, atol=0), tag
    return tb


def test_tensorboard_scalars_equal_the_jsonl(pacs_run):
    """Every finite number of every train / eval record is a TensorBoard scalar (train/<key>, eval/<key>) at its
    step, once, with the JSONL's value (float32)."""
    tb = _check_tb(pacs_run.run)
    assert "train/reward/mean" in tb and "eval/acc" in tb and "train/pacs/brier" in tb


# ------------------------------------------------------------------------------------------- dynamic sampling + noise

@pytest.fixture(scope="module")
def filtered_run(tmp_path_factory, cache):
    """GRPO with rollout.filter_groups (DAPO's dynamic sampling) and label noise (reward.noise_fp=0.3) on 0/1
    rewards: steps take several generation rounds, and drop groups."""
    tmp = tmp_path_factory.mktemp("filtered")
    return run_recorded(tmp, "run", TINY + [
        f"warmup.cache_dir={cache}", "reward.fn=test_metrics_truth_sweep:binary", "train.steps=3",
        "train.eval_every=0", "algo.name=grpo", "rollout.filter_groups=true", "rollout.max_gen_batches=4",
        "reward.noise_fp=0.3", "data.arith_train_size=30"])


def test_dynamic_sampling_metrics_are_those_of_the_kept_groups(filtered_run):
    """Round by round from the recorded generation calls: a group is kept when its (noisy) rewards differ, a step
    takes rounds until P groups are kept (or rollout.max_gen_batches), trains on the first P. Checked:
    rollout/gen_rounds, rollout/prompts_drawn, rollout/kept_frac, rollout/trained_groups, the trained rows
    (samples.jsonl), reward/* and reward/flipped_frac (labels that differ from the clean reward) over the trained
    rows, response/* over the trained rows, perf/rollout_tokens_per_s over every round's responses, data/epoch
    after every round's prompts."""
    from pacs_fast.trainer.rewards import flip_labels

    cfg = filtered_run.cfg
    tok = _tokenizer(filtered_run.run)
    calls = iter(filtered_run.train_calls())
    drawn = 0
    multi_round = dropped_any = False
    for r in filtered_run.records("train"):
        kept, rounds, gen_tokens = [], 0, 0
        while len(kept) < P and rounds < cfg.rollout.max_gen_batches:
            prompts, _, comps = next(calls)
            answers = [_problem_answer(tok, p) for p in prompts]
            clean = [binary(None, [c.text], [a])[0] for a, cs in zip(answers, comps) for c in cs]
            noisy = flip_labels(clean, fp=0.3, fn=0.0, seed=cfg.train.seed, step=r["step"], first=rounds * P * G)
            for i, cs in enumerate(comps):
                g = noisy[i * G:(i + 1) * G]
                if max(g) != min(g):
                    kept.append((answers[i], cs, g, clean[i * G:(i + 1) * G]))
                else:
                    dropped_any = True
            gen_tokens += sum(len(c.token_ids) for cs in comps for c in cs)
            rounds += 1
        drawn += rounds * P
        multi_round |= rounds > 1
        trained = kept[:P]
        assert r["rollout/gen_rounds"] == rounds and r["rollout/prompts_drawn"] == rounds * P
        assert r["rollout/kept_frac"] == pytest.approx(len(kept) / (rounds * P))
        assert r["rollout/trained_groups"] == len(trained)
        R = np.array([x for _, _, g, _ in trained for x in g])
        clean = np.array([x for _, _, _, c in trained for x in c])
        comps = [c for _, cs, _, _ in trained for c in cs]
        rows = [s for s in filtered_run.samples() if s["step"] == r["step"]]
        assert [s["response"] for s in rows] == [c.text for c in comps]
        assert [s["reward"] for s in rows] == R.tolist()
        assert r["reward/mean"] == pytest.approx(R.mean(), abs=1e-7)
        assert r["reward/acc"] == pytest.approx((R > 0.5).mean(), abs=1e-7)
        assert r["reward/all_correct_groups"] == 0 and r["reward/all_wrong_groups"] == 0
        assert r["reward/flipped_frac"] == pytest.approx((R != clean).mean())
        assert r["response/tokens"] == sum(len(c.token_ids) for c in comps)
        assert r["response/truncated_frac"] == pytest.approx(np.mean([c.finish_reason == "length" for c in comps]))
        assert r["perf/rollout_tokens_per_s"] == pytest.approx(gen_tokens / r["time/rollout"], rel=1e-9)
        assert r["data/epoch"] == (drawn - 1) // cfg.data.arith_train_size
    assert multi_round and dropped_any


# ------------------------------------------------------------------------------------------- a Qwen2.5-shaped model

def _qwen_folder(folder: Path):
    """tests/test_data_path_sweep.py's Qwen2.5-shaped model (ChatML, EOS <|im_end|>, pad <|endoftext|>, both stop
    ids) whose head says <|im_end|> and <|endoftext|> (the pad id) often: responses end at either, or run to the
    limit."""
    from safetensors.torch import load_file, save_file

    from test_data_path_sweep import qwen_chatml_folder

    tok = qwen_chatml_folder(folder, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    weights = load_file(folder / "model.safetensors")
    head = "lm_head.weight" if "lm_head.weight" in weights else "model.embed_tokens.weight"
    w = weights[head].clone()
    for i, tid in enumerate((tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id)):
        w[tid] = 0.0
        w[tid, i] = 4.0  # a logit of 4 x one normalised hidden unit: high for some states, low for others
    weights[head] = w
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return tok


@pytest.fixture(scope="module")
def qwen_run(tmp_path_factory, cache):
    """PPO on the Qwen2.5-shaped folder, rows packed (learner.packing=on) and cut by a token budget, 2 steps."""
    tmp = tmp_path_factory.mktemp("qwen")
    tok = _qwen_folder(tmp / "model")
    data = tmp / "train.jsonl"
    data.write_text("".join(json.dumps({"problem": f"What is {i} plus {i % 7}?", "answer": str(i + i % 7)}) + "\n"
                            for i in range(40)))
    over = [o for o in TINY if not o.startswith(("data.arith", "model.tiny", "warmup."))]
    rec = run_recorded(tmp, "run", over + [
        f"model.path={tmp / 'model'}", f"data.dataset={data}", "data.eval_size=4", "train.steps=2",
        "reward.fn=test_metrics_truth_sweep:score", "train.eval_every=0", "algo.name=ppo",
        "learner.packing=on", "learner.max_tokens_per_micro_batch=120", "rollout.max_new_tokens=8"])
    rec.tok = tok
    return rec


def _qwen_rows(rec: Recorded, step: int):
    import re

    prompts, _, comps = rec.train_calls()[step - 1]
    answers = []
    for p in prompts:
        a, b = re.search(r"What is (\d+) plus (\d+)\?", rec.tok.decode(p)).groups()
        answers += [str(int(a) + int(b))] * G
    return answers, [c for cs in comps for c in cs], prompts


def test_qwen_packed_ppo_metrics(qwen_run):
    """On the Qwen2.5-shaped model (ChatML prompts, responses that end at <|im_end|>, at <|endoftext|> which is
    also the pad id, or at the limit), PPO with packed rows cut by a token budget: reward/*, response/* (the EOS
    tokens counted, padding not), entropy and the log-prob mismatch (transformers' forward of the weights before
    each step: the input folder, then checkpoint 1), learner/optimizer_steps and the TensorBoard scalars."""
    tok, eot, im_end = qwen_run.tok, qwen_run.tok.pad_token_id, qwen_run.tok.convert_tokens_to_ids("<|im_end|>")
    ends = set()
    for r in qwen_run.records("train"):
        answers, comps, prompts = _qwen_rows(qwen_run, r["step"])
        ends |= {(c.finish_reason, c.token_ids[-1] if c.finish_reason == "stop" else None) for c in comps}
        R = np.array([true_reward(a, c.text) for a, c in zip(answers, comps)])
        groups = R.reshape(-1, G)
        assert r["reward/mean"] == pytest.approx(R.mean(), abs=1e-7)
        assert r["reward/acc"] == pytest.approx((R > 0.5).mean(), abs=1e-7)
        assert r["reward/all_correct_groups"] == pytest.approx((groups > 0.5).all(1).mean())
        assert r["reward/all_wrong_groups"] == pytest.approx((groups <= 0.5).all(1).mean())
        n = sum(len(c.token_ids) for c in comps)
        assert r["response/tokens"] == n and r["response/length"] == pytest.approx(n / len(comps))
        assert r["response/stop_frac"] == pytest.approx(np.mean([c.finish_reason == "stop" for c in comps]))
        assert r["response/truncated_frac"] == pytest.approx(np.mean([c.finish_reason == "length" for c in comps]))
        folder = qwen_run.run.parent / "model" if r["step"] == 1 else qwen_run.run / "checkpoints" / "step_000001"
        ent, lps = _hf_entropy_and_logp(folder, prompts, comps, vocab=len(tok))
        assert r["entropy"] == pytest.approx(ent, rel=1e-4), r["step"]
        diff = np.abs(np.concatenate([np.array(c.logprobs) - np.array(lp) for c, lp in zip(comps, lps)]))
        assert diff.max() <= 1e-4 and r["rollout/logprob_diff_max"] <= 1e-4
        assert r["learner/optimizer_steps"] == 2 and r["learner/forward/packed"] > 0
        # packed slots: every row's tokens but its last (only ever a label), no padding, in each of PPO's three
        # passes (old log-probs, values, the update)
        assert r["learner/forward/token_slots"] == 3 * sum(len(p) + len(c.token_ids) - 1
                                                           for p, cs in zip(prompts, qwen_run.train_calls()[
                                                               r["step"] - 1][2]) for c in cs)
        rows = [s for s in qwen_run.samples() if s["step"] == r["step"]]
        assert [s["response_tokens"] for s in rows] == [len(c.token_ids) for c in comps]
    assert {("stop", eot), ("stop", im_end), ("length", None)} <= ends, ends
    _check_tb(qwen_run.run)


# ------------------------------------------------------------------------------------------- after a resume

def test_a_resumed_run_logs_the_uninterrupted_run_s_history(pacs_run, tmp_path):
    """A copy of the PACS run killed while step 3 wrote its checkpoint (step 3's records written), resumed: the
    history read_jsonl gives (metrics.jsonl and samples.jsonl) equals the uninterrupted run's but for time/ and
    perf/ keys; the redone step's engine calls are the first run's; TensorBoard holds each step once, with the
    JSONL's values; the summary reports the same evaluations."""
    from conftest import copy_as_killed_in_checkpoint

    run = copy_as_killed_in_checkpoint(pacs_run.run, tmp_path / "killed", 3)
    rec = run_recorded(tmp_path, "", [], resume_of=run)
    assert deterministic_view(read_jsonl(run / "metrics.jsonl")) == deterministic_view(
        read_jsonl(pacs_run.run / "metrics.jsonl"))
    assert read_jsonl(run / "samples.jsonl") == read_jsonl(pacs_run.run / "samples.jsonl")
    redone = rec.train_calls()
    assert len(redone) == 1 and [c.token_ids for cs in redone[0][2] for c in cs] == [
        c.token_ids for cs in pacs_run.train_calls()[2][2] for c in cs]
    assert any(r.get("kind") == "resume" for r in read_jsonl(run / "metrics.jsonl", raw=True))
    _check_tb(run)
    a, b = (json.loads((p / "summary.json").read_text()) for p in (run, pacs_run.run))
    assert {k: a[k] for k in ("acc_before", "acc_after", "greedy_acc_before", "greedy_acc_after", "final_eval_step")} \
        == {k: b[k] for k in ("acc_before", "acc_after", "greedy_acc_before", "greedy_acc_after", "final_eval_step")}


# ------------------------------------------------------------------------------------------- data-parallel groups

def test_a_step_record_over_two_data_parallel_groups_is_the_one_process_record():
    """Two data-parallel groups, each with its equal share of the step's groups (responses of different lengths,
    soft and 0/1 rewards, stops and cuts): World.reduce_record of their step records (WEIGHTED_MEANS) gives the
    one-process record of the whole step for every non-timing key (reward/*, response/* with response/tokens
    summed, the token-weighted entropy and log-prob mismatch, its max, data/epoch)."""
    from pacs_fast.rollout.base import Completion
    from pacs_fast.trainer.batch import build_batch
    from pacs_fast.trainer.parallel import World
    from pacs_fast.trainer.step import WEIGHTED_MEANS, step_record

    gen = torch.Generator().manual_seed(5)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [3, 3]]
    lengths = [[1, 2, 3, 4], [6, 6, 6, 6], [1, 1, 2, 6], [5, 6, 3, 2]]
    comps = [[Completion(torch.randint(10, 50, (n,), generator=gen).tolist(), "x", "length" if n == 6 else "stop",
                         (-torch.rand(n, generator=gen)).tolist()) for n in ls] for ls in lengths]
    rewards = [1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.0, 0.0, 1.0, 0.25, 0.0, 0.0, 0.0, 0.0, 0.0]

    def record(lo, hi):
        b = build_batch(prompts[lo:hi], [[c.token_ids for c in cs] for cs in comps[lo:hi]], rewards[lo * G:hi * G],
                        pad_id=0, logprobs=[[c.logprobs for c in cs] for cs in comps[lo:hi]])
        b.old_entropy = torch.rand(b.input_ids.shape, generator=torch.Generator().manual_seed(lo)) * b.response_mask
        # (the log-prob mismatch as the loop computes it, from the learner's log-probs: the engine's + noise)
        diff = (torch.rand(b.input_ids.shape, generator=torch.Generator().manual_seed(9 + lo)) * b.response_mask)
        d = diff[b.response_mask > 0].double()
        mismatch = {"rollout/logprob_diff_mean": float(d.mean()), "rollout/logprob_diff_max": float(d.max())}
        return step_record(b, comps[lo:hi], {}, mismatch, {}, {"time/step": 1.0, "time/rollout": 0.5}, epoch=2), b

    whole, wb = record(0, 4)
    parts = [record(0, 2)[0], record(2, 4)[0]]

    class TwoGroups(World):
        def gather_dp(self, obj):
            return parts

    got = TwoGroups(rank=0, size=2, dp=2).reduce_record(dict(parts[0]), WEIGHTED_MEANS)
    # the whole step's entropy / mismatch from the shares' own tensors (the seeds differ per share): by hand
    ents, diffs = [], []
    for lo, hi in ((0, 2), (2, 4)):
        _, b = record(lo, hi)
        ents.append(b.old_entropy[b.response_mask > 0].double())
        diff = torch.rand(b.input_ids.shape, generator=torch.Generator().manual_seed(9 + lo)) * b.response_mask
        diffs.append(diff[b.response_mask > 0].double())
    whole["entropy"] = float(torch.cat(ents).mean())
    whole["rollout/logprob_diff_mean"] = float(torch.cat(diffs).mean())
    whole["rollout/logprob_diff_max"] = float(torch.cat(diffs).max())
    for k, v in whole.items():
        if k.startswith(("time/", "perf/")):
            continue
        assert got[k] == pytest.approx(v, rel=1e-6), (k, got[k], v)
    assert whole["reward/all_wrong_groups"] == 0.5 and whole["reward/all_correct_groups"] == 0.25
