"""The PyTorch learner: one process, any device, a Hugging Face causal LM.

Log-probs come from the model's final hidden states and its LM head through
:func:`pacs_fast.ops.linear_logprobs` on the response positions only: the ``[B, T, V]`` logits
tensor is never built (``model.model`` gives the hidden states; ``lm_head.weight`` the head).

Optimisation: AdamW, global grad-norm clipping, mini-batches of whole groups (one optimiser step
each) accumulated over micro-batches of whole groups; the loss of each micro-batch is scaled so
that the accumulated gradient equals the mini-batch's (see :func:`pacs_fast.learner.base.objective`).
"""
from __future__ import annotations

import copy
import math
from typing import Iterable, Iterator

import torch

from pacs_fast.config import AlgoConfig, LearnerConfig
from pacs_fast.learner.base import (Learner, RolloutBatch, holds_reference_model, minibatch_counts,
                                    needs_reference, objective)
from pacs_fast.ops.linear_logprobs import linear_logprobs


def _decoder(model):
    """The transformer body of a ``*ForCausalLM`` (``model.model`` for Qwen2 / Llama)."""
    body = getattr(model, "model", None)
    if body is None and hasattr(model, "get_decoder"):
        body = model.get_decoder()
    if body is None:
        raise ValueError(f"{type(model).__name__} has no decoder body (model.model)")
    return body


def _head(model) -> torch.nn.Linear:
    head = model.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        raise ValueError(f"{type(model).__name__} has no LM head (get_output_embeddings())")
    return head


class TorchLearner(Learner):
    """Learner on a Hugging Face causal LM.

    Args:
        model: a ``*ForCausalLM`` (trained in place; the rollout engine may share it).
        algo, learner: the ``algo`` and ``learner`` sections of the run config.
        temperature: the rollout temperature (log-probs are those of the sampling distribution).
        horizon: the maximum response length (Dr. GRPO's constant divisor).
    """

    def __init__(self, model, *, algo: AlgoConfig, learner: LearnerConfig, temperature: float = 1.0,
                 horizon: int = 1):
        self.model = model
        self.algo = algo
        self.cfg = learner
        self.temperature = float(temperature)
        self.horizon = int(horizon)
        self.hf_config = model.config
        self.device = next(model.parameters()).device
        self.needs_ref = needs_reference(algo)
        self.ref_model = None
        if holds_reference_model(algo):
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.value_head = None
        self.has_value_head = algo.name == "ppo"
        if self.has_value_head:
            hidden = model.config.hidden_size
            self.value_head = torch.nn.Linear(hidden, 1).to(self.device, dtype=next(model.parameters()).dtype)
            torch.nn.init.zeros_(self.value_head.weight)
            torch.nn.init.zeros_(self.value_head.bias)
        self.optimizer = self._make_optimizer()
        self.last_terms: dict[str, torch.Tensor] = {}

    # ------------------------------------------------------------------ helpers
    def _params(self):
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.value_head is not None:
            params += list(self.value_head.parameters())
        return params

    def _make_optimizer(self) -> torch.optim.Optimizer:
        groups = [{"params": [p for p in self.model.parameters() if p.requires_grad], "lr": self.cfg.lr}]
        if self.value_head is not None:
            groups.append({"params": list(self.value_head.parameters()), "lr": self.cfg.critic_lr})
        return torch.optim.AdamW(groups, lr=self.cfg.lr, betas=tuple(self.cfg.betas), eps=self.cfg.eps,
                                 weight_decay=self.cfg.weight_decay)

    def _forward(self, model, batch: RolloutBatch, *, entropy: bool, values: bool):
        """Differentiable ``logp [b, T]`` (and entropy / values ``[b, T]``, else None)."""
        ids = batch.input_ids.to(self.device)
        mask = batch.response_mask.to(self.device)
        # Rows are right-padded, so the causal mask alone is exact for every real token.
        hidden = _decoder(model)(input_ids=ids, use_cache=False).last_hidden_state  # [b, T, H]
        sel = mask[:, 1:] > 0                                  # positions t >= 1 that are response tokens
        h = hidden[:, :-1][sel]                                # hidden state that predicts token t
        labels = ids[:, 1:][sel]
        head = _head(model)
        out = linear_logprobs(h, head.weight, labels, bias=head.bias, temperature=self.temperature,
                              return_entropy=entropy, backend=self.cfg.logprob_backend)
        lp, ent = out if entropy else (out, None)
        b, T = ids.shape

        def scatter(x):
            full = x.new_zeros(b, T - 1).masked_scatter(sel, x)
            return torch.cat([x.new_zeros(b, 1), full], dim=1)

        v = None
        if values:
            v = scatter(self.value_head(h).squeeze(-1).float())
        return scatter(lp), (scatter(ent) if ent is not None else None), v

    # ------------------------------------------------------------------ Learner
    @torch.no_grad()
    def compute_logprobs(self, batch: RolloutBatch, *, reference: bool = False, return_entropy: bool = False):
        model = self._model_for(reference)
        was = model.training
        model.eval()
        try:
            outs = [self._forward(model, batch.groups(range(s, min(s + self.cfg.micro_batch_prompts,
                                                                    batch.num_groups))),
                                  entropy=return_entropy, values=False)
                    for s in range(0, batch.num_groups, self.cfg.micro_batch_prompts)]
        finally:
            model.train(was)
        T = batch.input_ids.shape[1]
        pad = lambda x: torch.nn.functional.pad(x, (0, T - x.shape[1])).cpu()  # noqa: E731
        logp = torch.cat([pad(o[0]) for o in outs])
        if return_entropy:
            return logp, torch.cat([pad(o[1]) for o in outs])
        return logp

    @torch.no_grad()
    def compute_values(self, batch: RolloutBatch) -> torch.Tensor:
        if self.value_head is None:
            raise ValueError("compute_values: algo.name is not 'ppo' (no value head)")
        T = batch.input_ids.shape[1]
        outs = []
        for s in range(0, batch.num_groups, self.cfg.micro_batch_prompts):
            mb = batch.groups(range(s, min(s + self.cfg.micro_batch_prompts, batch.num_groups)))
            _, _, v = self._forward(self.model, mb, entropy=False, values=True)
            outs.append(torch.nn.functional.pad(v, (0, T - v.shape[1])).cpu())
        return torch.cat(outs)

    def update(self, batch: RolloutBatch, *, seed: int) -> dict[str, float]:
        self.model.train()
        gen = torch.Generator().manual_seed(int(seed))
        P = batch.num_groups
        mini = min(self.cfg.mini_batch_prompts, P)
        micro = min(self.cfg.micro_batch_prompts, mini)
        need_ent = bool(self.algo.entropy_coef)
        sums: dict[str, float] = {}
        steps = 0
        terms: dict[str, list] = {}
        params = self._params()
        for _ in range(self.cfg.epochs):
            order = torch.randperm(P, generator=gen)
            for start in range(0, P, mini):
                mb = batch.groups(order[start:start + mini])
                counts = minibatch_counts(mb)
                self.optimizer.zero_grad(set_to_none=True)
                step_metrics: dict[str, float] = {"loss": 0.0}
                for m in range(0, mb.num_groups, micro):
                    mcb = mb.groups(range(m, min(m + micro, mb.num_groups))).to(self.device)
                    logp, ent, values = self._forward(self.model, mcb, entropy=need_ent,
                                                      values=self.value_head is not None)
                    loss, met = objective(self.algo, mcb, logp, ent, values, counts, horizon=self.horizon)
                    loss.backward()
                    step_metrics["loss"] += float(loss.detach())
                    for k, v in met.items():
                        if v.dim() == 0:
                            step_metrics[k] = step_metrics.get(k, 0.0) + float(v)
                        else:
                            terms.setdefault(k, []).append(v.detach().cpu())
                    if "psi" in met:
                        terms.setdefault("rewards", []).append(mcb.rewards.detach().cpu())
                max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
                grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
                step_metrics["grad_norm"] = float(grad_norm)
                if torch.isfinite(grad_norm):
                    self.optimizer.step()
                else:
                    step_metrics["skipped_steps"] = 1.0
                self.optimizer.zero_grad(set_to_none=True)
                for k, v in step_metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
                steps += 1
        out = {k: v / steps for k, v in sums.items()}
        out["optimizer_steps"] = float(steps)
        self.last_terms = {k: torch.cat(v) for k, v in terms.items()}
        return out

    def reset_reference(self, *, reset_optimizer: bool) -> None:
        if self.ref_model is None:
            raise ValueError("reset_reference: this configuration keeps no reference model")
        self.ref_model.load_state_dict(self.model.state_dict())
        if reset_optimizer:
            self.optimizer = self._make_optimizer()

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "ref_model": self.ref_model.state_dict() if self.ref_model is not None else None,
            "value_head": self.value_head.state_dict() if self.value_head is not None else None,
        }

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.ref_model is not None:
            if state.get("ref_model") is None:
                raise ValueError("load_state_dict: the checkpoint has no reference model but this run needs one")
            self.ref_model.load_state_dict(state["ref_model"])
        if self.value_head is not None:
            if state.get("value_head") is None:
                raise ValueError("load_state_dict: the checkpoint has no value head but this run needs one")
            self.value_head.load_state_dict(state["value_head"])

    def export_hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        tied = bool(getattr(self.hf_config, "tie_word_embeddings", False))
        seen: set[int] = set()
        for name, t in self.model.state_dict().items():
            if tied and name == "lm_head.weight":
                continue
            if t.data_ptr() in seen and name.endswith("lm_head.weight"):
                continue
            seen.add(t.data_ptr())
            yield name, t.detach()

    def load_hf_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        state = self.model.state_dict()
        items = list(named_tensors)
        bad = [n for n, t in items if n not in state or tuple(state[n].shape) != tuple(t.shape)]
        if bad:
            raise ValueError(f"load_hf_weights: unknown names or wrong shapes: {bad[:5]}")
        with torch.no_grad():
            for name, t in items:
                state[name].copy_(t.to(device=state[name].device, dtype=state[name].dtype))
