"""Held-out evaluation during training (``pacs_fast/trainer/evaluation.py``) on the tiny model."""
import numpy as np
import pytest

from pacs_fast.config import load_config
from pacs_fast.data.prompts import encode_prompts
from pacs_fast.data.tiny import make_tiny_model
from pacs_fast.rollout.base import SamplingParams
from pacs_fast.rollout.hf import HFEngine
from pacs_fast.trainer.evaluation import evaluate
from pacs_fast.trainer.rewards import Scorer


class OneGroup:
    """The world of a single process: one data-parallel group holding every problem."""

    def split(self, items):
        return items, 0

    def gather_dp(self, part):
        return [part]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = HFEngine(make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0))
    eng.calls = []
    real = eng.generate

    def counting(prompts, params):
        eng.calls.append((len(prompts), params.n, params.temperature))
        return real(prompts, params)

    eng.generate = counting
    return eng


def _problems(engine, seed):
    rng = np.random.default_rng(seed)
    pairs = [(int(a), int(b)) for a, b in rng.integers(0, 9, (5, 2))]
    ids = encode_prompts(engine.tokenizer, [f"{a}+{b}=" for a, b in pairs])
    return [{"prompt_ids": p, "answer": str(a + b)} for p, (a, b) in zip(ids, pairs)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_greedy_evaluation_generates_each_problem_once(engine, seed, temperature):
    """At eval_temperature 0 every one of eval_n samples would be the same response: the engine is
    asked for one per problem (not eval_n copies), and the metrics equal a greedy decode scored once."""
    cfg = load_config(None, ["rollout.eval_n=4", f"rollout.eval_temperature={temperature}",
                             "rollout.max_new_tokens=4", f"train.seed={seed % 1000}"])
    problems = _problems(engine, seed)
    scorer = Scorer(0)
    engine.calls.clear()
    out = evaluate(cfg, engine, scorer, problems, OneGroup())
    if temperature == 0:
        assert engine.calls == [(5, 1, 0.0)]
        greedy = engine.generate([p["prompt_ids"] for p in problems],
                                 SamplingParams(n=1, temperature=0.0, max_new_tokens=4))
        rewards = scorer([c[0].text for c in greedy], [p["answer"] for p in problems])
        assert out["eval/acc"] == pytest.approx(np.mean(rewards), abs=1e-12)
        assert out["eval/pass@n"] == pytest.approx(np.mean(np.asarray(rewards) > 0.5), abs=1e-12)
        assert out["eval/response_length"] == pytest.approx(np.mean([len(c[0].token_ids) for c in greedy]))
        assert "eval/greedy_acc" not in out
    else:  # sampled: eval_n samples per problem, then one greedy decode for eval/greedy_acc
        assert engine.calls == [(5, 4, 1.0), (5, 1, 0.0)]
        assert 0.0 <= out["eval/acc"] <= out["eval/pass@n"] <= 1.0 and "eval/greedy_acc" in out


def test_eval_line_prints_greedy_only_when_measured_apart():
    from pacs_fast.trainer.evaluation import eval_line

    assert eval_line(5, {"eval/acc": 0.4125, "eval/greedy_acc": 0.5}) == \
        "step 5: held-out accuracy 0.412 (greedy 0.500)"
    assert eval_line(0, {"eval/acc": 0.25}) == "step 0: held-out accuracy 0.250"  # eval_temperature 0: no 'nan'
