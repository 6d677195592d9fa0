"""The megatron-core tensor-parallel learner (``learner.backend=megatron``).

Launch (every process runs the trainer; they all see the same rollout batch)::

    torchrun --nproc_per_node 2 -m pacs_fast.train learner.backend=megatron learner.tp_size=2

Parallel layout: ``world = tp_size x dp``. Tensor parallelism shards attention heads, MLP columns
and the vocabulary; the LM head's vocab shard goes straight into the vocab-parallel
:func:`pacs_fast.ops.linear_logprobs` (no gather of the logits). Data parallelism gives each of the
``dp`` replicas an equal share of the *whole groups* of every mini-batch; micro-batch losses are
scaled by the full mini-batch's counts (:func:`pacs_fast.learner.base.objective`), so the
data-parallel gradient is a SUM all-reduce and the step equals the single-process step.

Optimiser: ``torch.optim.AdamW`` on each rank's local shards (AdamW is element-wise, so sharding
does not change the update) with a tensor-parallel aware global gradient norm for clipping
(sharded parameters counted once per shard, replicated ones once). This is megatron's
non-distributed optimiser semantics; megatron's ZeRO-1 distributed optimiser (optimiser state
sharded over data-parallel ranks) is not used — on CPU it needs more CUDA redirections than
:mod:`~pacs_fast.learner.megatron.cpu_compat` makes, and the test machines have no GPU to test it.

Checkpoints (:meth:`state_dict`) hold the optimiser moments and the reference model gathered to
full Hugging Face-named tensors, so every rank's copy is identical and a checkpoint resumes under
any tensor-parallel size.

Not supported (ValueError or documented gap): PPO (no value head), pipeline parallelism, sequence
parallelism (needs Transformer Engine), Transformer Engine / flash attention layer specs (megatron's
local spec is used on GPU too), fp32 master weights for ``dtype="bfloat16"`` (as the torch learner).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Iterable, Iterator

import torch
import torch.distributed as dist

from pacs_fast.learner.base import (
    Learner,
    RolloutBatch,
    by_length,
    dealt_rows_to_sorted,
    holds_reference_model,
    minibatch_counts,
    needs_reference,
    objective,
)


# ----------------------------------------------------------------------------- setup helpers
def init_parallel(tp_size: int, *, device: str = "auto") -> torch.device:
    """Initialise ``torch.distributed`` (from torchrun's env, or a 1-process group) and megatron's
    model-parallel state with ``tp_size``; returns this rank's device.

    gloo on CPU, NCCL on CUDA. An existing megatron state must have the same ``tp_size``.
    """
    import warnings

    with warnings.catch_warnings():  # the import announces that TE / Apex are absent (expected)
        warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")
        from megatron.core import parallel_state as ps
        import megatron.core.models.gpt  # noqa: F401

    from pacs_fast.learner.megatron.cpu_compat import apply_cpu_compat

    use_cuda = torch.cuda.is_available() if device == "auto" else device.startswith("cuda")
    if use_cuda and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but CUDA is not available")
    if not use_cuda and torch.cuda.is_available():
        raise ValueError(f"device={device!r}: the megatron learner runs on the GPU when one is present "
                         "(its CPU path is only for machines without one); use device='auto'")
    if not dist.is_initialized():
        if "WORLD_SIZE" not in os.environ:  # plain `python -m pacs_fast.train`: one process
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        if use_cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if use_cuda else "gloo")
    world = dist.get_world_size()
    if tp_size < 1 or world % tp_size:
        raise ValueError(f"learner.tp_size={tp_size} must divide the number of processes ({world})")
    if ps.model_parallel_is_initialized():
        if ps.get_tensor_model_parallel_world_size() != tp_size:
            raise ValueError(f"megatron is already initialised with tp={ps.get_tensor_model_parallel_world_size()}"
                             f", not learner.tp_size={tp_size}")
    else:
        ps.initialize_model_parallel(tensor_model_parallel_size=tp_size, create_gloo_process_groups=False)
    if not use_cuda:
        apply_cpu_compat()
    return torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LazyHFCheckpoint(Mapping):
    """Read-only ``{hf_name: tensor}`` view of an HF folder's ``*.safetensors`` files (single or
    sharded) that reads a tensor only when asked for it: converting to this rank's shards then
    holds one layer's full tensors at a time, never the whole model."""

    def __init__(self, path):
        from safetensors import safe_open

        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise ValueError(f"model path {str(path)!r} holds no *.safetensors file")
        self._index = {}
        for f in files:
            with safe_open(str(f), framework="pt") as h:
                self._index.update(dict.fromkeys(h.keys(), str(f)))

    def __getitem__(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(self._index[name], framework="pt") as h:
            return h.get_tensor(name)

    def __iter__(self):
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


def tp_grad_norm(params, tp_group) -> torch.Tensor:
    """Global L2 norm of the gradients of a tensor-parallel model (fp32 0-d tensor).

    Sharded parameters (megatron's ``tensor_model_parallel`` attribute) contribute their local
    shard on every rank; replicated ones are counted on TP rank 0 only; then one SUM all-reduce.
    """
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    sq = torch.zeros((), dtype=torch.float32, device=params[0].device)
    for p in params:
        if p.grad is not None and param_is_not_tensor_parallel_duplicate(p):
            sq += p.grad.detach().float().pow(2).sum()
    if tp_group is not None and dist.get_world_size(tp_group) > 1:
        dist.all_reduce(sq, group=tp_group)
    return sq.sqrt()


# ----------------------------------------------------------------------------- the learner
class MegatronLearner(Learner):
    """:class:`~pacs_fast.learner.base.Learner` on a megatron-core ``GPTModel`` (TP x DP).

    Same optimisation semantics as :class:`pacs_fast.learner.torch_learner.TorchLearner`
    (mini-batches of whole groups in ``randperm(seed)`` order, micro-batch accumulation,
    AdamW, global-norm clipping, a non-finite gradient norm skips the step).

    Args:
        model_path: Hugging Face folder of the initial policy (Qwen2 / Llama architecture).
        algo, learner: the ``algo`` and ``learner`` sections of the run config (``learner.tp_size``).
        temperature: the rollout temperature (log-probs are those of the sampling distribution).
        horizon: the maximum response length (Dr. GRPO's constant divisor).
        dtype: ``"float32"`` | ``"bfloat16"`` parameters (CPU: float32).
        device: ``"auto"`` | ``"cpu"`` | ``"cuda"``.
        gradient_checkpointing: megatron full activation recomputation.

    Every process of the launch must construct it and call every method with the same arguments
    (they are collective); all ranks return the same values.
    """

    def __init__(self, model_path, *, algo, learner, temperature: float = 1.0, horizon: int = 1,
                 dtype: str = "float32", device: str = "auto", gradient_checkpointing: bool = False):
        from megatron.core import parallel_state as ps
        from transformers import AutoConfig

        from pacs_fast.learner.megatron.convert import load_hf_into_model

        self.algo = algo
        self.cfg = learner
        self.temperature = float(temperature)
        self.horizon = int(horizon)
        if algo.name == "ppo":
            raise ValueError("algo.name='ppo' needs a value head, which the megatron learner does not "
                             "have; use learner.backend=torch")
        if learner.mini_batch_prompts % learner.micro_batch_prompts:
            raise ValueError(f"learner.micro_batch_prompts={learner.micro_batch_prompts} must divide "
                             f"learner.mini_batch_prompts={learner.mini_batch_prompts}")
        params_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(dtype)
        if params_dtype is None:
            raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
        self.device = init_parallel(learner.tp_size, device=device)
        self.tp_size = learner.tp_size
        self.tp_rank = ps.get_tensor_model_parallel_rank()
        self.tp_group = ps.get_tensor_model_parallel_group() if learner.tp_size > 1 else None
        self.dp_group = ps.get_data_parallel_group()
        self.dp_size = ps.get_data_parallel_world_size()
        self.dp_rank = ps.get_data_parallel_rank()

        self.hf_config = AutoConfig.from_pretrained(model_path)
        overrides = {}
        if gradient_checkpointing:
            overrides = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
        hf_state = LazyHFCheckpoint(model_path)
        self.model = self._build(params_dtype, overrides)
        load_hf_into_model(self.model, hf_state, self.hf_config, tp_size=self.tp_size, tp_rank=self.tp_rank)
        self.needs_ref = needs_reference(algo)
        self.ref_model = None
        if holds_reference_model(algo):
            self.ref_model = self._build(params_dtype, {})
            load_hf_into_model(self.ref_model, hf_state, self.hf_config, tp_size=self.tp_size,
                               tp_rank=self.tp_rank)
            self.ref_model.requires_grad_(False).eval()
        del hf_state
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = self._make_optimizer()
        self.steps = 0
        self.last_terms: dict[str, torch.Tensor] = {}

    def _build(self, dtype, overrides):
        from pacs_fast.learner.megatron.model import build_gpt_model

        return build_gpt_model(self.hf_config, tp_size=self.tp_size, params_dtype=dtype,
                               **overrides).to(self.device)

    def _make_optimizer(self):
        lc = self.cfg
        return torch.optim.AdamW(self.params, lr=lc.lr, betas=tuple(lc.betas), eps=lc.eps,
                                 weight_decay=lc.weight_decay)

    # ------------------------------------------------------------------ forward
    def _logprobs(self, model, batch: RolloutBatch, return_entropy: bool):
        """Differentiable ``logp [b, T]`` (and entropy, else None) on the response positions."""
        from pacs_fast.learner.megatron.forward import token_logprobs

        batch = batch.to(self.device)
        out = token_logprobs(model, batch.input_ids, batch.attention_mask,
                             label_mask=batch.response_mask > 0, vocab_size=self.hf_config.vocab_size,
                             tp_group=self.tp_group, temperature=self.temperature,
                             return_entropy=return_entropy, backend=self.cfg.logprob_backend)
        return out if return_entropy else (out, None)

    def _dp_share(self, n: int) -> list[int]:
        """This data-parallel rank's contiguous share of ``range(n)`` groups (equal shares)."""
        if n % self.dp_size:
            raise ValueError(f"{n} groups cannot be split evenly over {self.dp_size} data-parallel "
                             "ranks: make learner.mini/micro_batch_prompts multiples of it")
        k = n // self.dp_size
        return list(range(self.dp_rank * k, (self.dp_rank + 1) * k))

    def _check_same_batch(self, batch: RolloutBatch) -> None:
        """Every rank must be given the same batch (TP ranks compute on the same rows); a cheap
        fingerprint compared over all ranks turns a silent divergence into a ValueError."""
        if dist.get_world_size() == 1:
            return
        ids = batch.input_ids.to(torch.float64)
        w = (torch.arange(ids.numel(), dtype=torch.float64) % 1009 + 1).view_as(ids)
        fp = torch.stack([ids.sum(), (ids * w.to(ids.device)).sum(), batch.rewards.double().sum(),
                          batch.response_mask.double().sum(), torch.tensor(float(ids.numel()),
                                                                            dtype=torch.float64)])
        fp = fp.to(self.device)
        lo, hi = fp.clone(), fp.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        if not torch.equal(lo, hi):
            raise ValueError("batch: the processes were given different batches; every rank of a "
                             "megatron launch must pass the same rollout batch")

    def _gather_dp(self, local: torch.Tensor) -> torch.Tensor:
        """Concatenation over data-parallel ranks (in rank order) of equally shaped tensors."""
        if self.dp_size == 1:
            return local
        parts = [torch.empty_like(local) for _ in range(self.dp_size)]
        dist.all_gather(parts, local.contiguous(), group=self.dp_group)
        return torch.cat(parts)

    @torch.no_grad()
    def compute_logprobs(self, batch: RolloutBatch, *, reference: bool = False, return_entropy: bool = False):
        model = self._model_for(reference)
        self._check_same_batch(batch)
        was = model.training
        model.eval()
        B, T = batch.input_ids.shape
        # Groups padded (by repeating the last) to split evenly over data-parallel ranks.
        n = batch.num_groups + (-batch.num_groups) % self.dp_size
        padded = batch.groups([min(g, batch.num_groups - 1) for g in range(n)])
        mine = self._dp_share(n)
        step = self.cfg.micro_batch_prompts
        pad = lambda x: torch.nn.functional.pad(x, (0, T - x.shape[1]))  # noqa: E731
        lps, ents = [], []
        try:
            for s in range(0, len(mine), step):
                lp, en = self._logprobs(model, padded.groups(mine[s:s + step]), return_entropy)
                lps.append(pad(lp))
                if en is not None:
                    ents.append(pad(en))
        finally:
            model.train(was)
        logp = self._gather_dp(torch.cat(lps))[:B].cpu()
        if return_entropy:
            return logp, self._gather_dp(torch.cat(ents))[:B].cpu()
        return logp

    # ------------------------------------------------------------------ training
    def _all_reduce_dp(self, tensors: list[torch.Tensor]) -> None:
        """SUM all-reduce over data-parallel ranks, through one flat fp32 buffer."""
        if self.dp_size == 1 or not tensors:
            return
        flat = torch.cat([t.reshape(-1).float() for t in tensors])
        dist.all_reduce(flat, group=self.dp_group)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()

    def update(self, batch: RolloutBatch, *, seed: int) -> dict[str, float]:
        self._check_same_batch(batch)
        self.model.train()
        gen = torch.Generator().manual_seed(int(seed))
        P = batch.num_groups
        mini = min(self.cfg.mini_batch_prompts, P)
        sums: dict[str, float] = {}
        terms: dict[str, list] = {}
        steps = 0
        for _ in range(self.cfg.epochs):
            order = torch.randperm(P, generator=gen)
            for start in range(0, P, mini):
                # sorted by length, dealt over the DP ranks (balanced shares, little padding)
                dealt = by_length(order[start:start + mini], batch, shares=self.dp_size)
                step_metrics = self._mini_batch(batch.groups(dealt), terms)
                for k, v in step_metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
                steps += 1
        self.steps += 1
        out = {k: v / steps for k, v in sums.items()}
        out["optimizer_steps"] = float(steps)
        self.last_terms = {k: torch.cat(v) for k, v in terms.items()}
        return out

    def _mini_batch(self, mb: RolloutBatch, terms: dict[str, list]) -> dict[str, float]:
        """One optimiser step on mini-batch ``mb``: this DP rank's share of its groups, in
        micro-batches; gradients summed over DP ranks; TP-aware clipping; AdamW."""
        counts = minibatch_counts(mb)
        mine = mb.groups(self._dp_share(mb.num_groups))
        micro = min(self.cfg.micro_batch_prompts, mine.num_groups)
        need_ent = bool(self.algo.entropy_coef)
        self.optimizer.zero_grad(set_to_none=True)
        scalars: dict[str, torch.Tensor] = {"loss": torch.zeros((), device=self.device)}
        local_terms: dict[str, list] = {}
        for m in range(0, mine.num_groups, micro):
            mcb = mine.groups(range(m, min(m + micro, mine.num_groups))).to(self.device)
            logp, ent = self._logprobs(self.model, mcb, need_ent)
            loss, met = objective(self.algo, mcb, logp, ent, None, counts, horizon=self.horizon)
            loss.backward()
            scalars["loss"] += loss.detach().float()
            for k, v in met.items():
                if v.dim() == 0:
                    scalars[k] = scalars.get(k, 0.0) + v.detach().float()
                else:
                    local_terms.setdefault(k, []).append(v.detach().float())
            if "psi" in met:
                local_terms.setdefault("rewards", []).append(mcb.rewards.detach().float())
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        names = sorted(scalars)
        stats = torch.stack([torch.as_tensor(scalars[k], device=self.device, dtype=torch.float32)
                             for k in names])
        self._all_reduce_dp([p.grad for p in self.params] + [stats])
        back = dealt_rows_to_sorted(mb.num_groups, self.dp_size, mb.group_size)
        for k, v in local_terms.items():  # rows of the whole mini-batch, in its sorted order
            terms.setdefault(k, []).append(self._gather_dp(torch.cat(v)).cpu()[back])
        grad_norm = tp_grad_norm(self.params, self.tp_group)
        out = {k: float(v) for k, v in zip(names, stats)}
        out["grad_norm"] = float(grad_norm)
        if torch.isfinite(grad_norm):
            if self.cfg.grad_clip > 0:  # as torch.nn.utils.clip_grad_norm_
                coef = torch.clamp(self.cfg.grad_clip / (grad_norm + 1e-6), max=1.0)
                for p in self.params:
                    p.grad.mul_(coef.to(p.grad.dtype))
            self.optimizer.step()
        else:
            out["skipped_steps"] = 1.0
        self.optimizer.zero_grad(set_to_none=True)
        return out

    # ------------------------------------------------------------------ reference / weights
    @torch.no_grad()
    def reset_reference(self, *, reset_optimizer: bool) -> None:
        if self.ref_model is None:
            raise ValueError("reset_reference: this configuration keeps no reference model")
        for p_ref, p in zip(self.ref_model.parameters(), self.model.parameters()):
            p_ref.copy_(p)
        if reset_optimizer:
            self.optimizer = self._make_optimizer()

    def export_hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        from pacs_fast.learner.megatron.convert import export_hf_state_dict

        state = export_hf_state_dict(self.model, self.hf_config, tp_group=self.tp_group)
        return iter(state.items())

    def load_hf_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        from pacs_fast.learner.megatron.convert import load_hf_into_model

        state = dict(named_tensors)
        if self.hf_config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        load_hf_into_model(self.model, state, self.hf_config, tp_size=self.tp_size, tp_rank=self.tp_rank)

    def save_hf(self, path) -> None:
        """Writes the policy as an HF folder; collective, global rank 0 writes."""
        from safetensors.torch import save_file

        weights = {name: t.contiguous() for name, t in self.export_hf_weights()}
        if dist.get_rank() == 0:
            path = Path(path)
            path.mkdir(parents=True, exist_ok=True)
            save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
            self.hf_config.save_pretrained(path)
        dist.barrier()

    # ------------------------------------------------------------------ checkpoints
    def _gather_named(self, local: dict) -> dict:
        from pacs_fast.learner.megatron.convert import gather_to_hf

        return {k: v.cpu().clone() for k, v in gather_to_hf(local, self.hf_config, tp_group=self.tp_group).items()}

    def _scatter_named(self, full: dict) -> dict:
        from pacs_fast.learner.megatron.convert import hf_to_megatron

        return hf_to_megatron(full, self.hf_config, tp_size=self.tp_size, tp_rank=self.tp_rank)

    def state_dict(self) -> dict:
        """Optimiser moments and the reference model as full HF-named tensors (collective)."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        moments = {"exp_avg": {}, "exp_avg_sq": {}}
        step = None
        for p in self.params:
            st = self.optimizer.state.get(p)
            if not st:
                continue
            step = float(st["step"])
            for key in moments:
                moments[key][names[id(p)]] = st[key]
        optim = None
        if step is not None:
            optim = {"step": step, **{k: self._gather_named(v) for k, v in moments.items()}}
        ref = None
        if self.ref_model is not None:
            ref = self._gather_named(dict(self.ref_model.named_parameters()))
        return {"backend": "megatron", "optimizer": optim, "ref_model": ref, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        if state.get("backend") != "megatron":
            raise ValueError("state: not a megatron learner state (key 'backend' != 'megatron')")
        self.steps = int(state["steps"])
        self.optimizer = self._make_optimizer()
        optim = state.get("optimizer")
        if optim is not None:
            shards = {k: self._scatter_named(optim[k]) for k in ("exp_avg", "exp_avg_sq")}
            for name, p in self.model.named_parameters():
                self.optimizer.state[p] = {
                    "step": torch.tensor(optim["step"], dtype=torch.float32),
                    "exp_avg": shards["exp_avg"][name].to(p.device, p.dtype),
                    "exp_avg_sq": shards["exp_avg_sq"][name].to(p.device, p.dtype),
                }
        if self.ref_model is not None:
            if state.get("ref_model") is None:
                raise ValueError("load_state_dict: the checkpoint has no reference model but this run needs one")
            from pacs_fast.learner.megatron.convert import load_hf_into_model

            load_hf_into_model(self.ref_model, state["ref_model"], self.hf_config, tp_size=self.tp_size,
                               tp_rank=self.tp_rank)

    def close(self) -> None:
        """Tear down megatron's model-parallel state (the default process group is kept)."""
        from megatron.core import parallel_state as ps

        ps.destroy_model_parallel()
