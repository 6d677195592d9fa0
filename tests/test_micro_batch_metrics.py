"""A learner metric is the mini-batch's, however the mini-batch is split into micro-batches.

The objective (pacs_fast/learner/objective.py) weights each micro-batch's metrics so that their sum over the
micro-batches of a mini-batch is the mini-batch's value: token means by the micro-batch's share of the loss tokens,
means over rows by its share of the rows. The per-sequence means ``seq_ratio_mean`` (GSPO / GMPO) and
``phi_seq_mean`` (VESPO) are means over the sequences that have loss tokens, but they were weighted by the share of
tokens (VESPO) or of all rows (GSPO / GMPO). Long responses then counted for more than short ones. So did a
micro-batch whose rows ``learner.mask_truncated`` takes out of the loss. The logged value was the mean of the
sequences of another weighting (metrics audit of 2026-12-03, the batch below in three micro-batches: VESPO's
``phi_seq_mean`` 0.763 where its sequences' mean is 0.843; GSPO's ``seq_ratio_mean`` 0.672 against 1.008 with the
short group truncated).
"""
import pytest
import torch

from pacs_fast.config import AlgoConfig
from pacs_fast.learner.base import RolloutBatch
from pacs_fast.learner.objective import minibatch_counts, objective

G, GROUPS, T = 4, 3, 12


def _batch(seed: int, truncate: bool) -> tuple[RolloutBatch, torch.Tensor]:
    """Three groups of 4 whose response lengths differ from group to group (long, short, mixed); with ``truncate``
    the second group's rows leave the loss (``batch.truncated``). Old log-probs one policy step from ``logp``."""
    gen = torch.Generator().manual_seed(seed)
    B = G * GROUPS
    lengths = [10] * G + [2] * G + [int(n) for n in torch.randint(1, 11, (G,), generator=gen)]
    mask = torch.zeros(B, T)
    for b, n in enumerate(lengths):
        mask[b, 1:1 + n] = 1
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0] * GROUPS, dtype=torch.float64)
    batch = RolloutBatch(torch.randint(3, 50, (B, T), generator=gen), torch.ones(B, T, dtype=torch.long), mask,
                         rewards, group_size=G)
    logp = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 2
    batch.old_logp = logp + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.3 * torch.tensor(
        [[1.0]] * G + [[0.1]] * G + [[0.5]] * G, dtype=torch.float64)
    if truncate:
        batch.truncated = torch.tensor([False] * G + [True] * G + [False] * G)
    return batch, logp


@pytest.mark.parametrize("truncate", [False, True])
@pytest.mark.parametrize("name, key", [("gspo", "seq_ratio_mean"), ("gmpo", "seq_ratio_mean"),
                                       ("vespo", "phi_seq_mean"),
                                       ("grpo", "clip_frac"), ("grpo", "adv_abs_mean")])
def test_micro_batch_metrics_add_up_to_the_mini_batch_metric(name, key, truncate):
    algo = AlgoConfig(name=name)
    batch, logp = _batch(3, truncate)
    counts = minibatch_counts(batch)
    _, whole = objective(algo, batch, logp, None, None, counts, horizon=T)
    parts = [objective(algo, batch.groups([g]), logp[g * G:(g + 1) * G], None, None, counts, horizon=T)[1]
             for g in range(GROUPS)]
    assert key in whole, sorted(whole)
    # float64 inputs: the sum of three weighted means matches to rounding (~1e-16); a wrong weighting is off by
    # more than 1e-3 with these lengths (10, 2 and mixed tokens a row)
    assert float(sum(p[key] for p in parts)) == pytest.approx(float(whole[key]), rel=1e-9, abs=1e-12), key
    if key.endswith("seq_mean") or key == "seq_ratio_mean":  # the mean over the sequences that train, by hand
        rows = [g for g in range(GROUPS) if not (truncate and g == 1)]
        per_seq = [float(objective(algo, batch.groups([g]), logp[g * G:(g + 1) * G], None, None,
                                   minibatch_counts(batch.groups([g])), horizon=T)[1][key]) for g in rows]
        assert float(whole[key]) == pytest.approx(sum(per_seq) / len(per_seq), rel=1e-9)
