"""A step's record over data-parallel groups equals the record one process makes of the whole step.

Each group builds the record of its own share, and ``World.reduce_record`` combines them. A mean of the groups'
own statistics is not the whole step's for a standard deviation, an extremum, a mean over the rows of one label or
a per-token mean over shares of unequal token counts: a sweep found ``pacs/calib_gap`` 0 on one process against
0.25 on two, ``correction/is_weight_max`` 2.0 against 1.57 (issue 41's "results equal the single-process run").
Here both groups run in this process: a fake world hands each collective the other group's object.
"""
import pytest
import torch

from pacs_fast.algorithms.off_policy import off_policy_correction
from pacs_fast.learner.base import RolloutBatch
from pacs_fast.rollout.base import Completion
from pacs_fast.trainer.parallel import World
from pacs_fast.trainer.step import WEIGHTED_MEANS, step_record, terms_over_groups

G, GROUPS, T = 4, 4, 7


def _step(seed):
    """A whole step: batch, completions, PACS's per-row terms, the correction's log-probs; the two shares
    differ on purpose (rewards mostly 1 vs mostly 0, calm vs wide scores, long vs short responses)."""
    gen = torch.Generator().manual_seed(seed)
    B = G * GROUPS
    half = B // 2
    mask = torch.zeros(B, T)
    for b in range(B):
        n = int(torch.randint(4 if b < half else 0, T if b < half else 4, (), generator=gen))
        mask[b, 1:1 + n] = 1 if b < B - 1 else 0  # (the last row empty: seq_log_ratio_mean counts fewer rows there)
    rewards = torch.cat([(torch.rand(half, generator=gen) < 0.8), (torch.rand(half, generator=gen) < 0.2)]).double()
    # overlong shaping: the learner trains on soft labels, the verifier said `rewards` (reward.overlong_buffer_len)
    shaped = (rewards - 0.75 * (torch.rand(B, generator=gen) < 0.3).double()).clamp(min=0)
    batch = RolloutBatch(torch.randint(3, 50, (B, T), generator=gen), torch.ones(B, T, dtype=torch.long), mask,
                         shaped, group_size=G)
    batch.verifier_rewards = rewards
    batch.old_entropy = torch.rand(B, T, generator=gen) * 3
    psi = torch.randn(B, generator=gen, dtype=torch.float64) * torch.tensor([0.2] * half + [2.0] * half,
                                                                           dtype=torch.float64)
    terms = {"psi": psi, "pred_reward": torch.sigmoid(psi), "proxy": psi * 0.5, "rewards": shaped}  # per row
    proximal = -torch.rand(B, T, generator=gen) * mask
    spread = torch.tensor([[0.05]] * half + [[0.6]] * half)
    behaviour = (proximal + torch.randn(B, T, generator=gen) * spread) * mask
    comps = [[Completion([1] * int(mask[i * G + j].sum()), "x", "length" if (i * G + j) % 5 == 0 else "stop")
              for j in range(G)] for i in range(GROUPS)]
    return batch, comps, terms, proximal, behaviour


def _record(batch, comps, terms, proximal, behaviour, rows, world):
    """The record of the rows ``rows`` (a share, or everything), built as the loop builds it."""
    share = batch.groups(list(range(rows.start // G, rows.stop // G)))
    # the learner's terms: its rows of this batch in its own order (shuffled, length-sorted), once per epoch
    # (learner.epochs=2), with the labels it trained on
    order = torch.Generator().manual_seed(rows.start)
    local = torch.cat([torch.randperm(rows.stop - rows.start, generator=order) for _ in range(2)])
    mine = {**{k: v[rows.start + local] for k, v in terms.items()}, "rows": local}
    mask = batch.response_mask[rows] > 0
    _, _, corr = off_policy_correction(proximal[rows], behaviour[rows], mask, is_level="token", is_cap=2.0)
    diff = (proximal[rows] - behaviour[rows]).abs()[mask]
    mismatch = {"rollout/logprob_diff_mean": float(diff.double().mean()), "rollout/logprob_diff_max": float(diff.max())}
    timings = {"time/step": 1.0, "time/rollout": 0.5}
    record = step_record(share, comps[rows.start // G:rows.stop // G], {"loss": 0.5}, mismatch,
                         terms_over_groups(world, mine, share), timings, epoch=0)
    return {**record, **{f"correction/{k}": v for k, v in corr.items()}}


class OneOfTwo(World):
    """Group ``dp_rank`` of two, in one process: each collective returns both groups' objects, the other group's
    taken in call order from ``others`` (the loop makes the same calls on every rank); ``sent`` keeps this one's."""

    def __init__(self, dp_rank, others):
        super().__init__(rank=dp_rank, size=2, dp=2, dp_rank=dp_rank)
        self.others, self.sent = list(others), []

    def gather_dp(self, obj):
        self.sent.append(obj)
        other = self.others.pop(0) if self.others else obj  # (a first pass, which only records what it sends)
        return [obj, other] if self.dp_rank == 0 else [other, obj]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_groups_record_what_one_process_records(seed):
    step = _step(seed)
    B = G * GROUPS
    one = _record(*step, slice(0, B), World())
    halves = (slice(0, B // 2), slice(B // 2, B))
    first = [OneOfTwo(r, []) for r in (0, 1)]  # what each group hands the first collective (its rows' terms)
    for r in (0, 1):
        _record(*step, halves[r], first[r])
    group1 = OneOfTwo(1, [first[0].sent[0]])
    part1 = _record(*step, halves[1], group1)
    group0 = OneOfTwo(0, [first[1].sent[0], part1])
    two = group0.reduce_record(_record(*step, halves[0], group0), WEIGHTED_MEANS)
    assert not group0.others and not group1.others  # every collective was answered, in the loop's order
    # the shares differ where the mean of each group's own statistic is not the whole step's (the old reduction)
    alone = [_record(*step, rows, World()) for rows in (slice(0, B // 2), slice(B // 2, B))]
    for k in ("pacs/calib_gap", "pacs/psi_std", "pacs/pred_reward_pos", "correction/is_weight_max",
              "correction/seq_log_ratio_min", "correction/kl_k1", "rollout/logprob_diff_max", "entropy",
              "correction/seq_log_ratio_mean"):
        assert abs((alone[0][k] + alone[1][k]) / 2 - one[k]) > 1e-3 * max(abs(one[k]), 1e-3), k
    skip = {"perf/tokens_per_s", "perf/rollout_tokens_per_s",  # throughputs: each group's own, added up
            "response/tokens", "correction/seqs"}  # the weights of the means: added up, as one process counts them
    assert set(one) == set(two)
    for k in sorted(set(one) - skip):  # float32 means (the entropy's, the correction's) summed in another order:
        assert two[k] == pytest.approx(one[k], rel=1e-6, abs=1e-9), k  # ~1e-8; the wrong reductions are off by > 1e-3
    assert two["response/tokens"] == one["response/tokens"]
    assert two["correction/seqs"] == one["correction/seqs"]


def test_a_mean_over_process_steps_is_weighted_by_each_groups_steps():
    """process/step_reward_mean is a mean over reasoning steps: two groups with 6 and 2 steps."""
    world = OneOfTwo(0, [{"process/steps": 2.0, "process/step_reward_mean": 1.0, "process/steps_mean": 1.0}])
    mine = {"process/steps": 6.0, "process/step_reward_mean": 0.0, "process/steps_mean": 3.0}
    assert world.reduce_record(mine, WEIGHTED_MEANS) == {"process/steps": 8.0, "process/step_reward_mean": 0.25,
                                                         "process/steps_mean": 2.0}


def test_the_score_is_calibrated_against_the_verifier_not_the_shaped_label():
    """With overlong shaping the learner's labels are soft (0.25 for a correct response in the buffer): pacs/* compare
    sigmoid(psi) with what the verifier said, as reward/* and the calibration plot do (a sweep found
    pacs/pred_reward_pos NaN: no label was exactly 1)."""
    batch, comps, terms, proximal, behaviour = _step(3)
    R, pred = batch.verifier_rewards, terms["pred_reward"]
    assert not torch.equal(terms["rewards"], R) and bool((terms["rewards"][R > 0.5] < 1).any())
    rec = _record(batch, comps, terms, proximal, behaviour, slice(0, G * GROUPS), World())
    assert rec["pacs/pred_reward_pos"] == pytest.approx(float(pred[R > 0.5].mean()))
    assert rec["pacs/pred_reward_neg"] == pytest.approx(float(pred[R <= 0.5].mean()))
    assert rec["pacs/calib_gap"] == pytest.approx(float((pred.mean() - R.mean()).abs()))
    assert rec["pacs/brier"] == pytest.approx(float(((pred - R) ** 2).mean()))
    assert rec["reward/mean"] == pytest.approx(float(R.mean()))
