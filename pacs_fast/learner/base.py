"""The learner interface, the batch it trains on, and how a batch is cut into micro-batches
(the loss every learner shares is :mod:`pacs_fast.learner.objective`).

A learner owns the policy being trained (and, where needed, a reference policy and a value head),
its optimiser, and turns a :class:`RolloutBatch` into gradient steps. The trainer only talks to
:class:`Learner`; ``TorchLearner`` (one process) and the Megatron-core learner implement it.

Token alignment used everywhere: ``input_ids[b, t]`` is token ``t`` of row ``b`` (prompt then
response, right-padded); ``logp[b, t] = log pi(input_ids[b, t] | input_ids[b, :t])`` for the
positions where ``response_mask[b, t] == 1`` and 0 elsewhere (position 0 is never a response
token). Rows ``[kG, (k+1)G)`` are the ``G`` responses to prompt ``k`` (one group).
"""
from __future__ import annotations

import abc
import dataclasses
import math
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch



class NonFiniteError(RuntimeError):
    """A non-finite loss or gradient norm, raised by a learner *before* the optimiser step (the
    weights are still those of the last good step). In a multi-process learner every rank raises it
    together (the decision is collective), so no rank is left waiting in a collective.

    step: the learner's update count (``Learner.update`` calls made before this one) and
    what: which value was non-finite, e.g. ``"loss=nan"`` or ``"grad_norm=inf"``.
    """

    def __init__(self, step: int, what: str):
        self.step = int(step)
        self.what = str(what)
        super().__init__(f"non-finite {self.what} at learner step {self.step} (before the optimiser step; "
                         "weights unchanged): lower learner.lr or check the data")


class CheckpointMismatch(ValueError):
    """A checkpoint that loads but is not this run's to continue (its LoRA adapters were trained on another base):
    the run's settings are wrong, not the checkpoint, so a resume stops at it with this one line instead of
    skipping it, and every older one, as damaged."""


@dataclass
class RolloutBatch:
    """One step's training data. ``B = num_groups * group_size`` rows, ``T`` tokens.

    input_ids: ``[B, T]`` int64, prompt + response, right-padded with the pad id.
    attention_mask: ``[B, T]`` int64, 1 on real tokens.
    response_mask: ``[B, T]`` float32, 1 on response tokens (the positions whose log-probs train).
    rewards: ``[B]`` float32 verifier rewards in [0, 1].
    group_size: G.
    old_logp: ``[B, T]`` fp32 log-probs of the policy before this step's update (learner-computed;
        left ``None`` for a learner with :attr:`Learner.fuses_old_logprobs`, whose ``update`` fills it).
    old_entropy: ``[B, T]`` fp32 entropies of that policy (0 off the response; a metric).
    ref_logp: ``[B, T]`` fp32 log-probs of the reference policy (PACS ``ref``; KL of the baselines).
    old_values, returns: ``[B, T]`` fp32 (PPO only). advantages: ``[B, T]`` fp32 per-token advantages
        (PPO's GAE; process-reward credit for the baselines); None = outcome advantages from ``rewards``.
    behaviour_logp: ``[B, T]`` fp32 log-probs of the sampled tokens under the rollout engine's policy
        (``mu``: the engine's own per-token log-probs, aligned like ``logp``), 0 off the response; the
        input of :func:`pacs_fast.algorithms.off_policy.off_policy_correction` (docs/OFF_POLICY.md).
        None = not collected.
    is_weights: ``[B, T]`` fp32 off-policy correction weights (``pi_old / mu``, truncated; 0 at rejected
        tokens and off the response; constant over a row's tokens at sequence level), set by
        :mod:`pacs_fast.trainer.correction`; None = no correction.
    kept_mask: ``[B, T]`` fp32 the response mask without the rejected tokens: the losses aggregate
        over it (rejected tokens leave the denominators too); None = nothing rejected. PACS's proxy
        still sums the whole ``response_mask`` (its rejection is per sequence: the row's BCE term goes).
    truncated: ``[B]`` bool, rows that leave the loss (``learner.mask_truncated``: responses cut at
        ``rollout.max_new_tokens``); see :func:`loss_mask` and, for PACS, :func:`objective`. None = none.
    verifier_rewards: ``[B]`` the verifier's rewards where reward shaping (``reward.overlong_buffer_len``)
        made ``rewards`` differ from them (metrics only); None = ``rewards`` are the verifier's.
    outcome_advantages: ``[B]`` float each row's outcome advantage in its whole group (GRPO's, RLOO's, Dr. GRPO's,
        verl's loss modes'), set by the learner on a group trained a few rows at a time in one pass
        (:func:`pacs_fast.learner.objective.rows_apart`); None = the objective computes them from ``rewards``.
    layout_checked: set once the rows were checked right-padded (:func:`check_right_padded`, on CPU tensors);
        the batches made from this one inherit it, so the learner's sub-batches are not checked again.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    rewards: torch.Tensor
    group_size: int
    old_logp: torch.Tensor | None = None
    old_entropy: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    behaviour_logp: torch.Tensor | None = None
    is_weights: torch.Tensor | None = None
    kept_mask: torch.Tensor | None = None
    truncated: torch.Tensor | None = None
    verifier_rewards: torch.Tensor | None = None
    outcome_advantages: torch.Tensor | None = None
    layout_checked: bool = dataclasses.field(default=False, kw_only=True, repr=False, compare=False)

    def __post_init__(self):
        B, T = self.input_ids.shape
        if self.group_size < 1 or B % self.group_size:
            raise ValueError(f"RolloutBatch: group_size={self.group_size} must divide the {B} rows")
        for name in ("attention_mask", "response_mask"):
            if tuple(getattr(self, name).shape) != (B, T):
                raise ValueError(f"RolloutBatch: {name} must be [{B}, {T}], got {tuple(getattr(self, name).shape)}")
        if tuple(self.rewards.shape) != (B,):
            raise ValueError(f"RolloutBatch: rewards must be [{B}], got {tuple(self.rewards.shape)}")
        if not self.layout_checked and self.attention_mask.device.type == "cpu":  # (a device copy: no sync here)
            check_right_padded(self.attention_mask, self.response_mask)
            self.layout_checked = True  # (groups(), to() and replace() pass it on: a part of a checked batch is)

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_groups(self) -> int:
        return self.num_rows // self.group_size

    def groups(self, group_ids: torch.Tensor | list[int]) -> "RolloutBatch":
        """The sub-batch made of the given groups (whole groups, in the given order), trimmed to
        its longest row."""
        rows = group_rows(group_ids, self.group_size)
        width = int(self.attention_mask[rows].sum(-1).max()) if len(rows) else 0
        width = max(width, 1)
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                v = v[rows]
                if v.dim() == 2:
                    v = v[:, :width]
            out[f.name] = v
        return RolloutBatch(**out)

    def to(self, device) -> "RolloutBatch":
        return RolloutBatch(**{f.name: (getattr(self, f.name).to(device)
                                        if isinstance(getattr(self, f.name), torch.Tensor)
                                        else getattr(self, f.name)) for f in dataclasses.fields(self)})


def check_right_padded(attention_mask: torch.Tensor, response_mask: torch.Tensor) -> None:
    """ValueError naming the first bad row unless every row's real tokens start at column 0 and are contiguous
    (right padding, trainer/batch.py's layout) and ``response_mask`` is 0 on padding. Both learners cut and forward
    rows as right-padded: a left-padded row (verl's prompt layout) lost its last tokens to :meth:`RolloutBatch.groups`'
    trim and got the torch learner's positions wrong, and a response token on padding trained in one learner and
    not the other, all silently (megatron sweep, 2026-12)."""
    real = attention_mask != 0
    right = torch.arange(real.shape[1]) < real.sum(1, keepdim=True)
    bad = (real != right).any(1) | ((response_mask != 0) & ~right).any(1)
    if bool(bad.any()):
        row = int(bad.nonzero()[0])
        what = "is not right-padded" if not torch.equal(real[row], right[row]) else "has response_mask 1 on padding"
        raise ValueError(f"RolloutBatch: row {row} {what}: each row's real tokens (attention_mask 1) must start at "
                         f"column 0 and be contiguous, padding after them, response_mask only on real tokens "
                         f"(shift left-padded prompts left, as trainer/batch.py's build_batch lays rows out)")


def group_rows(group_ids, group_size: int) -> torch.Tensor:
    """``[len(group_ids) * group_size]`` int64: the row indices of the given groups, in order."""
    g = torch.as_tensor(group_ids, dtype=torch.long)
    return (g[:, None] * group_size + torch.arange(group_size)).reshape(-1)


def check_response_ids(labels: torch.Tensor, vocab_size: int) -> None:
    """ValueError when a response token id (``labels``, any shape, int) is >= ``vocab_size``: a padded
    LM-head row, never part of the distribution the log-probs use (one device-to-host read)."""
    top = int(labels.max()) if labels.numel() else -1
    if top >= vocab_size:
        raise ValueError(f"a response token id {top} is >= vocab_size={vocab_size} (a padded LM-head row): "
                         "the rollout engine must mask padded rows")


class Learner(abc.ABC):
    """What the trainer needs from a learner.

    Life cycle per RL step: ``compute_logprobs`` (old, and reference where used; the old ones are
    skipped when :attr:`fuses_old_logprobs`) -> (``compute_values`` for PPO) -> ``update`` ->
    ``export_hf_weights`` into the rollout engine.
    """

    #: the Hugging Face config of the policy (``save_pretrained``-able)
    hf_config = None
    #: whether ``update`` accepts a batch without ``old_logp`` and fills ``old_logp`` /
    #: ``old_entropy`` (and ``ref_logp`` when the rollout policy is the reference) itself, from the
    #: forward of its first mini-batch (made before any optimiser step) instead of a separate pass
    fuses_old_logprobs: bool = False
    #: whether a fused ``update`` also takes ``correct=``: it then sets the off-policy correction
    #: (``is_weights`` / ``kept_mask``) of each row from those same log-probs (see the torch learner)
    fuses_correction: bool = False
    #: whether the objective needs ``ref_logp`` and whether the learner holds a separate reference model
    needs_ref: bool = False
    has_value_head: bool = False

    @abc.abstractmethod
    def compute_logprobs(self, batch: RolloutBatch, *, reference: bool = False,
                         return_entropy: bool = False):
        """``[B, T]`` fp32 log-probs (0 off the response) of the policy, or of the reference
        policy with ``reference=True``; with ``return_entropy`` also ``[B, T]`` entropies. No grad."""

    @property
    def holds_reference(self) -> bool:
        """Whether the learner keeps its own reference policy (``compute_logprobs(reference=True)``)."""
        return getattr(self, "ref_model", None) is not None

    def _model_for(self, reference: bool):
        """The policy, or the held reference model for ``reference=True`` (a clear error when the
        configuration keeps none). Learners with a ``model`` / ``ref_model`` pair use this."""
        if not reference:
            return self.model
        if getattr(self, "ref_model", None) is None:
            raise ValueError("compute_logprobs(reference=True): this configuration keeps no reference "
                             "model (the rollout policy's log-probs are the reference)")
        return self.ref_model

    def compute_values(self, batch: RolloutBatch) -> torch.Tensor:
        """``[B, T]`` fp32 values of the value head (PPO). No grad."""
        raise NotImplementedError(f"{type(self).__name__} has no value head")

    @abc.abstractmethod
    def update(self, batch: RolloutBatch, *, seed: int) -> dict[str, float]:
        """One optimisation phase over the batch: ``epochs`` x mini-batches of whole groups, each
        one optimiser step accumulated over micro-batches. ``seed`` orders the mini-batches.
        With :attr:`fuses_old_logprobs`, ``batch.old_logp`` may be ``None``: the update then fills
        ``old_logp``, ``old_entropy`` (and ``ref_logp`` when the rollout policy is the reference).
        Returns metrics averaged over the mini-batches (``loss``, ``grad_norm``, ...)."""

    def _fuses_in_update(self, batch: RolloutBatch, correct, why_not: str) -> bool:
        """Whether this ``update`` computes the old log-probs itself (``batch.old_logp`` None), after the
        checks both learners share; ``why_not`` names what stops a learner that cannot (ValueError)."""
        fuse = batch.old_logp is None
        if fuse and not self.fuses_old_logprobs:
            raise ValueError(f"update: batch.old_logp is None, but this learner cannot compute it in the update "
                             f"({why_not}): call compute_logprobs first")
        if correct is not None and not fuse:
            raise ValueError("update: correct= is for the fused old log-probs (batch.old_logp None); with "
                             "batch.old_logp given, set batch.is_weights / kept_mask before the update")
        return fuse

    def set_lr_scale(self, scale: float) -> float:
        """Every optimiser group's learning rate at ``scale`` times its configured one (``learner.lr``; PPO's value
        head: ``learner.critic_lr``), for the next updates (:mod:`pacs_fast.learner.lr_schedule`); returns the
        policy's."""
        bases = self._base_lrs()
        for group, base in zip(self.optimizer.param_groups, bases):
            group["lr"] = base * scale
        return bases[0] * scale

    def _base_lrs(self) -> list[float]:
        """The configured learning rate of each optimiser group, in order."""
        return [self.cfg.lr] * len(self.optimizer.param_groups)

    @abc.abstractmethod
    def reset_reference(self, *, reset_optimizer: bool, mix: float = 1.0) -> None:
        """Copies the policy into the reference (PACS ``ref=fixed``, a baseline's KL reference), or with
        ``mix < 1`` moves it to ``mix * policy + (1 - mix) * reference`` weight by weight
        (:func:`pacs_fast.learner.reference.mix_into`); optionally re-initialises the optimiser state."""

    @abc.abstractmethod
    def state_dict(self) -> dict:
        """Everything needed to resume except the policy weights (which travel in Hugging Face
        format through :meth:`export_hf_weights` / :meth:`load_hf_weights`): optimiser state,
        reference / value-head weights, counters."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Inverse of :meth:`state_dict`."""

    @abc.abstractmethod
    def export_hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's weights as ``(hf_name, tensor)``, full (unsharded) tensors; tied weights
        appear once (as ``save_pretrained`` writes them)."""

    @abc.abstractmethod
    def load_hf_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Loads policy weights given with Hugging Face names."""

    def save_hf(self, path, *, bucket_bytes: int | None = None) -> None:
        """Writes the policy as a Hugging Face folder: ``config.json`` and the weights in the transformers
        layout, a bucket of about ``bucket_bytes`` (default :data:`~pacs_fast.learner.hf_folder.SHARD_BYTES`) of
        whole layers per file (one file: ``model.safetensors``; several: ``model-0000i-of-0000n.safetensors`` +
        ``model.safetensors.index.json``), copied to host memory one bucket at a time. The files are counted
        (their names say how many) from :meth:`hf_weight_layout`, without the tensors (with LoRA: no merge), then
        written from :meth:`export_hf_weights` once; then :attr:`carried` (the input's tensors the model does not
        hold), unchanged, in files of their own. Each file is written atomically, the folder is not: a save into
        a folder that holds a model already and stops part-way leaves a mix of the two (save into a new folder and
        rename it, as the trainer's checkpoints do)."""
        from pathlib import Path

        from pacs_fast.learner import hf_folder

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        bucket_bytes = hf_folder.SHARD_BYTES if bucket_bytes is None else bucket_bytes
        sizes = ((name, math.prod(shape) * dtype.itemsize) for name, shape, dtype in self.hf_weight_layout())
        n = sum(1 for _ in hf_folder.whole_unit_buckets(sizes, bucket_bytes, int))
        carried = self.carried or None  # (the input's tensors the model does not hold: files of their own, after)
        n_carried = sum(1 for _ in hf_folder.whole_unit_buckets(carried.layout(), bucket_bytes, int)) if carried else 0
        weight_map, total = {}, 0
        for i, bucket in enumerate(self.iter_hf_weight_buckets(bucket_bytes)):
            name = hf_folder.shard_name(i, n + n_carried)
            # a copy (a CPU model's tensors too: tensors sharing storage could not be written side by side)
            tensors = self._checkpoint_layout({k: t.detach().to("cpu", copy=True).contiguous() for k, t in bucket})
            total += hf_folder.write_shard(path, name, tensors)
            weight_map.update(dict.fromkeys(tensors, name))
            del tensors
        if carried:  # (as the input holds them, a tensor read at a time from its files)
            sized = lambda t: t.numel() * t.element_size()  # noqa: E731
            for i, bucket in enumerate(hf_folder.whole_unit_buckets(carried.items(), bucket_bytes, sized), n):
                name = hf_folder.shard_name(i, n + n_carried)
                total += hf_folder.write_shard(path, name, dict(bucket))
                weight_map.update(dict.fromkeys(dict(bucket), name))
        hf_folder.finish_weights(path, weight_map, total)
        if self.hf_config is not None:
            hf_folder.save_config(self.hf_config, path, model=getattr(self, "model", None))

    def _checkpoint_layout(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A bucket of :meth:`save_hf` (whole units, :meth:`export_hf_weights`' names) as the folder holds it: as
        it is, unless the model's checkpoints lay its tensors out otherwise than the model holds them (the torch
        learner's mixture of experts: the hub's per-expert tensors, not transformers 5's fused ones)."""
        return tensors

    #: the input folder's tensors the model does not hold (:class:`~pacs_fast.learner.carried_tensors.CarriedTensors`:
    #: multi-token-prediction layers), copied unchanged into every :meth:`save_hf`; None: none
    carried = None

    # -- scale-out defaults (one process); the megatron learner overrides them ------------------------
    #: ``(dp_rank, dp_size)`` of this process's data-parallel group (one process: ``(0, 1)``)
    dp_rank: int = 0
    dp_size: int = 1

    def save_state(self, folder, *, is_writer: bool) -> None:
        """Writes :meth:`state_dict` to ``folder/learner.pt`` (atomically) when ``is_writer``.
        Collective in multi-process learners (each rank writes its own part there)."""
        from pathlib import Path

        from pacs_fast.files import write_atomic

        if not is_writer:
            return
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = self.state_dict()
        write_atomic(folder / "learner.pt", lambda tmp: torch.save(state, tmp))

    def load_state(self, folder) -> None:
        """Inverse of :meth:`save_state`. For a learner off the CPU the file is memory-mapped (its tensors are read
        as they are copied to the device, :func:`maps_state_files`), not read whole into host memory first: AdamW's
        moments of Qwen2.5-7B (7.6B parameters) are 61 GB, 91 GB with a bf16 model's fp32 masters."""
        from pathlib import Path

        mmap = maps_state_files(getattr(self, "device", None))
        self.load_state_dict(torch.load(Path(folder) / "learner.pt", map_location="cpu", mmap=mmap,
                                        weights_only=False))
        if mmap:
            unmap_optimizer_state(getattr(self, "optimizer", None))

    def hf_weight_layout(self) -> Iterator[tuple[str, tuple[int, ...], torch.dtype]]:
        """``(hf_name, shape, dtype)`` of each tensor of :meth:`export_hf_weights`, in its order: what a file layout
        or a manifest needs, without the values. Default: read off :meth:`export_hf_weights`; a learner whose
        export computes its tensors (the torch learner's LoRA merges) gives them without computing any."""
        for name, t in self.export_hf_weights():
            yield name, tuple(t.shape), t.dtype

    def hf_weight_manifest(self) -> list[tuple[str, tuple[int, ...]]]:
        """``[(hf_name, shape)]`` of :meth:`export_hf_weights` (checked before a weight sync), from
        :meth:`hf_weight_layout`."""
        return [(name, shape) for name, shape, _ in self.hf_weight_layout()]

    def iter_hf_weight_buckets(self, bucket_bytes: int, *, dtype: torch.dtype | None = None,
                               ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """:meth:`export_hf_weights` in buckets of about ``bucket_bytes`` (whole layers; each tensor
        cast to ``dtype`` as its bucket is built)."""
        from pacs_fast.learner.hf_folder import whole_unit_buckets

        def cast(items):
            for name, t in items:
                yield name, (t.detach() if dtype is None else t.detach().to(dtype))

        yield from whole_unit_buckets(cast(self.export_hf_weights()), bucket_bytes,
                                      lambda t: t.numel() * t.element_size())


# ----------------------------------------------------------------------------- batching

def maps_state_files(device) -> bool:
    """Whether a learner on ``device`` (a ``torch.device``, or None: unknown) reads its state files memory-mapped:
    off the CPU, where every tensor is copied to the device anyway (from the mapping, page by page, instead of from
    a whole copy in host memory). On the CPU torch keeps a loaded tensor as it is: mapped, then copied out of the
    mapping (:func:`unmap_optimizer_state`), it would be resident twice over, so the file is read whole, once."""
    return device is not None and torch.device(device).type != "cpu"


def unmap_optimizer_state(optimizer) -> None:
    """After ``optimizer.load_state_dict`` from a memory-mapped ``learner.pt`` (:func:`maps_state_files`): each CPU
    tensor of its state becomes a copy of its own. torch keeps a state tensor as loaded where it already has the
    parameter's device, as AdamW's ``step`` (a 0-d CPU tensor) for a parameter on a GPU; left in the file's mapping,
    those scalars held the whole file open for the rest of the run: once the checkpoint was pruned, its deleted
    ``learner.pt`` (61 GB of moments at 7.6B parameters) kept its disk space until the run ended. ``optimizer``: a
    ``torch.optim.Optimizer`` (a ``ZeroRedundancyOptimizer``'s local one too) or None."""
    for opt in (optimizer, getattr(optimizer, "optim", None)):
        for state in (getattr(opt, "state", None) or {}).values():
            if not isinstance(state, dict):
                continue
            for key, value in state.items():
                if torch.is_tensor(value) and value.device.type == "cpu":
                    state[key] = value.clone()


def by_length(group_ids: torch.Tensor, batch: RolloutBatch, *, shares: int = 1,
              lengths: torch.Tensor | None = None) -> torch.Tensor:
    """``group_ids`` sorted (stably) by the length of each group's longest row (or by ``lengths
    [num_groups]``, e.g. what remains of it past a shared prefix): cut into micro-batches in this
    order, groups of similar length share one (less padding; the mini-batch's gradient is the same sum).

    With ``shares = k > 1`` (data-parallel ranks that each take a contiguous ``1/k`` of the
    result), the sorted list is dealt round-robin: share ``r`` is ``sorted[r::k]`` (still sorted),
    so every share holds long and short groups alike. ``len(group_ids)`` must divide by ``k``.
    """
    if lengths is None:
        lengths = batch.attention_mask.sum(-1).view(batch.num_groups, batch.group_size).max(-1).values
    ordered = group_ids[torch.argsort(lengths[group_ids], stable=True)]
    if shares > 1:
        ordered = torch.cat([ordered[r::shares] for r in range(shares)])
    return ordered


def dealt_rows_to_sorted(n_groups: int, shares: int, group_size: int) -> torch.Tensor:
    """Row permutation that turns per-row values in :func:`by_length`'s dealt order (``shares``)
    back into its sorted order: ``sorted_values = dealt_values[perm]``."""
    j = torch.arange(n_groups)
    pos = (j % shares) * (n_groups // shares) + j // shares   # where sorted group j sits when dealt
    return group_rows(pos, group_size)
