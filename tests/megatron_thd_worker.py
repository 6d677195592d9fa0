"""Worker for tests/test_megatron_thd.py: ``run(folder)`` in the session's megatron launch
(tests/megatron_launch.py), or alone: ``torchrun --nproc_per_node 2 tests/megatron_thd_worker.py --workdir F``.

1. forward, TP = 1 (two replicas) and TP = 2: per-token log-probs, entropies, a PACS + entropy loss
   and every parameter's gradient (gathered to HF names) of the padded rows (``packing="off"``), the
   padded rows through megatron's own attention with the causal mask (``padded_megatron``: the fallback), the
   dense-mask packed rows (``packed_attention="dense"``) and the THD rows (``"varlen"``), on uneven
   rows of 1 to 300 tokens and (TP = 2) on rows up to ~1.4k tokens; how many attention calls took
   the dense ``[S, S]`` path during the THD forward; how many rows reached the LM head; the THD
   path's refusal of attention dropout.
2. ``learner.fused_layers`` (``fused_layers``): the same values, padded and THD, TP = 1 and 2 (and TP = 2
   with full and with selective recompute), before and after the MLPs' SwiGLU goes through the fused op's exact
   torch twin, and after ``unfuse_layers``; the twin's calls counted.
3. learner, TP = 2 and TP = 1 x DP = 2: ``MegatronLearner.update`` with the off-policy correction
   set from a separate ``compute_logprobs`` pass, and fused (``update(correct=...)``, old log-probs
   left None): old log-probs, entropies, weights, metrics, the updated weights and the rows forwarded;
   ``learner.fused_layers=auto``'s line on the CPU.

Inputs: ``<workdir>/inputs.pt``; rank 0 writes ``<workdir>/results.pt``.
"""
from __future__ import annotations

import importlib
import os
import warnings

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore")


def forward(inputs, results):
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from transformers import AutoConfig

    from pacs_fast.learner.megatron.convert import load_hf_into_model
    from pacs_fast.learner.megatron.cpu_compat import apply_cpu_compat
    from pacs_fast.learner.megatron.forward import token_logprobs
    from pacs_fast.learner.megatron.learner import LazyHFCheckpoint
    from pacs_fast.learner.megatron.model import build_gpt_model

    dense_calls = []
    dense_forward = DotProductAttention.forward

    def counting(self, *args, **kwargs):  # the [b, heads, S, S] path
        dense_calls.append(1)
        return dense_forward(self, *args, **kwargs)

    DotProductAttention.forward = counting
    head_op = importlib.import_module("pacs_fast.ops.linear_logprobs")  # token_logprobs imports it per call
    head_rows = []
    head = head_op.linear_logprobs

    def counting_head(hidden, *args, **kwargs):  # the rows that reach the LM head
        head_rows.append(hidden.shape[0])
        return head(hidden, *args, **kwargs)

    head_op.linear_logprobs = counting_head
    cfg = AutoConfig.from_pretrained(inputs["model"])
    for tp in (1, 2):
        ps.initialize_model_parallel(tensor_model_parallel_size=tp, create_gloo_process_groups=False)
        apply_cpu_compat()
        group = ps.get_tensor_model_parallel_group() if tp > 1 else None
        model = build_gpt_model(cfg, tp_size=tp)
        load_hf_into_model(model, LazyHFCheckpoint(inputs["model"]), cfg, tp_size=tp,
                           tp_rank=ps.get_tensor_model_parallel_rank())
        for name, spec in inputs["batches"].items():
            if tp not in spec["tp"]:
                continue
            rm = spec["response_mask"]
            for mode in spec["modes"]:
                dense_calls.clear()
                head_rows.clear()
                results[f"forward/tp{tp}/{name}/{mode}"] = {
                    **_loss_and_grads(model, cfg, spec, mode, group),
                    "dense_calls": len(dense_calls), "head_rows": sum(head_rows)}
        fused_layers(inputs, results, model, cfg, tp, group)
        if tp == 2:  # attention dropout while training: the THD path refuses (the dense one would differ)
            spec = inputs["batches"]["uneven"]
            model.decoder.layers[0].self_attention.core_attention.attention_dropout.p = 0.1
            try:
                token_logprobs(model, spec["input_ids"], spec["attention_mask"], vocab_size=cfg.vocab_size,
                               tp_group=group, backend="torch", packing="on", packed_attention="varlen")
                results["dropout_error"] = None
            except ValueError as e:
                results["dropout_error"] = str(e)
        ps.destroy_model_parallel()
    DotProductAttention.forward = dense_forward
    head_op.linear_logprobs = head


def _loss_and_grads(model, cfg, spec, mode, group) -> dict:
    """Log-probs, entropies, a PACS + entropy loss and every gradient (HF names) of ``spec``'s rows in ``mode``
    (padded / dense / thd)."""
    from pacs_fast.algorithms import pacs_loss
    from pacs_fast.learner.megatron.convert import export_hf_state_dict
    from pacs_fast.learner.megatron.core_attention import core_attention_class
    from pacs_fast.learner.megatron.forward import token_logprobs

    rm = spec["response_mask"]
    model.zero_grad(set_to_none=True)
    cls = core_attention_class()
    why_not = cls._why_not_kernel
    if mode == "padded_megatron":  # padded rows through megatron's own attention with the causal mask (its fallback)
        cls._why_not_kernel = lambda self, *a: "forced by the test"
    try:
        logp, ent = token_logprobs(model, spec["input_ids"], spec["attention_mask"], label_mask=rm > 0,
                                   vocab_size=cfg.vocab_size, tp_group=group, return_entropy=True,
                                   backend="torch", packing="off" if mode.startswith("padded") else "on",
                                   packed_attention="varlen" if mode == "thd" else "dense")
    finally:
        cls._why_not_kernel = why_not
    loss = pacs_loss(logp, spec["logp_ref"], rm, spec["rewards"], group_size=spec["group_size"])
    loss = loss - 0.01 * (ent * rm).sum() / rm.sum()
    loss.backward()
    return {"logp": logp.detach(), "ent": ent.detach(), "loss": loss.detach(),
            "grads": export_hf_state_dict(model, cfg, tp_group=group, grads=True)}


def fused_layers(inputs, results, model, cfg, tp, group):
    """learner.fused_layers on megatron's model with the ops' exact torch twins (Liger's kernels need a GPU),
    each call counted: padded and THD rows without and (TP = 2) with activation recompute (full and selective,
    model.recompute_granularity), unfused then fused, and after unfuse_layers."""
    from megatron.core import parallel_state as ps

    from pacs_fast.learner.fused_layers import FusedOps, fuse_layers, torch_ops, unfuse_layers
    from pacs_fast.learner.megatron.convert import load_hf_into_model
    from pacs_fast.learner.megatron.learner import LazyHFCheckpoint
    from pacs_fast.learner.megatron.model import build_gpt_model, recompute_overrides

    calls = []
    twin = torch_ops()
    ops = FusedOps(twin.rms_norm, twin.silu_mul, lambda y: (calls.append(y.shape[-1]), twin.gated_silu(y))[1])
    spec = inputs["batches"]["uneven"]
    models = {"": model}
    if tp == 2:  # megatron's recompute (full: each layer; selective: each MLP) reruns the fused forward too
        for granularity, key in (("full", "recompute/"), ("selective", "selective/")):
            models[key] = build_gpt_model(cfg, tp_size=tp, **recompute_overrides(True, granularity))
            load_hf_into_model(models[key], LazyHFCheckpoint(inputs["model"]), cfg, tp_size=tp,
                               tp_rank=ps.get_tensor_model_parallel_rank())
    for key, m in models.items():
        for mode in ("padded", "thd"):
            calls.clear()
            out = {"plain": _loss_and_grads(m, cfg, spec, mode, group)}
            out["done"] = fuse_layers(m, ops=ops)
            out["fused"] = _loss_and_grads(m, cfg, spec, mode, group)
            out["calls"], out["widths"] = len(calls), sorted(set(calls))
            out["recompute"] = (m.config.recompute_granularity, sorted(m.config.recompute_modules or []),
                                [layer.recompute_mlp for layer in m.decoder.layers])
            out["unfused"] = unfuse_layers(m)
            calls.clear()
            out["after"] = _loss_and_grads(m, cfg, spec, mode, group)
            out["calls_after"] = len(calls)
            results[f"fused/tp{tp}/{key}{mode}"] = out


def learner(inputs, results):
    from pacs_fast.algorithms.off_policy import off_policy_correction
    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.learner.base import RolloutBatch
    from pacs_fast.learner.megatron.learner import MegatronLearner

    spec = inputs["learner"]

    def correct(rows, proximal):  # truncated sequence-level IS weights, no rejection (the trainer's fused case)
        w, kept, _ = off_policy_correction(proximal.float().cpu(), rows.behaviour_logp.float().cpu(),
                                           rows.response_mask.cpu() > 0, is_level="sequence", is_cap=1.2)
        rows.is_weights, rows.kept_mask = w.to(rows.response_mask), kept.to(rows.response_mask)

    for tp in (2, 1):
        for fused in (False, True):
            lcfg = LearnerConfig(**spec["learner"], backend="megatron", tp_size=tp, fused_layers="auto")
            lrn = MegatronLearner(spec["model"], algo=AlgoConfig(**spec["algo"]), learner=lcfg, temperature=1.0,
                                  horizon=spec["horizon"])
            batch = RolloutBatch(**spec["batch"])
            batch.behaviour_logp = (lrn.compute_logprobs(batch) + spec["noise"]) * batch.response_mask
            rows_run, plain = [], lrn._logprobs  # rows this rank forwards from here on (no-grad pass + update)
            lrn._logprobs = lambda model, b, ent, **kw: (rows_run.append(b.num_rows), plain(model, b, ent, **kw))[1]
            if fused:
                flags = (lrn.fuses_old_logprobs, lrn.fuses_correction)
                metrics = lrn.update(batch, seed=spec["seed"], correct=correct)
            else:
                flags = None
                batch.old_logp, batch.old_entropy = lrn.compute_logprobs(batch, return_entropy=True)
                batch.ref_logp = batch.old_logp
                correct(batch, batch.old_logp)
                metrics = lrn.update(batch, seed=spec["seed"])
            results[f"learner/tp{tp}/{'fused' if fused else 'separate'}"] = {
                "flags": flags, "metrics": metrics, "old_logp": batch.old_logp, "old_entropy": batch.old_entropy,
                "ref_is_old": batch.ref_logp is batch.old_logp, "is_weights": batch.is_weights,
                "kept_mask": batch.kept_mask, "weights": dict(lrn.export_hf_weights()), "rows_run": sum(rows_run),
                "dp": lrn.dp_size, "fused_layers": lrn.fused_layers}
            lrn.close()


def run(workdir: str) -> None:
    """Both parts on the default process group (tests/megatron_launch_worker.py creates it)."""
    inputs = torch.load(os.path.join(workdir, "inputs.pt"))
    results = {}
    forward(inputs, results)
    learner(inputs, results)
    if dist.get_rank() == 0:
        torch.save(results, os.path.join(workdir, "results.pt"))
    dist.barrier()


if __name__ == "__main__":
    from megatron_launch_worker import run_alone

    run_alone(run)
