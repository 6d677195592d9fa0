"""What every adapter needs: whole-group checks, the reward + group tag carried in an
``advantages`` tensor, and PACS's calibration metrics.

A PACS score couples the G responses to one prompt (``psi_i`` depends on the proxies of its
group mates), so a loss call must see whole groups, each as G contiguous rows. The frameworks
shuffle and split batches freely; these checks turn a broken layout into a one-line error that
names the setting to change instead of a silently wrong loss.

Tagged advantages (verl, OpenRLHF). Their policy-loss hooks receive per-token ``advantages`` and
nothing else per sequence, so the adapters' advantage step writes, on every response token,

    advantages[i, t] = R_i + 2 * (1 + k_i mod M)        (R_i in [0, 1], k_i the group index)

and the loss reads ``R_i`` and a group tag back (``decode_tagged_advantages``). With 0/1 rewards
M = BINARY_GROUP_TAGS = 127: the values are integers in [2, 256), exact in any float dtype (bf16 included).
With soft rewards M = GROUP_TAGS = 15: the values lie in [2, 32), where fp32 keeps about 2e-6 absolute
precision, and bf16 / fp16 advantages (which would round them) are refused. The tags start at 1 so that an
ordinary advantage of 0 (GRPO's on a group of equal rewards) is never read as a reward of 0 in group 0. The
group check tells groups apart by their tag, so it cannot see rows of groups k and k + M put together in one
run of G rows.
"""
from __future__ import annotations

import torch

from pacs_fast.algorithms._checks import check_real
from pacs_fast.algorithms.score_metrics import score_metrics

GROUP_TAGS = 15  # group tags 1..15 with soft rewards (values < 32: fp32 keeps 2**-19)
BINARY_GROUP_TAGS = 127  # group tags 1..127 with 0/1 rewards (integers < 256: exact in bf16, fp16 and fp32)


def check_beta(beta, where: str) -> float:
    """PACS's beta as a float: a finite real number > 0 (numpy scalars too); else a ValueError
    naming ``where``. beta scales the proxy r_i = beta * sum_t (logp - logp_ref) (paper eq. 8); it is
    not a KL coefficient: 0 gives an exactly zero gradient and a negative beta trains against the
    verifier."""
    try:
        return check_real(where, "beta", beta, positive=True)
    except ValueError:
        raise ValueError(f"{where}: beta must be a finite number > 0, got {beta!r} (PACS's proxy scale, not a KL "
                         "coefficient: beta=0 gives an exactly zero gradient, beta<0 trains against the "
                         "verifier)") from None


def check_batch_rows(num_rows: int, group_size: int, fix: str) -> None:
    """A micro-batch of ``num_rows`` rows must hold whole groups of ``group_size``."""
    if group_size < 1:
        raise ValueError(f"PACS: group size must be >= 1, got {group_size}")
    if num_rows == 0 or num_rows % group_size:
        raise ValueError(f"PACS: a micro-batch of {num_rows} rows does not hold whole groups of "
                         f"{group_size} responses; {fix}")


def check_whole_groups(group_ids: torch.Tensor, group_size: int, fix: str) -> None:
    """``group_ids`` ``[B]`` (any integer ids; equal id = same prompt) must form B/G runs of G
    contiguous equal ids, consecutive runs differing. Raises ValueError ending in ``fix``."""
    check_batch_rows(group_ids.shape[0], group_size, fix)
    runs = group_ids.reshape(-1, group_size)
    split = bool((runs != runs[:, :1]).any())
    merged = runs.shape[0] > 1 and bool((runs[1:, 0] == runs[:-1, 0]).any())
    if split or merged:
        raise ValueError(f"PACS: the rows of a micro-batch are not whole groups of {group_size} "
                         f"contiguous responses to one prompt; {fix}")


def encode_tagged_advantages(rewards: torch.Tensor, group_index: torch.Tensor,
                             response_mask: torch.Tensor, *, binary: bool | None = None) -> torch.Tensor:
    """``[B, T]`` advantages carrying ``R_i + 2 * (1 + group_index_i mod M)`` on response tokens
    (0 elsewhere), fp32; M is ``BINARY_GROUP_TAGS`` when every reward is 0 or 1, else ``GROUP_TAGS``
    (``binary``: the caller's decision for a batch encoded in parts, which must hold for these rewards).
    ``rewards`` ``[B]`` in ``[0, 1]``; ``group_index`` ``[B]`` int."""
    R = rewards.detach().to(torch.float64)
    if not bool(torch.isfinite(R).all()) or bool(((R < 0) | (R > 1)).any()):
        raise ValueError("PACS: sequence rewards must lie in [0, 1] (the verifier's label); got "
                         f"min {float(R.min())!r}, max {float(R.max())!r}")
    zero_one = bool(((R == 0) | (R == 1)).all())
    if binary and not zero_one:
        raise ValueError("PACS: binary=True tags, but the rewards are not all 0 or 1")
    binary = zero_one if binary is None else binary
    tag = (1 + group_index.to(torch.int64) % (BINARY_GROUP_TAGS if binary else GROUP_TAGS)).to(torch.float64)
    value = (R + 2.0 * tag).to(torch.float32)
    return value.unsqueeze(-1) * response_mask.to(torch.float32)


def decode_tagged_advantages(advantages: torch.Tensor, response_mask: torch.Tensor, fix: str):
    """Inverse of ``encode_tagged_advantages``: ``(rewards [B] fp64, tags [B] int64, from 1)``.

    Raises ValueError naming the row when a row has no response token, and (ending in ``fix``) when
    the value is not constant over a row's response tokens or not of the encoded form."""
    m = response_mask.bool()
    empty = (~m.any(dim=-1)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"PACS: row {empty[0]} of the micro-batch has no response token in its mask "
                         f"({len(empty)} such rows), so its reward cannot be read; every response needs at least "
                         "one token (its EOS) under the mask")
    a = advantages.detach().to(torch.float64)
    big = torch.finfo(torch.float64).max
    hi = torch.where(m, a, -big).amax(dim=-1)
    lo = torch.where(m, a, big).amin(dim=-1)
    # fp32 storage of values < 32 is exact to 2**-19; allow that much spread. Values from 32 on carry a
    # 0/1 reward and a binary tag: integers. Below 2 (tag 0) is no tag: an ordinary advantage (0 for a group of
    # equal rewards) is refused, not read as reward 0
    top, soft_top = 2 * (BINARY_GROUP_TAGS + 1), 2 * (GROUP_TAGS + 1)
    wide = hi >= soft_top
    if (bool(((hi - lo) > 4e-6).any()) or bool((lo < 2).any()) or bool((hi >= top).any())
            or bool((wide & (hi != torch.floor(hi))).any())):
        raise ValueError("PACS: the advantages are not the reward + group tag written by the "
                         f"PACS advantage step (constant per row, in [2, {top}), integers from {soft_top} on); "
                         f"{fix}")
    tags = torch.floor(hi / 2.0).clamp(max=BINARY_GROUP_TAGS)
    rewards = (hi - 2.0 * tags).clamp(0.0, 1.0)
    low = advantages.is_floating_point() and torch.finfo(advantages.dtype).eps > torch.finfo(torch.float32).eps
    if low and bool(((rewards != 0) & (rewards != 1)).any()):
        # bf16 / fp16 hold R + 2 * tag (< 32) in steps of 1/8 / 1/32 near the top: 0/1 rewards stay exact,
        # a soft reward is rounded (0.3 read back as 0.25)
        i = int(((rewards != 0) & (rewards != 1)).nonzero()[0, 0])
        raise ValueError(f"PACS: the advantages arrive as {advantages.dtype}, which rounds the soft rewards "
                         f"they carry (row {i} reads {float(rewards[i]):.6g}); keep the advantages in float32 "
                         "(0/1 rewards pass in any dtype)")
    return rewards, tags.to(torch.int64)


def pacs_metrics(terms: dict, rewards: torch.Tensor) -> dict[str, float]:
    """psi / sigmoid(psi) statistics and their calibration against R, as ``python -m pacs_fast.train`` records
    them (:func:`pacs_fast.algorithms.score_metrics.score_metrics`); rows whose score is NaN (left out of the
    loss) are left out here too."""
    return score_metrics(terms["score"], terms["pred_reward"], rewards, terms["proxy"])


def rows_kept(valid: torch.Tensor, group_size: int, min_members: int) -> torch.Tensor:
    """The rows of ``valid`` (``[B]`` bool, whole groups of ``group_size`` contiguous rows) that stay in a PACS loss
    computed over the members each group has left: a group with fewer than ``min_members`` valid rows drops out
    (as :func:`pacs_fast.algorithms.overlong.loss_over_members` drops it). A 0-d int64 tensor on ``valid``'s device."""
    counts = valid.view(-1, group_size).sum(dim=1)
    return (counts * (counts >= max(min_members, 1))).sum()

