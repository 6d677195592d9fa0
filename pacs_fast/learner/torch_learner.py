"""The PyTorch learner: one process, any device, a Hugging Face causal LM.

Log-probs come from the model's final hidden states and its LM head through
:func:`pacs_fast.ops.linear_logprobs` on the response positions only: the ``[B, T, V]`` logits
tensor is never built (``model.model`` gives the hidden states; ``lm_head.weight`` the head).
Which forward a batch runs (shared prefix, packed with varlen or dense-mask attention, padded) and how it is
cut into micro-batches: :mod:`.torch_forward`.
:meth:`TorchLearner.update` returns how many forwards of each kind ran since the last update (``forward/packed``,
``forward/shared_prefix``, ``forward/padded``: the step's log-prob passes and the update's) and their
``forward/token_slots``; the trainer records them as ``learner/forward/...`` every step.

Optimisation: AdamW, global grad-norm clipping, mini-batches of whole groups (one optimiser step
each) accumulated over micro-batches of whole groups; the loss of each micro-batch is scaled so
that the accumulated gradient equals the mini-batch's (see :func:`pacs_fast.learner.objective.objective`).

Fused old log-probs (:attr:`~pacs_fast.learner.base.Learner.fuses_old_logprobs`): before the first
optimiser step the policy *is* the rollout policy, so the forward of the first mini-batch already
gives its old log-probs (``logp.detach()``), its entropies and, with the rollout policy as the
reference, its ``ref_logp``. ``update`` then skips the separate no-grad pass for those groups and
runs it only for the groups of the later mini-batches. Exact when the model has no active dropout
(train and eval forwards agree); otherwise, and for PPO, the learner does not fuse. The off-policy
correction rides along (``update(correct=...)``, :attr:`~pacs_fast.learner.base.Learner.fuses_correction`):
the proximal policy is the policy of that first forward, so each row's importance weight is set
from it just before the row's loss.

Checkpoints (``state_dict`` / ``load_state_dict``) and the policy's Hugging Face weights: :mod:`.torch_checkpoint`.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import math
from collections import Counter
from collections.abc import Mapping

import torch

from pacs_fast.causal_lm import has_active_dropout, lm_head, logits_map, logits_transform
from pacs_fast.config import AlgoConfig, LearnerConfig
from pacs_fast.learner.base import Learner, NonFiniteError, RolloutBatch, by_length, group_rows
from pacs_fast.learner.grad_norm import clip_grad_norm
from pacs_fast.learner.fused_old_logprobs import FusedOldLogprobs
from pacs_fast.learner.long_groups import forward_pieces, train_micro_batch
from pacs_fast.learner.master_weights import MasterWeights
from pacs_fast.learner.lora import adapter_params, adapter_snapshot, adapters_swapped, copy_adapters, has_lora
from pacs_fast.learner.objective import (holds_reference_model, minibatch_counts, needs_entropy, needs_reference,
                                         objective)
from pacs_fast.learner.packing import forward_metrics, restores_attention
from pacs_fast.learner.reference import mix_into
from pacs_fast.learner.torch_checkpoint import TorchCheckpointing
from pacs_fast.learner.torch_forward import TorchForwards

DROPOUT_SEED_OFFSET = 0x0D50  # the update's dropout generators: another stream than its mini-batch order's


class TorchLearner(TorchForwards, TorchCheckpointing, Learner):
    """Learner on a Hugging Face causal LM.

    Args:
        model: a ``*ForCausalLM`` (trained in place; the rollout engine may share it). Logits that are not the
            head's (Gemma 2's soft-cap, Cohere's / Granite's scales: :func:`pacs_fast.causal_lm.logits_map`) are
            reproduced: the op's ``softcap``, the scale folded into the temperature; other transforms are refused.
        algo, learner: the ``algo`` and ``learner`` sections of the run config.
        temperature: the rollout temperature (log-probs are those of the sampling distribution).
        horizon: the maximum response length (Dr. GRPO's constant divisor).
        vocab_size: the number of real token ids (``len(tokenizer)``): log-probs and entropies use
            only the first ``vocab_size`` rows of the LM head, the distribution the rollout engines
            sample from (checkpoints pad the head beyond the tokenizer, Qwen2.5: 151,936 rows for
            151,665 ids). ``None``: every row (for a head as large as the tokenizer, the same).
        lm_head_fp32: the LM head in fp32 (``model.lm_head_fp32``): log-probs and their gradients
            from fp32 copies of the bf16/fp16 hidden states and head weight (``linear_logprobs(...,
            upcast=True)``); the gradients reach the parameters in their own dtype.

    A bf16 / fp16 model trains through fp32 master weights (``learner.master_weights``, the default): gradients
    accumulate in fp32, AdamW steps the masters, the model holds them rounded (pacs_fast/learner/master_weights.py).
    """

    def __init__(self, model, *, algo: AlgoConfig, learner: LearnerConfig, temperature: float = 1.0,
                 horizon: int = 1, vocab_size: int | None = None, lm_head_fp32: bool = False):
        rows = lm_head(model).weight.shape[0]
        head_map = logits_map(model.config)  # Gemma 2's soft-cap, Cohere's / Granite's scales: reproduced by the op
        if head_map is None:  # (the CLI refuses it before loading: pacs_fast.trainer.preflight.check_logits_transform)
            raise ValueError(f"{type(model).__name__} has {logits_transform(model.config)}: its logits are not its LM "
                             f"head's, in a way the log-prob op does not reproduce; not supported")
        # logits = scale * s(hidden @ W.T + b): the cap goes to the op, the scale into every pass's temperature
        self.softcap, self.logit_scale = head_map
        if vocab_size is not None and not 1 <= int(vocab_size) <= rows:
            raise ValueError(f"vocab_size must be in [1, {rows}] (the LM head's rows), got {vocab_size}")
        # None when every row is a real token (no slicing: the exact pre-masking computation)
        self.vocab_size = int(vocab_size) if vocab_size is not None and int(vocab_size) < rows else None
        self.model = model
        self.algo = algo
        self.cfg = learner
        self.temperature = float(temperature)
        self.horizon = int(horizon)
        self.lm_head_fp32 = bool(lm_head_fp32)
        self.hf_config = model.config
        self.lora = has_lora(model)  # adapters train, the base is frozen (pacs_fast/learner/lora.py)
        self._base_digest = None  # (of the frozen base, taken at the first checkpoint: _lora_base)
        self._loaded_merged: Mapping | None = None  # a checkpoint's merged weights, checked once its adapters load
        self.device = next(model.parameters()).device
        self.needs_ref = needs_reference(algo)
        self.ref_model = None
        # with LoRA the reference shares the frozen base: a copy of the adapters, swapped in for its forward
        self.ref_adapters: dict[str, torch.Tensor] | None = None
        if holds_reference_model(algo):
            if self.lora:
                self.ref_adapters = adapter_snapshot(model)
            else:
                self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.value_head = None
        self.has_value_head = algo.name == "ppo"
        if self.has_value_head:
            hidden = model.config.get_text_config().hidden_size  # (a multimodal wrapper's: its text model's)
            # in float32 at least: a bf16 head computed each value with 3 digits (7.8e-3 off at |v| ~ 1, H = 896,
            # against 5.6e-7 in fp32 from the same bf16 hidden states: bf16 audit, 2026-11-29)
            dtype = torch.promote_types(next(model.parameters()).dtype, torch.float32)
            self.value_head = torch.nn.Linear(hidden, 1).to(self.device, dtype=dtype)
            torch.nn.init.zeros_(self.value_head.weight)
            torch.nn.init.zeros_(self.value_head.bias)
        # fp32 masters of a bf16 / fp16 model's weights (after the reference model's copy: no hooks on it)
        self.master = None
        if learner.master_weights:
            master = MasterWeights([p for p in model.parameters() if p.requires_grad])
            self.master = master if master.active else None
        self.optimizer = self._make_optimizer()
        self.last_terms: dict[str, torch.Tensor] = {}
        # forwards of each kind (FORWARD_KINDS) and token slots since the last update()
        self.forwards: Counter = Counter()
        self.has_dropout = has_active_dropout(model)  # train-mode forwards draw masks (update: seeded per step)
        self.fuses_old_logprobs = algo.name != "ppo" and not self.has_dropout
        self.fuses_correction = self.fuses_old_logprobs
        self._switched: list = []  # (model, its attention implementation) switched to varlen attention
        self._depth = 0  # public calls in progress (restores_attention)

    # ------------------------------------------------------------------ helpers
    def _trainable(self):
        """The model's trainable parameters as the optimiser sees them (their fp32 masters, if any)."""
        return self.master.masters if self.master is not None else [p for p in self.model.parameters()
                                                                     if p.requires_grad]

    def _params(self):
        params = list(self._trainable())
        if self.value_head is not None:
            params += list(self.value_head.parameters())
        return params

    def _make_optimizer(self) -> torch.optim.Optimizer:
        groups = [{"params": list(self._trainable()), "lr": self.cfg.lr}]
        if self.value_head is not None:
            groups.append({"params": list(self.value_head.parameters()), "lr": self.cfg.critic_lr})
        return torch.optim.AdamW(groups, lr=self.cfg.lr, betas=tuple(self.cfg.betas), eps=self.cfg.eps,
                                 weight_decay=self.cfg.weight_decay)

    def _base_lrs(self) -> list[float]:
        return [self.cfg.lr] + ([self.cfg.critic_lr] if self.value_head is not None else [])

    # ------------------------------------------------------------------ Learner
    @restores_attention
    @torch.no_grad()
    def compute_logprobs(self, batch: RolloutBatch, *, reference: bool = False, return_entropy: bool = False):
        with self._policy_or_reference(reference) as model:
            was = model.training
            model.eval()
            items = self._micro_batches(batch, self.cfg.micro_batch_prompts, model)
            pieces = list(forward_pieces(batch, items, lambda sub: self._row_parts(sub, model)))
            try:
                outs = [self._forward(model, mcb, entropy=return_entropy, values=False) for mcb, _ in pieces]
            finally:
                model.train(was)
        T = batch.input_ids.shape[1]
        rows = torch.cat([r for _, r in pieces])
        pad = lambda x: torch.nn.functional.pad(x, (0, T - x.shape[1])).cpu()  # noqa: E731
        logp = torch.empty(batch.num_rows, T)
        logp[rows] = torch.cat([pad(o[0]) for o in outs]).float()
        if return_entropy:
            ent = torch.empty(batch.num_rows, T)
            ent[rows] = torch.cat([pad(o[1]) for o in outs]).float()
            return logp, ent
        return logp

    @restores_attention
    @torch.no_grad()
    def compute_values(self, batch: RolloutBatch) -> torch.Tensor:
        if self.value_head is None:
            raise ValueError("compute_values: algo.name is not 'ppo' (no value head)")
        T = batch.input_ids.shape[1]
        items = self._micro_batches(batch, self.cfg.micro_batch_prompts)
        out = torch.empty(batch.num_rows, T)
        # in eval mode, as compute_logprobs: update() leaves the model in train mode, and with model.lora_dropout the
        # values after the first step carried dropout noise (a resumed run's first pass, after eval(), had none)
        was = self.model.training
        self.model.eval()
        try:
            for mcb, rows in forward_pieces(batch, items, self._row_parts):
                _, _, v = self._forward(self.model, mcb, entropy=False, values=True)
                out[rows] = torch.nn.functional.pad(v, (0, T - v.shape[1])).float().cpu()
        finally:
            self.model.train(was)
        return out

    @restores_attention
    def update(self, batch: RolloutBatch, *, seed: int, correct=None) -> dict[str, float]:
        """See :meth:`Learner.update`. ``correct(rows, proximal_logp)``, with fused old log-probs
        only: sets ``rows.is_weights`` / ``rows.kept_mask`` of a (sub-)batch from the policy's
        log-probs before the update, row by row and rejecting nothing (the first mini-batch's
        denominators are counted before its forwards); the update calls it on each micro-batch of
        the first mini-batch with that forward's log-probs, and on the other rows with the no-grad
        pass's, so the off-policy correction costs no extra forward. With active dropout (``model.lora_dropout``,
        a model's own), the masks come from torch's generators seeded with ``seed`` for the update (theirs kept
        for after it), so they are the step's, whatever ran before it: a resumed run draws the uninterrupted
        one's (the held-out evaluation's sampling drew from the same generators)."""
        if not self.has_dropout:
            return self._update(batch, seed=seed, correct=correct)
        if not all(whole for _, whole in self._micro_batches(batch, self.cfg.micro_batch_prompts)):
            raise ValueError(f"update: a group is larger than learner.max_tokens_per_micro_batch="
                             f"{self.cfg.max_tokens_per_micro_batch}; learner.split_groups=auto trains it in two "
                             f"forwards, which active dropout (model.lora_dropout, the model's own) makes differ: "
                             f"raise the budget or turn dropout off")
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(int(seed) + DROPOUT_SEED_OFFSET)
            return self._update(batch, seed=seed, correct=correct)

    def _update(self, batch: RolloutBatch, *, seed: int, correct=None) -> dict[str, float]:
        self.model.train()
        gen = torch.Generator().manual_seed(int(seed))
        P = batch.num_groups
        mini = min(self.cfg.mini_batch_prompts, P)
        micro = min(self.cfg.micro_batch_prompts, mini)
        fuse = self._fuses_in_update(batch, correct, "dropout is active or algo is ppo")
        need_ent = needs_entropy(self.algo)
        sums: dict[str, float] = {}
        steps = 0
        terms: dict[str, list] = {}
        params = self._params()
        sort_key = self._rest_lengths(batch)
        for epoch in range(self.cfg.epochs):
            order = torch.randperm(P, generator=gen)
            for start in range(0, P, mini):
                fused_here = fuse and epoch == 0 and start == 0  # parameters are still the rollout policy's
                fused = FusedOldLogprobs(self, batch, order[:mini], correct) if fused_here else None
                # groups of similar length share a micro-batch (less padding; the sum is the same)
                mb_groups = by_length(order[start:start + mini], batch, lengths=sort_key)
                mb = batch.groups(mb_groups)
                counts = minibatch_counts(mb)
                self.optimizer.zero_grad(set_to_none=True)
                step_metrics: dict[str, float] = {"loss": 0.0}
                if self.cfg.max_tokens_per_micro_batch and self.cfg.split_groups == "auto":
                    step_metrics["split_groups"] = 0.0  # groups trained a few rows at a time (long_groups.py)
                forward = functools.partial(self._forward, self.model, entropy=need_ent or fused_here,
                                            values=self.value_head is not None)

                def loss_fn(m, lp, en, v):
                    return objective(self.algo, m, lp, en if need_ent else None, v, counts, horizon=self.horizon)
                take = None if fused is None else fused.take
                rows_in_order = []
                for part, whole in self._micro_batches(mb, micro):
                    mcb = mb.groups(part).to(self.device)
                    part_groups = mb_groups[torch.as_tensor(part, dtype=torch.long)]
                    # (groups over the token budget: a few rows at a time, exactly; row_order: mcb's rows as they ran)
                    loss, met, row_order = train_micro_batch(self.algo, mcb, whole, forward, loss_fn, self._row_parts,
                                                             on_first_forward=take)
                    if not whole:
                        step_metrics["split_groups"] += len(part)
                    rows_in_order.append(group_rows(part_groups, batch.group_size)[row_order])
                    step_metrics["loss"] += float(loss.detach())
                    for k, v in met.items():
                        if v.dim() == 0:
                            step_metrics[k] = step_metrics.get(k, 0.0) + float(v)
                        else:
                            terms.setdefault(k, []).append(v.detach().cpu())
                    if "psi" in met:
                        terms.setdefault("rewards", []).append(mcb.rewards[row_order].detach().cpu())
                        terms.setdefault("rows", []).append(rows_in_order[-1])
                if fused is not None:  # the first mini-batch's old log-probs (and correction) into the batch
                    fused.finish(lambda x: x.cpu(), torch.cat(rows_in_order))
                max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
                grad_norm = clip_grad_norm(params, max_norm)
                step_metrics["grad_norm"] = float(grad_norm)
                for what in ("loss", "grad_norm"):  # stop before a step that would poison the weights
                    if not math.isfinite(step_metrics[what]):
                        self.optimizer.zero_grad(set_to_none=True)
                        raise NonFiniteError(steps, f"{what}={step_metrics[what]}")
                self.optimizer.step()
                if self.master is not None:
                    self.master.copy_to_model()
                self.optimizer.zero_grad(set_to_none=True)
                for k, v in step_metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
                steps += 1
        out = {k: v / steps for k, v in sums.items()}
        out["optimizer_steps"] = float(steps)
        # which forward ran (learner.packing / learner.shared_prefix), counted over the forwards since the last
        # update's record: this step's log-prob passes (old, reference, at temperature 1) and the update's
        out.update(forward_metrics(self.forwards))
        self.forwards.clear()
        self.last_terms = {k: torch.cat(v) for k, v in terms.items()}
        return out

    @property
    def holds_reference(self) -> bool:
        return self.ref_model is not None or self.ref_adapters is not None

    @contextlib.contextmanager
    def _policy_or_reference(self, reference: bool):
        """The module whose forward is the policy, or the reference policy with ``reference=True``: the held
        reference model, or with LoRA the policy's model with the reference adapters swapped in."""
        if reference and self.ref_adapters is not None:
            with adapters_swapped(self.model, self.ref_adapters):
                yield self.model
        else:
            yield self._model_for(reference)

    def reset_reference(self, *, reset_optimizer: bool, mix: float = 1.0) -> None:
        if not self.holds_reference:
            raise ValueError("reset_reference: this configuration keeps no reference model")
        if self.ref_adapters is not None:
            if mix != 1.0:
                raise ValueError(f"reset_reference: mix={mix} mixes whole weights, which LoRA adapters cannot hold")
            copy_adapters(self.ref_adapters, adapter_params(self.model))
        else:
            mix_into(self.ref_model.named_parameters(), self.model.named_parameters(), mix)
        if reset_optimizer:
            self.optimizer = self._make_optimizer()
