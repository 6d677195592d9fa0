"""PACS in OpenRLHF: ``PACSPolicyLoss``, a drop-in for ``openrlhf.models.PolicyLoss``.

Written against the interface of openrlhf 0.11.2 (``SUPPORTED_OPENRLHF``, exact): an installed openrlhf of
another version is refused by ``check_args`` and ``PACSPolicyLoss`` (0.11.0's ``PolicyLoss`` returns 4 values and
its trainer unpacks 4; its correction switch is ``algo.advantage.is_correction_enable``). Three pieces, used in
a PPO actor / experience maker of yours (OpenRLHF has no registry to plug into):

    from pacs_fast.integrations.openrlhf import PACSPolicyLoss, check_args, pacs_advantages
    check_args(args)                                    # at start: group-keeping settings
    actor.actor_loss_fn = PACSPolicyLoss(group_size=args.rollout.n_samples_per_prompt)
    # in place of RemoteExperienceMaker.compute_advantages_and_returns:
    experiences = pacs_advantages(experiences, args.rollout.n_samples_per_prompt)

- ``pacs_advantages`` writes each sample's raw reward ``experience.rewards`` and its group
  (``experience.index // n_samples_per_prompt``, OpenRLHF's own grouping) into ``advantages``
  (``R_i + 2 * (1 + group mod 127)`` on action tokens, mod 15 with soft rewards; see
  ``pacs_fast.integrations._groups``).
- ``PACSPolicyLoss.forward`` has ``PolicyLoss.forward``'s signature and returns its 5-tuple
  ``(loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio)`` (clip_ratio is 0: PACS does not clip;
  vllm_kl and is_filter_ratio are None). It reads the rewards and groups back, checks that the
  micro-batch holds whole groups, and computes ``pacs_fast.pacs_loss`` with ``old_log_probs`` (the
  rollout policy's log-probs) as the reference, PACS ``ref="rollout"``. With ``global_batch_size``
  it scales like OpenRLHF's per-sample mode: ``sum_i loss_i / global_batch_size * dp_size``.
  The last call's PACS metrics are in ``loss_fn.last_metrics``.

Not supported yet: OpenRLHF 0.11.2's ``PPOActor.ppo_train`` shuffles the replay buffer per
sample (``DataLoader(shuffle=True)`` unless ring attention, DeepSpeed TP or dynamic batching is
on), which splits groups; the loss detects it and raises, so a PACS run needs that loader built
with ``shuffle=False`` over group-ordered items (a patch of ``ppo_train`` this module does not
ship). Dynamic batching, packed samples, and OpenRLHF's vLLM importance-sampling correction
(``algo.advantage.is_correction_level``: ``check_args`` refuses it, and the loss refuses ``rollout_log_probs``)
are not supported either, nor OpenRLHF's length penalties (``reward.overlong_buffer_len``,
``reward.stop_properly_penalty_coef``: applied inside the ``compute_advantages_and_returns`` that
``pacs_advantages`` replaces; ``check_args`` refuses them).
"""
from __future__ import annotations

from importlib import metadata

import torch

from pacs_fast.algorithms._checks import check_count
from pacs_fast.algorithms.pacs import BACKENDS, GROUP_SCORES, PROXIES, SCORES, WEIGHT_MODES, pacs_loss
from pacs_fast.integrations._groups import (
    check_beta,
    check_whole_groups,
    decode_tagged_advantages,
    encode_tagged_advantages,
    pacs_metrics,
)

SUPPORTED_OPENRLHF = "0.11.2"

__all__ = ["PACSPolicyLoss", "SUPPORTED_OPENRLHF", "check_args", "pacs_advantages"]

_FIX = ("feed each micro-batch whole groups of n_samples_per_prompt contiguous samples: "
        "train.micro_batch_size a multiple of rollout.n_samples_per_prompt, the replay buffer "
        "not shuffled per sample, advantages from pacs_advantages")


def _get(cfg, dotted: str, default=None):
    cur = cfg
    for part in dotted.split("."):
        cur = getattr(cur, part, None) if not isinstance(cur, dict) else cur.get(part)
        if cur is None:
            return default
    return cur


def _check_openrlhf_version(who: str) -> None:
    """Refuses an installed openrlhf other than ``SUPPORTED_OPENRLHF`` (0.11.0's trainer unpacks 4 values from the
    loss, this one returns 0.11.2's 5). Without openrlhf installed there is nothing to check: the adapter needs
    none of it (its tests run without it)."""
    try:
        found = metadata.version("openrlhf")
    except metadata.PackageNotFoundError:
        return
    if found != SUPPORTED_OPENRLHF:
        raise ValueError(f"{who}: openrlhf {found} is installed, but the adapter supports openrlhf "
                         f"{SUPPORTED_OPENRLHF} only (PolicyLoss's return values and the args' names differ): "
                         f"pip install openrlhf=={SUPPORTED_OPENRLHF}")


def check_args(args) -> None:
    """Start-time check of OpenRLHF 0.11.2's (nested) args: raises one ValueError listing every setting
    that would split groups or change the rewards (an installed openrlhf of another version, a missing count, or one
    that is not an integer, is refused first, alone)."""
    _check_openrlhf_version("PACS in OpenRLHF")
    for key in ("rollout.n_samples_per_prompt", "train.micro_batch_size"):
        if _get(args, key) is None:
            flat = _get(args, key.split(".")[1].replace("micro_batch_size", "micro_train_batch_size"))
            raise ValueError(f"PACS in OpenRLHF: the args hold no {key} (check_args reads OpenRLHF "
                             f"{SUPPORTED_OPENRLHF}'s nested args" + (", these look like an older release's flat "
                                                                     "ones" if flat is not None else "") + ")")
    n = check_count("PACS in OpenRLHF", "rollout.n_samples_per_prompt", _get(args, "rollout.n_samples_per_prompt", 1))
    problems = []
    if n < 2:
        problems.append(f"rollout.n_samples_per_prompt must be >= 2 (got {n})")
    micro = check_count("PACS in OpenRLHF", "train.micro_batch_size", _get(args, "train.micro_batch_size", 1))
    if micro % n:
        problems.append(f"train.micro_batch_size ({micro}) must be a multiple of "
                        f"rollout.n_samples_per_prompt ({n})")
    if _get(args, "train.dynamic_batch_enable", False):
        problems.append("train.dynamic_batch_enable must be False")
    if _get(args, "ds.packing_samples", False):
        problems.append("ds.packing_samples must be False")
    if _get(args, "algo.advantage.is_correction_enable") is not None:
        problems.append(f"algo.advantage.is_correction_enable is OpenRLHF 0.11.0's switch (these args are 0.11.0's; "
                        f"the adapter supports {SUPPORTED_OPENRLHF}, whose switch is "
                        f"algo.advantage.is_correction_level)")
    level = _get(args, "algo.advantage.is_correction_level", "off")
    if str(level).lower() not in ("off", "none", ""):
        problems.append(f"algo.advantage.is_correction_level must be off (got {level!r}: the PACS loss does not "
                        f"apply vLLM's importance-sampling correction)")
    if float(_get(args, "algo.kl.init_coef", 0.0)) > 0:  # (its advice "or algo.kl.use_loss" put a KL term into the
        where = "the actor's loss" if _get(args, "algo.kl.use_loss", False) else "the reward"  # loss PACS has none of)
        problems.append(f"algo.kl.init_coef must be 0: > 0 puts a KL term into {where}, which PACS does not have "
                        f"(its reference is the rollout policy)")
    for key in ("reward.overlong_buffer_len", "reward.stop_properly_penalty_coef"):  # (default None: off)
        if _get(args, key) is not None:
            problems.append(f"{key} must be unset (got {_get(args, key)!r}: OpenRLHF applies this length penalty in "
                            f"compute_advantages_and_returns, which pacs_advantages replaces; PACS trains on the raw "
                            f"rewards, so it would be dropped without a word)")
    if problems:
        raise ValueError("PACS in OpenRLHF: " + "; ".join(problems))


@torch.no_grad()
def pacs_advantages(experiences, n_samples_per_prompt: int):
    """Replaces ``RemoteExperienceMaker.compute_advantages_and_returns``: sets
    ``advantages`` and ``returns`` of each experience to the reward + group tag read by
    ``PACSPolicyLoss`` (``[B, A]`` fp32). Rewards must lie in [0, 1]. Returns ``experiences``."""
    n = check_count("pacs_advantages", "n_samples_per_prompt", n_samples_per_prompt)
    # one tag range for the whole batch (mod 127 only when every reward is 0/1), so that no two experiences
    # encode their groups modulo different numbers
    binary = all(bool(((r == 0) | (r == 1)).all()) for r in (torch.as_tensor(e.rewards) for e in experiences))
    for exp in experiences:
        if exp.index is None:
            raise ValueError("pacs_advantages: experience.index is None (needs OpenRLHF's sample positions)")
        if exp.action_mask is None:
            raise ValueError("pacs_advantages: experience.action_mask is None (packed samples, ds.packing_samples, "
                             "are not supported)")
        rewards = torch.as_tensor(exp.rewards).reshape(-1)
        group = torch.as_tensor(list(exp.index), device=rewards.device) // n
        exp.advantages = encode_tagged_advantages(rewards, group, exp.action_mask, binary=binary)
        exp.returns = exp.advantages.clone()
    return experiences


class PACSPolicyLoss(torch.nn.Module):
    """PACS with OpenRLHF's ``PolicyLoss`` call interface (see the module docstring).

    Args:
        group_size: ``rollout.n_samples_per_prompt``.
        beta, score, weight_mode, proxy, backend: as in ``pacs_fast.pacs_loss``.
    """

    def __init__(self, group_size: int, beta: float = 1.0, score: str = "rloo",
                 weight_mode: str = "question", proxy: str = "logratio", backend: str = "torch") -> None:
        super().__init__()
        _check_openrlhf_version("PACSPolicyLoss")
        for name, value, allowed in (("score", score, SCORES), ("weight_mode", weight_mode, WEIGHT_MODES),
                                     ("proxy", proxy, PROXIES), ("backend", backend, BACKENDS)):
            if value not in allowed:
                raise ValueError(f"PACSPolicyLoss: {name} must be one of {allowed}, got {value!r}")
        if backend == "triton":  # refused here, not at the first update
            from pacs_fast.ops.backend import require_triton

            try:
                require_triton(torch.empty(0, device="cuda" if torch.cuda.is_available() else "cpu"))
            except ValueError as e:
                raise ValueError(f"PACSPolicyLoss: backend='triton' cannot run here: {e}; backend='auto' takes the "
                                 f"fused kernel on CUDA and torch elsewhere") from None
        group_size = check_count("PACSPolicyLoss", "group_size", group_size)
        if group_size == 1 and score in GROUP_SCORES:  # at construction, not at the first update
            raise ValueError(f"PACSPolicyLoss: group_size=1 (n_samples_per_prompt) is not allowed with "
                             f"score={score!r}, which compares a response with its group mates (needs >= 2)")
        self.group_size = group_size
        self.options = dict(beta=check_beta(beta, "PACSPolicyLoss"), score=score, weight_mode=weight_mode,
                            proxy=proxy, backend=backend)
        self.last_metrics: dict[str, float] = {}

    def forward(self, log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                action_mask: torch.Tensor | None = None, rollout_log_probs: torch.Tensor | None = None,
                dp_size: int = 1, batch_num_tokens: float | None = None,
                global_batch_size: float | None = None):
        """``[B, A]`` tensors of one micro-batch (whole groups) ->
        ``(loss, clip_ratio, ppo_kl, vllm_kl=None, is_filter_ratio=None)``."""
        if rollout_log_probs is not None:  # OpenRLHF 0.11.2 fills them only with its correction on
            raise ValueError("PACSPolicyLoss got rollout_log_probs: OpenRLHF's importance-sampling correction is on "
                             "(algo.advantage.is_correction_level), and the PACS loss does not apply it; set "
                             "--algo.advantage.is_correction_level off")
        if action_mask is None:  # the tags sit on action tokens only: the mask says which those are
            raise ValueError("PACSPolicyLoss needs action_mask (the experience's action mask): pacs_advantages writes "
                             "each sample's reward and group on its action tokens only")
        mask = action_mask
        rewards, tags = decode_tagged_advantages(advantages, mask, _FIX)
        check_whole_groups(tags, self.group_size, _FIX)
        loss, terms = pacs_loss(log_probs, old_log_probs, mask, rewards.to(log_probs.device),
                                group_size=self.group_size, return_terms=True, **self.options)
        self.last_metrics = {**pacs_metrics(terms, rewards), "pacs/loss": float(loss.detach())}  # the micro-batch's
        if global_batch_size is not None:
            loss = loss * (log_probs.shape[0] / float(global_batch_size) * float(dp_size))
        m = mask.to(log_probs.dtype)
        ppo_kl = ((old_log_probs - log_probs.detach()) * m).sum() / m.sum().clamp(min=1)
        clip_ratio = torch.zeros((), dtype=loss.dtype, device=loss.device)
        return loss, clip_ratio, ppo_kl, None, None
