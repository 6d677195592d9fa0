"""Worker for tests/test_megatron_packing.py: ``run(folder)`` in the session's megatron launch
(tests/megatron_launch.py), or alone: ``torchrun --nproc_per_node 2 tests/megatron_packing_worker.py --workdir F``.

1. forward (TP = 2): the Qwen2.5-width model's per-token log-probs, entropies, a PACS + entropy loss
   and every parameter's gradient (gathered to HF names; recorded as max |packed - padded| and max
   |padded| per name), padded (``packing="off"``) and packed (``"on"``), on a batch of wildly uneven rows.
2. learner (TP = 1 x DP = 2): ``MegatronLearner.update`` twice on one batch, three ways: padded rows,
   one group per micro-batch, replicated AdamW (the baseline); the same with the optimiser sharded
   over the two data-parallel ranks (``distributed_optimizer``); packed rows with token-budget
   micro-batches and the sharded optimiser; the same with a budget of about one row (groups trained a few rows at a
   time), its old log-probs given and fused. Weights, optimiser state (consolidated), per-rank
   optimiser bytes, the metrics, and a save_state / load_state round trip of the sharded optimiser; the
   replicated and sharded runs again with the model in bf16 (fp32 master weights).

Inputs: ``<workdir>/inputs.pt``; rank 0 writes ``<workdir>/results.pt``.
"""
from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore")


def forward(inputs, results):
    from megatron.core import parallel_state as ps
    from transformers import AutoConfig

    from pacs_fast.algorithms import pacs_loss
    from pacs_fast.learner.megatron.convert import export_hf_state_dict, load_hf_into_model
    from pacs_fast.learner.megatron.cpu_compat import apply_cpu_compat
    from pacs_fast.learner.megatron.forward import token_logprobs
    from pacs_fast.learner.megatron.learner import LazyHFCheckpoint
    from pacs_fast.learner.megatron.model import build_gpt_model

    ps.initialize_model_parallel(tensor_model_parallel_size=2, create_gloo_process_groups=False)
    apply_cpu_compat()
    group = ps.get_tensor_model_parallel_group()
    spec = inputs["forward"]
    cfg = AutoConfig.from_pretrained(spec["model"])
    model = build_gpt_model(cfg, tp_size=2)
    load_hf_into_model(model, LazyHFCheckpoint(spec["model"]), cfg, tp_size=2,
                       tp_rank=ps.get_tensor_model_parallel_rank())
    rm = spec["response_mask"]
    grads = {}
    for packing in ("off", "on"):
        model.zero_grad(set_to_none=True)
        logp, ent = token_logprobs(model, spec["input_ids"], spec["attention_mask"], label_mask=rm > 0,
                                   vocab_size=cfg.vocab_size, tp_group=group, return_entropy=True,
                                   backend="torch", packing=packing)
        loss = pacs_loss(logp, spec["logp_ref"], rm, spec["rewards"], group_size=spec["group_size"])
        loss = loss - 0.01 * (ent * rm).sum() / rm.sum()
        loss.backward()
        grads[packing] = export_hf_state_dict(model, cfg, tp_group=group, grads=True)
        results[f"forward/{packing}"] = {"logp": logp.detach(), "ent": ent.detach(), "loss": loss.detach()}
    # the gradients compared here (~0.6 GB a variant at this vocabulary: writing them for the test cost ~5 s
    # of CPU): per HF name, max |on - off| and max |off|
    results["forward/grad_names"] = {k: sorted(g) for k, g in grads.items()}
    results["forward/grads"] = {n: (float((grads["on"][n] - g).abs().max()), float(g.abs().max()))
                                for n, g in grads["off"].items() if n in grads["on"]}
    ps.destroy_model_parallel()


def learner(inputs, results, workdir):
    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.learner.base import RolloutBatch
    from pacs_fast.learner.megatron.learner import MegatronLearner
    from pacs_fast.learner.megatron.optimizer import state_bytes

    spec = inputs["learner"]
    variants = {"replicated": dict(packing="off"),
                "sharded": dict(packing="off", distributed_optimizer=True),
                "packed_budget": dict(packing="on", distributed_optimizer=True,
                                      max_tokens_per_micro_batch=spec["budget"]),
                # groups over a budget of about one row: trained a few rows at a time (learner.split_groups=auto), with
                # the old log-probs given and from the update's own first forward (fused)
                "packed_split": dict(packing="on", distributed_optimizer=True,
                                     max_tokens_per_micro_batch=spec["split_budget"]),
                "fused_split": dict(packing="on", distributed_optimizer=True,
                                    max_tokens_per_micro_batch=spec["split_budget"]),
                # GRPO: the split groups' rows in one pass (their whole groups' advantages), the old log-probs fused,
                # against whole groups with fused old log-probs
                "grpo_fused_whole": dict(packing="on", distributed_optimizer=True,
                                         max_tokens_per_micro_batch=spec["budget"]),
                "grpo_fused_split": dict(packing="on", distributed_optimizer=True,
                                         max_tokens_per_micro_batch=spec["split_budget"]),
                # a bf16 model through fp32 master weights: the sharded optimiser steps the masters as the replicated
                "replicated_bf16": dict(packing="off"),
                "sharded_bf16": dict(packing="off", distributed_optimizer=True)}
    for name, extra in variants.items():
        lcfg = LearnerConfig(**spec["learner"], backend="megatron", tp_size=1, **extra)
        algo = {"name": "grpo", "entropy_coef": 0.01} if name.startswith("grpo") else spec["algo"]
        lrn = MegatronLearner(spec["model"], algo=AlgoConfig(**algo), learner=lcfg,
                              temperature=1.0, horizon=spec["horizon"],
                              dtype="bfloat16" if name.endswith("_bf16") else "float32")
        batch = RolloutBatch(**spec["batch"])
        if "fused" not in name:
            batch.old_logp = lrn.compute_logprobs(batch)
            batch.ref_logp = batch.old_logp
        metrics = [lrn.update(batch, seed=s) for s in (3, 4)]
        bytes_per_rank = [None] * dist.get_world_size()
        dist.all_gather_object(bytes_per_rank, state_bytes(lrn.optimizer))
        full = lrn.state_dict()
        out = {"old_logp": batch.old_logp, "metrics": metrics, "terms": lrn.last_terms,
               "weights": dict(lrn.export_hf_weights()), "state": full["optimizer"], "masters": full["master_weights"],
               "optimizer_bytes": bytes_per_rank, "sharded": type(lrn.optimizer).__name__}
        if name.startswith("sharded"):  # the trainer's checkpoint path: consolidate, write, read back into a fresh one
            folder = os.path.join(workdir, f"state_{name}")
            lrn.save_state(folder, is_writer=dist.get_rank() == 0)
            before = lrn.state_dict()
            lrn.optimizer = lrn._make_optimizer()
            if lrn.master is not None:  # (masters that the load must restore, not keep; fp32 parameters are their own)
                for p, m in zip(lrn.master.params, lrn.master.masters):
                    if m is not p:
                        m.data.zero_()
            lrn.load_state(folder)
            after = lrn.state_dict()
            out["roundtrip"] = max(float((after["optimizer"][k][n] - before["optimizer"][k][n]).abs().max())
                                   for k in ("exp_avg", "exp_avg_sq") for n in before["optimizer"][k])
            if before["master_weights"] is not None:
                out["roundtrip"] = max(out["roundtrip"], max(float((after["master_weights"][n] - t).abs().max())
                                                             for n, t in before["master_weights"].items()))
            out["roundtrip_step"] = (before["optimizer"]["step"], after["optimizer"]["step"])
        results[f"learner/{name}"] = out
        lrn.close()


def run(workdir: str) -> None:
    """Both parts on the default process group (tests/megatron_launch_worker.py creates it)."""
    inputs = torch.load(os.path.join(workdir, "inputs.pt"))
    results = {}
    forward(inputs, results)
    learner(inputs, results, workdir)
    if dist.get_rank() == 0:
        torch.save(results, os.path.join(workdir, "results.pt"))
    dist.barrier()


if __name__ == "__main__":
    from megatron_launch_worker import run_alone

    run_alone(run)
