"""Process rewards in the trainer (reward.step_rewards, pacs_fast/trainer/step_credit.py): step
splitting on token boundaries, token advantages against a hand computation (PURE's min-form and
the summation form, with and without the verifier's reward), the RLOO identity through the
learner's objective, config errors, and a short run."""
import pytest
import torch

from pacs_fast.trainer.batch import build_batch
from pacs_fast.trainer.step_credit import StepCredit, step_ends

CALLS = []


def digit_steps(prompts, steps, answers):
    """A test 'process reward model': a step scores 1 if its text holds a digit, else 0."""
    CALLS.append((len(prompts), [len(s) for s in steps], list(answers[:1])))
    return [[float(any(ch.isdigit() for ch in t)) for t in s] for s in steps]


@pytest.mark.parametrize("pieces,delim,ends", [
    (["a", "\n", "\n", "b"], "\n\n", [3, 4]),          # a delimiter over two tokens ends at its second
    ([".\n\n", "x", "y"], "\n\n", [1, 3]),               # inside one token
    (["a", "\n\n"], "\n\n", [2]),                        # ends with the delimiter: no empty last step
    (["\n\n\n\n", "b"], "\n\n", [1, 2]),                 # two delimiters in one token: one step end
    (["ab"], "\n\n", [1]),                               # no delimiter: one step
    ([], "\n\n", [0]),                                   # no token: one empty step
    (["1", ";", "2", ";", "3"], ";", [2, 4, 5]),
])
def test_step_ends_by_hand(pieces, delim, ends):
    assert step_ends(pieces, delim) == ends


def bpe_tokenizer():
    """A byte-level BPE tokenizer (Qwen2.5's kind: bytes -> merges) trained on a few lines, so
    that '\\n\\n' is one token and multi-byte characters split over several byte tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["Step 1: add 2 and 3.\n\nStep 2: the sum is 5.\n\nAnswer: 5"] * 20 + ["café"] * 5
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def test_bpe_steps_keep_characters_whole():
    tok = bpe_tokenizer()
    text = "Step 1: 日本 café.\n\nStep 2: ∑ is 5.\n\nAnswer: 5"
    ids = tok.encode(text) + [tok.eos_token_id]
    credit = StepCredit(digit_steps, tok)
    pieces = credit.pieces(ids)
    assert "".join(pieces) != text  # byte tokens of 日 / ∑ decode alone to replacement characters
    ends, texts = credit.split_steps(ids)
    assert texts == ["Step 1: 日本 café.\n\n", "Step 2: ∑ is 5.\n\n", "Answer: 5"]
    assert ends[-1] == len(ids)


def char_batch(prompts, responses, rewards):
    from pacs_fast.data.tiny import build_char_tokenizer
    tok = build_char_tokenizer()
    pids = [tok.encode(p, add_special_tokens=False) for p in prompts]
    rids = [[tok.encode(r, add_special_tokens=False) for r in group] for group in responses]
    return tok, pids, rids, build_batch(pids, rids, rewards, pad_id=0)


@pytest.mark.parametrize("form,w", [("min", 0.0), ("min", 1.0), ("sum", 0.0), ("sum", 0.5)])
def test_token_advantages_by_hand(form, w):
    def table(prompts, steps, answers):  # fixed step rewards by response text
        scores = {"a;b;c": [0.9, 0.2, 0.7], "d;e": [0.5, 0.8], "f": [0.4]}
        return [scores["".join(s)] for s in steps]

    tok, pids, rids, batch = char_batch(["1+1=", "2+2="], [["a;b;c", "d;e"], ["f", "d;e"]], [1.0, 0.0, 0.0, 1.0])
    credit = StepCredit(table, tok, split=";", form=form, gamma=0.5, outcome_weight=w)
    adv = credit.advantages(pids, rids, ["2", "4"], batch)
    # returns per step (min: min of the rest; sum: gamma = 0.5 discounted sum of the rest) + w R
    if form == "min":
        g = {"a;b;c": [0.2, 0.2, 0.7], "d;e": [0.5, 0.8], "f": [0.4]}
    else:
        g = {"a;b;c": [0.9 + 0.1 + 0.175, 0.2 + 0.35, 0.7], "d;e": [0.5 + 0.4, 0.8], "f": [0.4]}
    rows = [("a;b;c", 1.0), ("d;e", 0.0), ("f", 0.0), ("d;e", 1.0)]
    ret = [[x + w * R for x in g[t]] for t, R in rows]
    base = [ret[1][0], ret[0][0], ret[3][0], ret[2][0]]  # G = 2: the other response's first-step return
    expected = torch.zeros_like(adv)
    for b, ((text, _), r) in enumerate(zip(rows, ret)):
        col = len(pids[b // 2])
        for k, step in enumerate(text.split(";")):
            n = len(step) + (k < len(text.split(";")) - 1)  # the delimiter ends its step
            expected[b, col:col + n] = r[k] - base[b]
            col += n
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)
    assert credit.last["process/steps_mean"] == pytest.approx((3 + 2 + 1 + 2) / 4)
    assert credit.last["process/steps"] == 8  # the weight of step_reward_mean over data-parallel groups


def test_zero_step_rewards_give_rloo_through_the_objective(seed):
    """Every step reward 0, w = 1: the process advantages are RLOO's outcome advantages, so the
    learner's objective (per-token path) equals its outcome path (RLOO through grpo_loss)."""
    from pacs_fast.config import AlgoConfig
    from pacs_fast.learner.objective import minibatch_counts, objective
    g = torch.Generator().manual_seed(seed)
    words = ["x;y", "zz", "a;b;c", "q", "r;s", "tt;u", "v", "w;w"]
    tok, pids, rids, batch = char_batch(["1+2=", "3+4="], [words[:4], words[4:]],
                                        torch.randint(0, 2, (8,), generator=g).float().tolist())
    credit = StepCredit(lambda p, steps, a: [[0.0] * len(s) for s in steps], tok, split=";", outcome_weight=1.0)
    adv = credit.advantages(pids, rids, ["3", "7"], batch)
    batch.old_logp = -torch.rand(batch.input_ids.shape, generator=g, dtype=torch.float64) * batch.response_mask
    logp = (batch.old_logp + 0.1 * torch.randn(batch.input_ids.shape, generator=g, dtype=torch.float64)
            * batch.response_mask).requires_grad_()
    algo = AlgoConfig(name="rloo")
    counts = minibatch_counts(batch)
    outcome_loss, _ = objective(algo, batch, logp, None, None, counts, horizon=8)
    batch.advantages = adv.double()
    process_loss, _ = objective(algo, batch, logp, None, None, counts, horizon=8)
    torch.testing.assert_close(process_loss, outcome_loss, rtol=1e-12, atol=1e-12)
    adv2 = adv.clone()
    adv2[0] += 1.0 * batch.response_mask[0]  # and a different advantage changes the loss
    batch.advantages = adv2.double()
    assert not torch.allclose(objective(algo, batch, logp, None, None, counts, horizon=8)[0], outcome_loss)


def test_bad_returns_name_the_key():
    tok, pids, rids, batch = char_batch(["1+1="], [["a;b", "c"]], [1.0, 0.0])
    for fn, match in ((lambda p, s, a: [[1.0]], "returned 1 lists for 2 responses"),
                      (lambda p, s, a: [[1.0], [1.0]], "returned 1 rewards for response 0, which has 2 steps"),
                      (lambda p, s, a: [[1.0, float("nan")], [0.0]], "non-finite"),
                      # finite in float64 but overflowing the float32 update (it stopped blaming learner.lr)
                      (lambda p, s, a: [[1.0, 1e30], [0.0]], r"returned a step reward of 1e\+30 for response 0: "
                                                             r"step rewards must lie within \+-1e\+06")):
        with pytest.raises(ValueError, match="reward.step_rewards " + match if "non" not in match else match):
            StepCredit(fn, tok, split=";").advantages(pids, rids, ["2"], batch)


@pytest.mark.parametrize("overrides,match", [
    (["reward.step_rewards=test_step_credit:digit_steps", "algo.name=grpo"], "needs algo.name=rloo"),
    (["reward.step_rewards=nodots", "algo.name=rloo"], "must look like 'module:function'"),
    (["reward.step_rewards=test_step_credit:digit_steps", "algo.name=rloo", "algo.credit=max"], "algo.credit"),
    (["reward.step_rewards=test_step_credit:digit_steps", "algo.name=rloo", "reward.step_split="], "step_split"),
    (["reward.outcome_weight=-1"], "reward.outcome_weight"),
])
def test_config_errors(overrides, match):
    from pacs_fast.config import load_config, validate
    with pytest.raises(ValueError, match=match):
        validate(load_config(None, overrides))


def test_unimportable_function_fails_before_any_model_work(tmp_path):
    from pacs_fast.config import load_config
    from pacs_fast.trainer import train
    from pacs_fast.trainer.loop import SetupError
    cfg = load_config(None, ["algo.name=rloo", "reward.step_rewards=no_such_module_xyz:f",
                             f"warmup.cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(SetupError, match=r"reward.step_rewards='no_such_module_xyz:f' cannot be loaded"):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "cache").exists()  # no warm-up (no model) was started


@pytest.mark.parametrize("body, raised", [("raise RuntimeError('no config here')", "RuntimeError: no config here"),
                                           ("def f(:", "SyntaxError")])
def test_a_module_that_fails_to_import_is_one_line_naming_the_key(tmp_path, monkeypatch, body, raised):
    """Before, only a missing module or function was caught: a module raising while it ran (or not
    parsing) gave a traceback and exit 1 (hostile sweep, 2026-11-28)."""
    from pacs_fast.config import load_config
    from pacs_fast.trainer import train
    from pacs_fast.trainer.loop import SetupError
    name = f"user_fn_{abs(hash(body)) % 10**8}"
    (tmp_path / f"{name}.py").write_text(body + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(None, ["algo.name=rloo", f"reward.step_rewards={name}:f", f"warmup.cache_dir={tmp_path / 'c'}"])
    with pytest.raises(SetupError) as info:
        train(cfg, tmp_path / "run")
    msg = str(info.value)
    assert msg.startswith(f"reward.step_rewards='{name}:f' cannot be loaded: importing {name} raised") and \
        raised in msg and "\n" not in msg, msg
    assert not (tmp_path / "c").exists()


def test_short_run_with_process_rewards(tmp_path, warm_cache):
    from test_train import TINY

    from pacs_fast.config import load_config
    from pacs_fast.trainer import train
    from pacs_fast.trainer.metrics import read_jsonl
    CALLS.clear()
    cfg = load_config(None, TINY + [f"warmup.cache_dir={warm_cache}", "train.steps=2", "train.eval_every=0",
                                    "train.save_every=0", "algo.name=rloo", "train.tensorboard=false",
                                    "train.plots=false", "reward.step_rewards=test_step_credit:digit_steps",
                                    "reward.step_split=1"])  # wiring only: the splitting is checked above
    train(cfg, tmp_path / "run")
    assert [n for n, _, _ in CALLS] == [16, 16]  # 4 prompts x G = 4 per step
    assert all(len(steps) == 16 and min(steps) >= 1 for _, steps, _ in CALLS)
    recs = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert len(recs) == 2 and all(r["process/steps_mean"] >= 1 for r in recs)
    assert all(torch.isfinite(torch.tensor(r["learner/loss"])) for r in recs)


def no_rewards(prompts, steps, answers):
    """A broken 'process reward model': no reward for any step (every response has >= 1 step)."""
    return [[] for _ in steps]


def test_a_bad_return_stops_the_run_with_one_line(tmp_path, warm_cache):
    """Found only once responses exist (step 1): the CLI stops with exit 1 and one line naming
    the key and the step, and writes no checkpoint for it."""
    import os
    import subprocess
    import sys

    from test_train import TINY
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "pacs_fast.train", *TINY, f"warmup.cache_dir={warm_cache}",
                          f"train.out_dir={tmp_path / 'runs'}", "train.run_name=r", "train.steps=2", "algo.name=rloo",
                          "reward.step_rewards=test_step_credit:no_rewards"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: step 1: reward.step_rewards returned 0 rewards for response 0"), out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "runs" / "r" / "checkpoints").exists() or \
        not any((tmp_path / "runs" / "r" / "checkpoints").glob("step_*"))
