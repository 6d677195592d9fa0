"""``pacs/*`` of a step count each row once, with its last forward's score, as ``samples.jsonl`` does.

With ``learner.epochs=2`` the learner records PACS's per-row terms in both epochs (``learner.last_terms``, the rows
in each mini-batch's order). The step's statistics had pooled both epochs: twice the rows, and a spread across
two policies' scores. The samples and the calibration plot hold each row's last score, so the logged
``pacs/brier`` / ``psi_std`` disagreed with what the samples file gives (metrics audit of 2026-12-03: brier 0.200
logged, 0.162 from the samples of the same step).
"""
import pytest
import torch

from pacs_fast.algorithms.score_metrics import score_metrics
from pacs_fast.learner.base import RolloutBatch
from pacs_fast.trainer.parallel import World
from pacs_fast.trainer.step import sample_rows, terms_over_groups

G, B, T = 4, 8, 5


def test_each_row_counts_once_with_its_last_epochs_score():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    batch = RolloutBatch(torch.ones(B, T, dtype=torch.long), torch.ones(B, T, dtype=torch.long), torch.ones(B, T),
                         rewards, group_size=G)
    first, last = torch.zeros(B, dtype=torch.float64), torch.randn(B, generator=gen, dtype=torch.float64) * 2
    # epoch 1 saw the rows in one order (scores 0: the policy before the update), epoch 2 in another
    order1, order2 = torch.tensor([4, 5, 6, 7, 0, 1, 2, 3]), torch.tensor([1, 0, 3, 2, 7, 6, 5, 4])
    psi = torch.cat([first[order1], last[order2]])
    rows = torch.cat([order1, order2])
    terms = {"psi": psi, "pred_reward": torch.sigmoid(psi), "proxy": psi / 2, "rewards": rewards[rows], "rows": rows}
    got = score_metrics(**{k: v for k, v in terms_over_groups(World(), terms, batch).items() if k != "rows"})
    want = score_metrics(last, torch.sigmoid(last), rewards, last / 2)
    assert got == pytest.approx(want, rel=1e-12, nan_ok=True)  # the same rows in another order: rounding only
    pooled = score_metrics(psi, torch.sigmoid(psi), rewards[rows], psi / 2)  # what the step recorded before
    for key in ("pacs/brier", "pacs/psi_std"):  # (the old pooling is off by far more than rounding)
        assert abs(pooled[key] - want[key]) > 1e-2, key
    # samples.jsonl's psi of each row: the same last score
    comps = [[type("C", (), {"text": "x", "token_ids": [1], "finish_reason": "stop"})() for _ in range(G)]
             for _ in range(B // G)]
    tok = type("Tok", (), {"decode": lambda self, ids, **kw: "p"})()
    problems = [{"prompt_ids": [1], "answer": "1"}] * (B // G)
    samples = sample_rows(1, tok, problems, comps, rewards.tolist(), terms, B)
    assert [r["psi"] for r in samples] == pytest.approx(last.tolist(), rel=0, abs=0)
