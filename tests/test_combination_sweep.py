"""Hostile sweep of feature combinations of ``python -m pacs_fast.train`` (2026-12-06) on a Qwen2.5-shaped model.

Found and fixed (failed before its fix):
- PACS (``algo.score`` rloo / grpo / dr_grpo) with ``learner.mask_truncated``: a group left with one response drops
  out of the loss, so a step whose responses were all cut but one per group trained nothing (loss 0, gradient 0;
  7 of 8 cut at ``rollout.max_new_tokens=8``, both learners) without the warning a step with every response cut gets.
"""
from __future__ import annotations

from types import SimpleNamespace

from pacs_fast.config import load_config
from pacs_fast.trainer.step import score_and_batch


def _state(*overrides):
    cfg = load_config(None, ["learner.mask_truncated=true", "rollout.n=2", "rollout.max_new_tokens=3", *overrides])
    lines = []
    s = SimpleNamespace(cfg=cfg, scorer=lambda texts, answers, **k: [1.0, 0.0] * (len(texts) // 2), credit=None,
                        tokenizer=SimpleNamespace(pad_token_id=0), log=lines.append, world=SimpleNamespace(dp=1))
    return s, lines


def _comp(reason):
    return SimpleNamespace(text="7", token_ids=[5, 6, 7], finish_reason=reason, logprobs=None)


PROBLEMS = [{"prompt_ids": [1, 2], "answer": "7"}] * 2
ALONE = [[_comp("length"), _comp("stop")], [_comp("length")] * 2]  # one response left, alone in its group


def test_pacs_with_only_lone_responses_left_is_a_warning():
    s, lines = _state()
    score_and_batch(s, 4, PROBLEMS, ALONE, {})
    assert len(lines) == 1, lines
    assert lines[0].startswith("warning: step 4: learner.mask_truncated takes every response of this batch out of "
                               "the loss (3 of 4 ended at rollout.max_new_tokens=3 without EOS; the other 1 are each "
                               "the only one left in its group, which algo.score=rloo cannot score): its gradient is "
                               "zero"), lines


def test_no_warning_where_a_group_keeps_two_or_the_score_needs_none():
    s, lines = _state()
    score_and_batch(s, 4, PROBLEMS, [[_comp("stop")] * 2, [_comp("length")] * 2], {})
    assert lines == []
    for extra in (["algo.score=naive"], ["algo.name=grpo"]):  # a lone row trains there
        s, lines = _state(*extra)
        score_and_batch(s, 4, PROBLEMS, ALONE, {})
        assert lines == [], (extra, lines)


def test_the_lone_rows_are_summed_over_data_parallel_shares_in_the_one_collective():
    """The lone-row count rides in the step's one gather of its shaping counts (every rank the same length)."""
    import torch

    from pacs_fast.learner.base import RolloutBatch
    from pacs_fast.trainer.step import step_shaping_counts

    gathered = []

    class World:  # two data-parallel groups: this one's share and the other's (4 rows, 1 cut, none alone)
        dp = 2

        def gather_dp(self, mine):
            gathered.append(mine)
            return [mine, (4, 0.0, 1, 0)]

    batch = RolloutBatch(input_ids=torch.zeros(4, 5, dtype=torch.long), attention_mask=torch.ones(4, 5),
                         response_mask=torch.ones(4, 5), rewards=torch.zeros(4), group_size=2)
    batch.truncated = torch.tensor([True, False, True, True])  # group 0: one row left alone; group 1: none left
    assert step_shaping_counts(World(), batch, {}, lone=True) == (8, 0.0, 4, 1)
    assert gathered == [(4, 0.0, 3, 1)]  # one collective, the fourth count in it
