"""Worker for tests/test_fp32_lm_head.py, TP = 2 on two gloo ranks: ``run(folder)`` in the session's
megatron launch (tests/megatron_launch.py), or alone: ``torchrun --nproc_per_node 2
tests/fp32_head_megatron_worker.py --workdir F``.

A bf16 megatron-core model (the HF folder ``F/model``) computes token log-probs with
``lm_head_fp32=True`` for each backend of ``inputs.pt``'s ``backends`` (vocab-parallel
``linear_logprobs``); the op's inputs are captured (hidden states, this rank's head shard, labels,
log-probs and their upstream gradient), the shards gathered, and rank 0 saves them with the head
weight's bf16 gradient, per backend, to ``F/results.pt`` for the test to compare with float64.
"""
from __future__ import annotations

import importlib
import os
import warnings

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore")


def run(workdir: str) -> None:
    """On the default process group (tests/megatron_launch_worker.py creates it)."""
    from megatron.core import parallel_state as ps
    from transformers import AutoConfig

    from pacs_fast.learner.megatron.convert import load_hf_into_model
    from pacs_fast.learner.megatron.forward import output_weight, token_logprobs
    from pacs_fast.learner.megatron.learner import LazyHFCheckpoint
    from pacs_fast.learner.megatron.model import build_gpt_model
    from pacs_fast.learner.megatron.setup import init_parallel

    inputs = torch.load(os.path.join(workdir, "inputs.pt"))
    folder, backends, vocab = os.path.join(workdir, "model"), inputs["backends"], inputs["vocab"]
    init_parallel(2)
    group = ps.get_tensor_model_parallel_group()
    cfg = AutoConfig.from_pretrained(folder)
    model = build_gpt_model(cfg, tp_size=2, params_dtype=torch.bfloat16)
    load_hf_into_model(model, LazyHFCheckpoint(folder), cfg, tp_size=2, tp_rank=ps.get_tensor_model_parallel_rank())

    op = importlib.import_module("pacs_fast.ops.linear_logprobs")  # forward.py imports it at call time
    real, calls = op.linear_logprobs, []

    def spy(hidden, weight, labels, **kw):
        lp = real(hidden, weight, labels, **kw)
        calls.append((hidden.detach(), weight.detach(), labels, lp))
        return lp

    op.linear_logprobs = spy
    results = {}
    for backend in backends:
        calls.clear()
        model.zero_grad(set_to_none=True)
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(3, vocab, (4, 24), generator=gen)
        logp = token_logprobs(model, ids, torch.ones_like(ids), vocab_size=vocab, tp_group=group, backend=backend,
                              lm_head_fp32=True)
        (hidden, shard, labels, lp), = calls
        upstream = []
        lp.register_hook(lambda g: upstream.append(g.detach().clone()))
        (logp * torch.randn(logp.shape, generator=gen)).sum().backward()
        gathered = {}
        for name, t in (("weight", shard), ("grad", output_weight(model).grad)):
            parts = [torch.empty_like(t) for _ in range(2)]
            dist.all_gather(parts, t.contiguous(), group=group)
            gathered[name] = torch.cat(parts)
        results[backend] = {"hidden": hidden, "labels": labels, "logp": lp.detach(), "upstream": upstream[0],
                            **gathered}
    op.linear_logprobs = real
    ps.destroy_model_parallel()
    if dist.get_rank() == 0:
        torch.save(results, os.path.join(workdir, "results.pt"))
    dist.barrier()


if __name__ == "__main__":
    from megatron_launch_worker import run_alone

    run_alone(run)
