"""The megatron-core tensor-parallel learner (``learner.backend=megatron``).

Launch (every process runs the trainer)::

    torchrun --nproc_per_node 2 -m pacs_fast.train learner.backend=megatron learner.tp_size=2

Two batch modes. Full batches (default): every rank passes the same whole batch and each
data-parallel rank trains on its share. DP-local batches (``local_batches=True``, the scale-out
path where every data-parallel group generates its own rollouts): each data-parallel group passes
only its own groups (the ranks of one tensor-parallel group pass identical batches);
``compute_logprobs`` returns those rows; ``update`` cuts them into mini-batches of
``mini_batch_prompts / dp`` local groups (the same number of optimiser steps on every rank);
gradients and metrics are SUM-reduced over data-parallel ranks, so every rank returns the same
metrics and the step equals the full-batch step on the union of the local batches.

Parallel layout: ``world = tp_size x dp``. Tensor parallelism shards attention heads, MLP columns
and the vocabulary; the LM head's vocab shard goes straight into the vocab-parallel
:func:`pacs_fast.ops.linear_logprobs` (no gather of the logits). Data parallelism gives each of the
``dp`` replicas an equal share of the *whole groups* of every mini-batch; micro-batch losses are
scaled by the full mini-batch's counts (:func:`pacs_fast.learner.objective.objective`), so the
data-parallel gradient is a SUM all-reduce and the step equals the single-process step.

Optimiser: ``torch.optim.AdamW`` on each rank's local shards (AdamW is element-wise, so sharding
does not change the update) with a tensor-parallel aware global gradient norm for clipping
(sharded parameters counted once per shard, replicated ones once). With
``learner.distributed_optimizer=true`` its state is also sharded over the data-parallel ranks
(ZeRO-1, :mod:`~pacs_fast.learner.megatron.optimizer`): the same updates, ~1/dp of the memory.

Micro-batches: ``learner.micro_batch_prompts`` groups each, or whole groups of about equal token
counts with ``learner.max_tokens_per_micro_batch`` (per data-parallel rank); rows are packed end to
end without padding per ``learner.packing``, as THD through a varlen attention or with the dense
block-diagonal mask per ``learner.packed_attention`` (:mod:`~pacs_fast.learner.megatron.forward`).
The old log-probs and the off-policy correction come from the update's own first forward
(:attr:`fuses_old_logprobs`, :attr:`fuses_correction`, :mod:`~pacs_fast.learner.fused_old_logprobs`).

Checkpoints. :meth:`save_state` / :meth:`load_state` (the trainer's path): each rank of data-parallel
group 0 writes its own optimiser / reference shard, nothing is gathered; exact resume under the same
``tp_size`` (see :mod:`.state`). :meth:`save_hf`: the policy gathered to global rank 0 one bucket of
layers at a time (:mod:`.export`). :meth:`state_dict` (kept for conversions) gathers the optimiser
moments and the reference model to full HF-named tensors on every rank, so it resumes under any
tensor-parallel size but costs a full model copy per rank.

Non-finite loss or gradient norm: :class:`~pacs_fast.learner.base.NonFiniteError` on every rank
before the optimiser step (decided with one all-reduce).

PPO's value head (:mod:`.value_head`): ``Linear(H, 1)`` replicated on the tensor-parallel ranks, its own AdamW
group at ``learner.critic_lr``. Sequence parallelism (``learner.sequence_parallel``, at ``tp_size > 1``;
:mod:`.sequence_parallel`): the activations between the tensor-parallel regions split over the ranks.

Not supported (ValueError or documented gap): a checkpoint whose config asks for dropout
(:func:`~pacs_fast.learner.megatron.model.check_no_dropout`: built without it), pipeline and context parallelism,
Transformer Engine layer specs (megatron's local spec, with the varlen core attention of :mod:`.core_attention`
and torch norms, runs on the GPU too).

A bf16 model trains through fp32 master weights (``learner.master_weights``, the default;
pacs_fast/learner/master_weights.py): gradients accumulate and are summed over the data-parallel ranks in fp32,
clipped and stepped there, and the model holds the masters rounded; checkpoints keep the masters (:mod:`.state`).
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from pacs_fast.config.remote_code import trusted
from pacs_fast.learner.base import (Learner, RolloutBatch, by_length, check_response_ids, dealt_rows_to_sorted,
                                   group_rows)
from pacs_fast.learner.fused_layers import apply_fused_layers
from pacs_fast.learner.grad_norm import scale_to_norm
from pacs_fast.learner.fused_old_logprobs import FusedOldLogprobs
from pacs_fast.learner.hf_folder import LazyHFCheckpoint
from pacs_fast.learner.long_groups import forward_pieces, row_parts, row_view, train_micro_batch, whole_and_split
from pacs_fast.learner.master_weights import MasterWeights
from pacs_fast.learner.megatron.checkpointing import MegatronCheckpointing
from pacs_fast.learner.megatron.convert import load_hf_into_model
from pacs_fast.learner.megatron.data_parallel import (all_reduce_sum, check_same_batch, dp_share, filled_grads, gather_dp,
                                                     local_mini_batch_groups, sum_counts)
from pacs_fast.learner.megatron.forward import token_logprobs
from pacs_fast.learner.megatron.model import build_gpt_model, check_no_dropout, recompute_overrides
from pacs_fast.learner.megatron.optimizer import make_optimizer
from pacs_fast.learner.megatron.sequence_parallel import norm_params, reduce_norm_grads
from pacs_fast.learner.megatron.setup import init_parallel, raise_if_non_finite, release_parallel, tp_grad_norm
from pacs_fast.learner.megatron.value_head import make_value_head
from pacs_fast.learner.objective import (holds_reference_model, minibatch_counts, needs_entropy, needs_reference,
                                         objective)
from pacs_fast.learner.packing import forward_metrics, group_costs, micro_batch_groups
from pacs_fast.learner.reference import mix_into


# ----------------------------------------------------------------------------- the learner
class MegatronLearner(MegatronCheckpointing, Learner):
    """:class:`~pacs_fast.learner.base.Learner` on a megatron-core ``GPTModel`` (TP x DP).

    Same optimisation semantics as :class:`pacs_fast.learner.torch_learner.TorchLearner`
    (mini-batches of whole groups in ``randperm(seed)`` order, micro-batch accumulation,
    AdamW, global-norm clipping; a non-finite loss or gradient norm raises ``NonFiniteError``).

    Args:
        model_path: Hugging Face folder of the initial policy (Qwen2 / Qwen3 / Llama architecture).
        algo, learner: the ``algo`` and ``learner`` sections of the run config (``learner.tp_size``;
            ``learner.sequence_parallel``, at ``tp_size`` > 1: :mod:`~pacs_fast.learner.megatron.sequence_parallel`).
        temperature: the rollout temperature (log-probs are those of the sampling distribution).
        horizon: the maximum response length (Dr. GRPO's constant divisor).
        dtype: ``"float32"`` | ``"bfloat16"`` parameters (CPU: float32).
        device: ``"auto"`` | ``"cpu"`` | ``"cuda"``.
        gradient_checkpointing: megatron's activation recomputation, ``recompute_granularity`` ``"full"`` (each
            layer) or ``"selective"`` (each layer's MLP: :func:`pacs_fast.learner.megatron.model.recompute_overrides`).
        (``learner.fused_layers``: the MLPs' SwiGLU through Liger-Kernel, :mod:`pacs_fast.learner.fused_layers`;
        :attr:`fused_layers` is the line that says what was fused.)
        local_batches: DP-local batches (see the module docstring); default: full batches.
        vocab_size: the number of real token ids (``len(tokenizer)``): LM-head rows from there on
            (checkpoint padding, as in every Qwen model) are excluded from the softmax, as the rollout
            engines mask them. ``None``: ``hf_config.vocab_size`` (every row).
        lm_head_fp32: the LM head in fp32 (``model.lm_head_fp32``; see
            :func:`pacs_fast.learner.megatron.forward.token_logprobs`).

    Every process of the launch must construct it and call every method (they are collective).
    Full batches: every rank passes the same arguments and gets the same values. DP-local batches:
    the ranks of a TP group pass the same batch; ``compute_logprobs`` / ``last_terms`` are the
    local rows; ``update``'s metrics are the same on every rank, but for ``forward/*`` (this rank's forwards).
    """

    def __init__(self, model_path, *, algo, learner, temperature: float = 1.0, horizon: int = 1,
                 dtype: str = "float32", device: str = "auto", gradient_checkpointing: bool = False,
                 recompute_granularity: str = "full", local_batches: bool = False, vocab_size: int | None = None,
                 lm_head_fp32: bool = False):
        from megatron.core import parallel_state as ps
        from transformers import AutoConfig


        self.algo = algo
        self.cfg = learner
        self.temperature = float(temperature)
        self.horizon = int(horizon)
        self.lm_head_fp32 = bool(lm_head_fp32)
        if learner.mini_batch_prompts % learner.micro_batch_prompts and not learner.max_tokens_per_micro_batch:
            raise ValueError(f"learner.micro_batch_prompts={learner.micro_batch_prompts} must divide "
                             f"learner.mini_batch_prompts={learner.mini_batch_prompts}")
        params_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(dtype)
        if params_dtype is None:
            raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
        self.hf_config = AutoConfig.from_pretrained(model_path, trust_remote_code=trusted())
        check_no_dropout(self.hf_config)  # (before the process groups: the model is built without dropout)
        self.device = init_parallel(learner.tp_size, device=device)
        self.tp_size = learner.tp_size
        self.tp_rank = ps.get_tensor_model_parallel_rank()
        self.tp_group = ps.get_tensor_model_parallel_group() if learner.tp_size > 1 else None
        self.dp_group = ps.get_data_parallel_group()
        self.dp_size = ps.get_data_parallel_world_size()
        self.dp_rank = ps.get_data_parallel_rank()
        self.local_batches = bool(local_batches)
        if self.local_batches and learner.mini_batch_prompts % self.dp_size:
            raise ValueError(f"learner.mini_batch_prompts={learner.mini_batch_prompts} must be a multiple of the "
                             f"{self.dp_size} data-parallel groups (each takes mini_batch_prompts / dp of its own)")
        self.model_path = Path(model_path)

        rows = self.hf_config.vocab_size
        if vocab_size is not None and not 1 <= int(vocab_size) <= rows:
            raise ValueError(f"vocab_size must be in [1, {rows}] (the LM head's rows), got {vocab_size}")
        self.vocab_size = rows if vocab_size is None else int(vocab_size)
        # learner.sequence_parallel: the activations between the TP regions split along the sequence (tp > 1)
        self.sequence_parallel = bool(getattr(learner, "sequence_parallel", True)) and self.tp_size > 1
        sp = {"sequence_parallel": True} if self.sequence_parallel else {}
        overrides = {**recompute_overrides(gradient_checkpointing, recompute_granularity), **sp}
        hf_state = LazyHFCheckpoint(model_path)
        self.model = self._build(params_dtype, overrides)
        load_hf_into_model(self.model, hf_state, self.hf_config, tp_size=self.tp_size, tp_rank=self.tp_rank)
        fused = getattr(learner, "fused_layers", "off")  # the MLPs' SwiGLU through Liger (learner.fused_layers)
        self.fused_layers = apply_fused_layers(self.model, fused, self.device)
        self.needs_ref = needs_reference(algo)
        self.ref_model = None
        if holds_reference_model(algo):
            self.ref_model = self._build(params_dtype, sp)
            load_hf_into_model(self.ref_model, hf_state, self.hf_config, tp_size=self.tp_size,
                               tp_rank=self.tp_rank)
            self.ref_model.requires_grad_(False).eval()
            apply_fused_layers(self.ref_model, fused, self.device)
        del hf_state
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        # what the optimiser steps: the fp32 masters of a bf16 model's parameters (learner.master_weights), else
        # the parameters themselves; gradients land there (a hook moves each bf16 gradient into fp32)
        self.master = None
        if getattr(learner, "master_weights", True):
            master = MasterWeights(self.params)
            self.master = master if master.active else None
        self.opt_params = self.master.masters if self.master is not None else self.params
        # PPO's value head (replicated on every rank, fp32, learner.critic_lr): value_head.py
        self.has_value_head = algo.name == "ppo"
        self.value_head = (make_value_head(self.hf_config.hidden_size, self.device, params_dtype)
                           if self.has_value_head else None)
        self.value_params = list(self.value_head.parameters()) if self.has_value_head else []
        # the norm weights (or their masters) whose gradient each TP rank holds a part of: sequence parallelism's (its
        # tokens), Qwen3's query / key norms (its heads); summed over the TP ranks before the DP reduction
        partial = {id(p) for p in norm_params(self.model)}
        self.norm_params = [o for p, o in zip(self.params, self.opt_params) if id(p) in partial]
        # no dropout: the update's first forward gives the old log-probs and the correction (fused_old_logprobs.py)
        c = self.model.config
        self.fuses_old_logprobs = self.fuses_correction = (c.hidden_dropout == 0 and c.attention_dropout == 0
                                                           and not self.has_value_head)  # (PPO: as the torch learner)
        self.optimizer = self._make_optimizer()
        self.steps = 0
        self.last_terms: dict[str, torch.Tensor] = {}
        # forwards of each kind and token slots since the last update() (learner/forward/*)
        self.forwards: Counter = Counter()

    def _build(self, dtype, overrides):
        return build_gpt_model(self.hf_config, tp_size=self.tp_size, params_dtype=dtype,
                               **overrides).to(self.device)

    def _make_optimizer(self):
        groups = [{"params": list(self.opt_params), "lr": self.cfg.lr}]
        if self.value_params:  # (PPO's value head at learner.critic_lr)
            groups.append({"params": self.value_params, "lr": self.cfg.critic_lr})
        return make_optimizer(groups, self.cfg, dp_group=self.dp_group, dp_size=self.dp_size)

    def _base_lrs(self) -> list[float]:
        return [self.cfg.lr] + [self.cfg.critic_lr] * bool(self.value_params)

    # ------------------------------------------------------------------ forward
    def _logprobs(self, model, batch: RolloutBatch, return_entropy: bool, values: bool = False):
        """Differentiable ``(logp [b, T], entropy or None, values or None)`` on the response positions (values:
        PPO's value head's)."""
        batch = batch.to(self.device)
        if self.vocab_size < self.hf_config.vocab_size:
            check_response_ids(batch.input_ids[batch.response_mask > 0], self.vocab_size)
        out = token_logprobs(model, batch.input_ids, batch.attention_mask,
                             label_mask=batch.response_mask > 0, vocab_size=self.vocab_size,
                             tp_group=self.tp_group, temperature=self.temperature,
                             return_entropy=return_entropy, backend=self.cfg.logprob_backend,
                             packing=self.cfg.packing, lm_head_fp32=self.lm_head_fp32,
                             packed_attention=getattr(self.cfg, "packed_attention", "auto"), forwards=self.forwards,
                             budget=self.cfg.max_tokens_per_micro_batch,
                             value_head=self.value_head if values else None)
        if values:
            return out
        return (*out, None) if return_entropy else (out, None, None)

    def _micro_batches(self, batch: RolloutBatch) -> list[tuple[list[int], bool]]:
        """Group positions of ``batch`` per micro-batch with whether they train whole
        (:func:`~pacs_fast.learner.packing.micro_batch_groups`; a token budget counts real tokens for THD rows, padded
        slots for padded rows and for the dense mask's bins, as long as the longest row), the groups over the budget
        as one item trained a few rows at a time (``learner.split_groups``, :mod:`~pacs_fast.learner.long_groups`)."""
        flags, budget = cut_flags(self.cfg), self.cfg.max_tokens_per_micro_batch
        costs = group_costs(batch, **flags) if budget else []
        return whole_and_split(batch, budget, costs,
                               lambda b: micro_batch_groups(b, self.cfg.micro_batch_prompts, budget, **flags),
                               split=self.cfg.split_groups)

    def _row_parts(self, sub: RolloutBatch) -> list[list[int]]:
        return row_parts(sub, self.cfg.max_tokens_per_micro_batch, cut_flags(self.cfg))

    def _check_budget(self, batch: RolloutBatch) -> None:
        """ValueError on every rank when a row (a group: ``learner.split_groups=off``) is over the token budget (one
        rank raising on its share left the others in a collective for ever; DP-local batches: one MAX all-reduce)."""
        budget, whole = self.cfg.max_tokens_per_micro_batch, self.cfg.split_groups != "auto"
        worst = max(group_costs(batch if whole else row_view(batch), **cut_flags(self.cfg)), default=0) if budget else 0
        if budget and self.local_batches and self.dp_size > 1:
            worst = torch.tensor(float(worst), device=self.device)
            torch.distributed.all_reduce(worst, op=torch.distributed.ReduceOp.MAX, group=self.dp_group)
        if budget and int(worst) > budget:
            raise ValueError(f"a {'group' if whole else 'sequence'} of {int(worst)} token slots is larger than "
                             f"learner.max_tokens_per_micro_batch={budget}: raise the budget")

    def _check_same_batch(self, batch: RolloutBatch) -> None:
        """Full batches: every rank must pass the same batch; DP-local: the ranks of a TP group."""
        if not (self.local_batches and self.tp_size == 1):  # (DP-local at TP 1: no rank shares its rows)
            check_same_batch(batch, self.tp_group if self.local_batches else None, local_batches=self.local_batches,
                             device=self.device)

    def _gather_dp(self, local: torch.Tensor) -> torch.Tensor:
        return gather_dp(local, self.dp_group, self.dp_size)

    @torch.no_grad()
    def compute_logprobs(self, batch: RolloutBatch, *, reference: bool = False, return_entropy: bool = False):
        """``[B, T]`` log-probs of ``batch``'s rows (DP-local batches: this group's rows)."""
        logp, ent, _ = self._rows(self._model_for(reference), batch, return_entropy, False)
        return (logp, ent) if return_entropy else logp

    @torch.no_grad()
    def compute_values(self, batch: RolloutBatch) -> torch.Tensor:
        """``[B, T]`` values of PPO's value head on ``batch``'s rows (DP-local batches: this group's rows)."""
        if self.value_head is None:
            raise ValueError("compute_values: algo.name is not 'ppo' (no value head)")
        return self._rows(self.model, batch, False, True)[2]

    def _rows(self, model, batch: RolloutBatch, entropy: bool, values: bool):
        """``(logp, entropy or None, values or None)`` ``[B, T]`` of ``batch``'s rows in no-grad forwards (each
        data-parallel rank its share, gathered; DP-local batches: this group's rows)."""
        self._check_same_batch(batch)
        self._check_budget(batch)
        was = model.training
        model.eval()
        B, T = batch.input_ids.shape
        if self.local_batches:
            padded, mine = batch, list(range(batch.num_groups))
        else:  # groups padded (by repeating the last) to split evenly over data-parallel ranks
            n = batch.num_groups + (-batch.num_groups) % self.dp_size
            padded = batch.groups([min(g, batch.num_groups - 1) for g in range(n)])
            mine = dp_share(n, self.dp_size, self.dp_rank)
        pad = lambda x: torch.nn.functional.pad(x, (0, T - x.shape[1]))  # noqa: E731
        outs: list[list[torch.Tensor]] = [[], [], []]  # logp, entropy, values
        mine_batch = padded.groups(mine)
        pieces = list(forward_pieces(mine_batch, self._micro_batches(mine_batch), self._row_parts))
        try:
            for mcb, _ in pieces:
                for kept, t in zip(outs, self._logprobs(model, mcb, entropy, values=values)):
                    if t is not None:
                        kept.append(pad(t.float()))
        finally:
            model.train(was)
        gather = (lambda x: x) if self.local_batches else self._gather_dp
        # back to this rank's row order (token-budget micro-batches may reorder the groups, and cut long ones by rows)
        back = torch.cat([r for _, r in pieces]).argsort() if pieces else torch.zeros(0, dtype=torch.long)
        empty = torch.zeros(0, T)
        wanted = (True, entropy, values)
        return tuple(gather(torch.cat(kept)[back] if kept else empty)[:B].cpu() if want else None
                     for kept, want in zip(outs, wanted))

    # ------------------------------------------------------------------ training
    def update(self, batch: RolloutBatch, *, seed: int, correct=None) -> dict[str, float]:
        """See :meth:`Learner.update`. With ``batch.old_logp`` None the old log-probs (and
        ``correct(rows, proximal_logp)``'s off-policy weights) come from the first mini-batch's own forwards and one
        no-grad pass over the other groups (:mod:`~pacs_fast.learner.fused_old_logprobs`), as the torch learner's."""
        self._check_same_batch(batch)
        self._check_budget(batch)
        fuse = self._fuses_in_update(batch, correct, "dropout is active")
        self.model.train()
        gen = torch.Generator().manual_seed(int(seed))
        P = batch.num_groups
        mini = (local_mini_batch_groups(P, self.cfg.mini_batch_prompts, self.dp_group, self.dp_size, self.device)
                if self.local_batches else min(self.cfg.mini_batch_prompts, P))
        sums: dict[str, float] = {}
        terms: dict[str, list] = {}
        steps = 0
        for epoch in range(self.cfg.epochs):
            order = torch.randperm(P, generator=gen)
            for start in range(0, P, mini):
                fused = (FusedOldLogprobs(self, batch, order[:mini], correct)  # still the rollout policy
                         if fuse and epoch == 0 and start == 0 else None)
                # last_terms: rows in the (local) mini-batch's length-sorted order, as the torch learner
                rows = group_rows(by_length(order[start:start + mini], batch), batch.group_size)
                if self.local_batches:  # this group's share of the mini-batch, sorted by length
                    step_metrics = self._mini_batch(batch.groups(by_length(order[start:start + mini], batch)),
                                                    terms, rows, fused)
                else:  # sorted by length, dealt over the DP ranks (balanced shares, little padding)
                    dealt = by_length(order[start:start + mini], batch, shares=self.dp_size)
                    step_metrics = self._mini_batch(batch.groups(dealt), terms, rows, fused)
                for k, v in step_metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
                steps += 1
        self.steps += 1
        out = {k: v / steps for k, v in sums.items()}
        out["optimizer_steps"] = float(steps)
        out.update(forward_metrics(self.forwards))  # which forward ran (learner.packing), as the torch learner's
        self.forwards.clear()
        self.last_terms = {k: torch.cat(v) for k, v in terms.items()}
        return out

    def _mini_batch(self, mb: RolloutBatch, terms: dict[str, list], rows: torch.Tensor, fused=None) -> dict[str, float]:
        """One optimiser step on mini-batch ``mb`` (full batches: the whole mini-batch, of which this
        DP rank takes its share; DP-local: this group's part of it), in micro-batches; gradients
        summed over DP ranks; TP-aware clipping; AdamW. ``fused``: the first mini-batch's
        :class:`~.fused.FusedOldLogprobs` (its old log-probs from these forwards)."""
        counts = minibatch_counts(mb)  # the loss is scaled by the whole mini-batch's counts
        if self.local_batches:
            mine, counts = mb, sum_counts(counts, self.dp_group, self.dp_size, self.device)
        else:
            mine = mb.groups(dp_share(mb.num_groups, self.dp_size, self.dp_rank))
        items = self._micro_batches(mine)
        ran = []  # mine's rows in the order the micro-batches ran them (take's values, the per-row terms)
        need_ent = needs_entropy(self.algo)
        self.optimizer.zero_grad(set_to_none=True)
        scalars: dict[str, torch.Tensor] = {"loss": torch.zeros((), device=self.device)}
        if self.cfg.max_tokens_per_micro_batch and self.cfg.split_groups == "auto":  # (every rank: one all-reduce)
            scalars["split_groups"] = torch.zeros((), device=self.device)
        local_terms: dict[str, list] = {}

        def forward(m, entropy=None):  # (long_groups.Forward)
            want = need_ent or fused is not None if entropy is None else entropy
            return self._logprobs(self.model, m, want, values=self.value_head is not None)

        def loss_fn(m, lp, en, v):
            return objective(self.algo, m, lp, en if need_ent else None, v, counts, horizon=self.horizon)
        for part, whole in items:
            mcb = mine.groups(part).to(self.device)
            # (groups over the token budget: a few rows at a time, exactly; row_order: mcb's rows as they ran)
            loss, met, row_order = train_micro_batch(self.algo, mcb, whole, forward, loss_fn, self._row_parts,
                                                     on_first_forward=None if fused is None else fused.take)
            if not whole:
                scalars["split_groups"] += len(part)
            ran.append(group_rows(part, mine.group_size)[row_order])
            scalars["loss"] += loss.detach().float()
            for k, v in met.items():
                if v.dim() == 0:
                    scalars[k] = scalars.get(k, 0.0) + v.detach().float()
                else:
                    local_terms.setdefault(k, []).append(v.detach().float())
            if "psi" in met:
                local_terms.setdefault("rewards", []).append(mcb.rewards[row_order].detach().float())
        share_back = torch.cat(ran).argsort()
        names = sorted(scalars)
        stats = torch.stack([torch.as_tensor(scalars[k], device=self.device, dtype=torch.float32)
                             for k in names])
        grads = filled_grads(self.opt_params + self.value_params)
        reduce_norm_grads([p.grad for p in self.norm_params], self.tp_group)  # (sequence-parallel, q / k norms)
        all_reduce_sum(grads + [stats], self.dp_group, self.dp_size)

        def to_sorted(x):  # this rank's rows in micro-batch order -> the whole mini-batch's, in its sorted order
            x = x[share_back]
            if self.local_batches:
                return x.cpu()
            return self._gather_dp(x).cpu()[dealt_rows_to_sorted(mb.num_groups, self.dp_size, mb.group_size)]
        for k, v in local_terms.items():
            terms.setdefault(k, []).append(to_sorted(torch.cat(v)))
        if fused is not None:
            fused.finish(to_sorted, rows)
        if local_terms:
            terms.setdefault("rows", []).append(rows)
        grad_norm = tp_grad_norm(self.opt_params + self.value_params, self.tp_group)
        out = {k: float(v) for k, v in zip(names, stats)}
        out["grad_norm"] = float(grad_norm)
        raise_if_non_finite(self.steps, out["loss"], out["grad_norm"], self.optimizer, self.device)
        if self.cfg.grad_clip > 0:  # as torch.nn.utils.clip_grad_norm_
            scale_to_norm([p.grad for p in self.opt_params + self.value_params], self.cfg.grad_clip, grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.master is not None:
            self.master.copy_to_model()
        return out

    # ------------------------------------------------------------------ reference
    @torch.no_grad()
    def reset_reference(self, *, reset_optimizer: bool, mix: float = 1.0) -> None:
        if self.ref_model is None:
            raise ValueError("reset_reference: this configuration keeps no reference model")
        mix_into(self.ref_model.named_parameters(), self.model.named_parameters(), mix)  # this rank's shards
        if reset_optimizer:
            self.optimizer = self._make_optimizer()

    def close(self) -> None:
        """Tear down megatron's model-parallel state and its process groups (the default one is kept)."""
        release_parallel()


def cut_flags(cfg) -> dict:
    """How a token budget counts the megatron learner's forwards (:func:`~pacs_fast.learner.packing.micro_batch_groups`:
    THD rows by real tokens, padded rows and the dense mask's bins by padded slots)."""
    dense = cfg.packing != "off" and getattr(cfg, "packed_attention", "auto") == "dense"
    return dict(padded=cfg.packing == "off", dense=dense)
