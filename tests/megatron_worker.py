"""Worker for tests/test_megatron_tp.py: ``run(folder)`` in the session's megatron launch
(tests/megatron_launch.py), or alone: ``torchrun --nproc_per_node 2 tests/megatron_worker.py --workdir F``.

1. parity: for TP = 1 (two data-parallel replicas) and TP = 2, for the tied and the untied tiny
   model: per-token log-probs, the PACS loss and its gradients (gathered to HF names).
2. learner: ``MegatronLearner.update`` (two optimiser steps) with TP = 2 (``ref=fixed``: a
   reference model) and with TP = 1 x DP = 2 (each data-parallel rank gets half of the groups;
   activation recomputation on); the updated weights and AdamW moments in HF names, a state-dict
   round trip; the TP = 2 learner also writes an HF folder (``save_hf``).
3. baselines: :func:`baseline_step` (the test runs the same on the torch learner) for a few baselines with the
   keys that reach the learner (KL with a reference model, entropy bonus, truncated rows, off-policy weights, stale
   old log-probs, epochs, the learning-rate scale), TP = 2 and TP = 1 x DP = 2.

Inputs come from ``<workdir>/inputs.pt`` (written by the test); rank 0 writes
``<workdir>/results.pt``. The test compares everything with transformers on the same weights.
"""
from __future__ import annotations

import os
import time
import warnings

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore")


def parity(inputs, results, variants):
    from megatron.core import parallel_state as ps
    from transformers import AutoConfig

    from pacs_fast.algorithms import pacs_loss
    from pacs_fast.learner.megatron.convert import export_hf_state_dict, load_hf_into_model
    from pacs_fast.learner.megatron.cpu_compat import apply_cpu_compat
    from pacs_fast.learner.megatron.forward import token_logprobs
    from pacs_fast.learner.megatron.learner import LazyHFCheckpoint
    from pacs_fast.learner.megatron.model import build_gpt_model
    from pacs_fast.learner.megatron.sequence_parallel import norm_params, reduce_norm_grads

    for tp in (1, 2):
        ps.initialize_model_parallel(tensor_model_parallel_size=tp, create_gloo_process_groups=False)
        apply_cpu_compat()
        group = ps.get_tensor_model_parallel_group() if tp > 1 else None
        for variant in variants:
            path = inputs["models"][variant]
            cfg = AutoConfig.from_pretrained(path)
            hf_state = LazyHFCheckpoint(path)
            model = build_gpt_model(cfg, tp_size=tp)
            load_hf_into_model(model, hf_state, cfg, tp_size=tp, tp_rank=ps.get_tensor_model_parallel_rank())
            t0 = time.perf_counter()
            logp = token_logprobs(model, inputs["input_ids"], inputs["attention_mask"],
                                  vocab_size=cfg.vocab_size, tp_group=group)
            loss = pacs_loss(logp, inputs["logp_ref"], inputs["response_mask"], inputs["rewards"],
                             group_size=inputs["group_size"])
            loss.backward()
            reduce_norm_grads([p.grad for p in norm_params(model)], group)  # (Qwen3's q / k norms at TP=2)
            elapsed = time.perf_counter() - t0
            grads = export_hf_state_dict(model, cfg, tp_group=group, grads=True)
            results[f"parity/tp{tp}/{variant}"] = {
                "logp": logp.detach(), "loss": loss.detach(), "grads": grads, "seconds": elapsed}
        ps.destroy_model_parallel()


def run(workdir: str) -> None:
    """Both parts on the default process group (tests/megatron_launch_worker.py creates it)."""
    inputs = torch.load(os.path.join(workdir, "inputs.pt"))
    results = {}
    parity(inputs, results, inputs["variants"])
    learner_step(inputs, results, workdir)
    baselines(inputs, results)
    sequence_parallel(inputs, results)
    if dist.get_rank() == 0:
        torch.save(results, os.path.join(workdir, "results.pt"))
    dist.barrier()


def learner_step(inputs, results, workdir):
    """TP=2 (reference model kept, ``ref=fixed``) and TP=1 x DP=2 (``ref=rollout``) learners."""
    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.learner.base import RolloutBatch
    from pacs_fast.learner.megatron.learner import MegatronLearner

    spec = inputs["learner"]
    saved = None
    for tp, ref in ((2, "fixed"), (1, "rollout")):
        key = f"learner/tp{tp}"
        algo = AlgoConfig(**spec["algo"], ref=ref)
        lcfg = LearnerConfig(**spec["learner"], backend="megatron", tp_size=tp)
        t0 = time.perf_counter()
        # TP=1 also runs with megatron's activation recomputation (results must not change)
        learner = MegatronLearner(spec["model"], algo=algo, learner=lcfg, temperature=spec["temperature"],
                                  horizon=spec["horizon"], gradient_checkpointing=tp == 1)
        t_build = time.perf_counter() - t0
        batch = RolloutBatch(**spec["batch"])
        t0 = time.perf_counter()
        old = learner.compute_logprobs(batch)
        t_logp = time.perf_counter() - t0
        batch.old_logp = old
        batch.ref_logp = learner.compute_logprobs(batch, reference=True) if ref == "fixed" else old
        t0 = time.perf_counter()
        metrics = learner.update(batch, seed=spec["seed"])
        t_update = time.perf_counter() - t0
        out = {"old_logp": old, "metrics": metrics, "terms": learner.last_terms,
               "weights": dict(learner.export_hf_weights()),
               "seconds": {"build": t_build, "logprobs": t_logp, "update": t_update}}
        state = learner.state_dict()
        out["exp_avg"] = state["optimizer"]["exp_avg"]
        out["exp_avg_sq"] = state["optimizer"]["exp_avg_sq"]
        learner.load_state_dict(state)
        again = learner.state_dict()["optimizer"]
        out["state_roundtrip"] = max(float((again[k][n] - state["optimizer"][k][n]).abs().max())
                                     for k in ("exp_avg", "exp_avg_sq") for n in again[k])
        if saved is not None:  # the TP=2 checkpoint resumes under TP=1
            learner.load_state_dict(saved)
            out["resharded_exp_avg_sq"] = learner.state_dict()["optimizer"]["exp_avg_sq"]
        saved = state
        if ref == "fixed":
            out["ref_after_update"] = learner.compute_logprobs(batch, reference=True)
            learner.reset_reference(reset_optimizer=True)
            out["ref_after_reset"] = learner.compute_logprobs(batch, reference=True)
            out["policy_after_update"] = learner.compute_logprobs(batch)
            learner.save_hf(os.path.join(workdir, "hf_tp2"))
            out["full_disk"] = full_disk_errors(learner, workdir)
            # ranks given different batches: every rank raises (no hang, no silent garbage)
            bad = RolloutBatch(**{**spec["batch"], "rewards": spec["batch"]["rewards"] + dist.get_rank()})
            try:
                learner.compute_logprobs(bad)
                out["divergence_error"] = None
            except ValueError as e:
                out["divergence_error"] = str(e)
        results[key] = out
        learner.close()


def baseline_step(learner, spec: dict, case: dict) -> dict:
    """One trainer-like step of ``learner`` (either learner) on ``spec``'s batch for ``case`` (``algo`` / ``learner``
    settings, ``truncated``, ``is_weights``, ``stale``: old log-probs moved by ``spec["noise"]`` so that every
    ratio is off 1 and the clips act, ``lr_scale``). Returns the old log-probs, the metrics and the HF weights."""
    import copy

    from pacs_fast.learner.base import RolloutBatch
    from pacs_fast.learner.objective import holds_reference_model

    batch = RolloutBatch(**copy.deepcopy(spec["batch"]))
    if case.get("truncated"):
        batch.truncated = spec["truncated"].clone()
    if case.get("advantages"):  # GPG's step-scaled advantages (the trainer's: one process, the whole step)
        from pacs_fast.trainer.step import step_gpg
        batch.advantages = step_gpg(batch)
    batch.old_logp, batch.old_entropy = learner.compute_logprobs(batch, return_entropy=True)
    old = batch.old_logp.clone()
    if case.get("stale"):
        batch.old_logp = batch.old_logp + spec["noise"] * batch.response_mask
    if case.get("is_weights"):
        batch.is_weights = spec["is_weights"] * batch.response_mask
        batch.kept_mask = batch.response_mask.clone()
    if learner.needs_ref:
        batch.ref_logp = (learner.compute_logprobs(batch, reference=True) if holds_reference_model(learner.algo)
                          else batch.old_logp)
    if learner.algo.name == "ppo":  # the trainer's values and GAE (pacs_fast/trainer/step.py)
        from pacs_fast.algorithms import gae
        from pacs_fast.trainer.batch import outcome_token_rewards
        batch.old_values = learner.compute_values(batch)
        batch.advantages, batch.returns = gae(outcome_token_rewards(batch), batch.old_values, batch.response_mask)
    learner.set_lr_scale(case.get("lr_scale", 1.0))
    metrics = learner.update(batch, seed=spec["seed"])
    out = {"old_logp": old, "metrics": metrics, "weights": dict(learner.export_hf_weights())}
    if learner.algo.name == "ppo":  # the value head after its step (not an HF weight)
        out["values_after"] = learner.compute_values(batch)
    return out


def baselines(inputs, results):
    """:func:`baseline_step` for each of ``inputs["baselines"]["cases"]`` at TP = 2 and TP = 1 x DP = 2."""
    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.learner.megatron.learner import MegatronLearner

    spec = inputs["baselines"]
    for tp in (2, 1):
        for name, case in spec["cases"].items():
            model = spec["models"][case["model"]] if "model" in case else spec["model"]
            learner = MegatronLearner(model, algo=AlgoConfig(**case["algo"]),
                                      learner=LearnerConfig(**case["learner"], backend="megatron", tp_size=tp),
                                      temperature=spec["temperature"], horizon=spec["horizon"])
            results[f"baselines/tp{tp}/{name}"] = baseline_step(learner, spec, case)
            learner.close()


def _trimmed(am: torch.Tensor, rm: torch.Tensor, rows) -> tuple[torch.Tensor, torch.Tensor]:
    """``am`` / ``rm`` with the last valid token of each of ``rows`` dropped (another row or token count parity)."""
    am, rm = am.clone(), rm.clone()
    for b in rows:
        last = int(am[b].nonzero().max())
        am[b, last] = 0
        rm[b, last] = 0
    return am, rm


def sequence_parallel(inputs, results):
    """``learner.sequence_parallel`` at TP=2 against the same model without it: log-probs, entropies and every
    gradient (the norms' reduced over the ranks, and also unreduced: what the reduction changes) for padded rows,
    THD and the dense mask, on batches whose token counts are odd and even (the padding to a multiple of tp runs);
    then whole PACS updates of the learner (bf16 with fp32 masters: the norms' masters get the sum)."""
    from megatron.core import parallel_state as ps
    from transformers import AutoConfig

    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.learner.base import RolloutBatch
    from pacs_fast.learner.megatron.convert import export_hf_state_dict, load_hf_into_model
    from pacs_fast.learner.megatron.cpu_compat import apply_cpu_compat
    from pacs_fast.learner.megatron.forward import token_logprobs
    from pacs_fast.learner.megatron.learner import LazyHFCheckpoint, MegatronLearner
    from pacs_fast.learner.megatron.model import build_gpt_model
    from pacs_fast.learner.megatron.sequence_parallel import norm_params, reduce_norm_grads

    ps.initialize_model_parallel(tensor_model_parallel_size=2, create_gloo_process_groups=False)
    apply_cpu_compat()
    group = ps.get_tensor_model_parallel_group()
    ids, am, rm = inputs["input_ids"], inputs["attention_mask"], inputs["response_mask"]
    longest = am.sum(1) == am.sum(1).max()
    batches = {"as_drawn": (am, rm), "longest_cut": _trimmed(am, rm, longest.nonzero().flatten().tolist()),
               "one_cut": _trimmed(am, rm, [0])}
    weights = torch.linspace(0.5, 1.5, ids.numel()).view_as(ids)
    for variant in ("tied", "qwen3"):  # (tied: its pad id 0 is a real token in half the rows; qwen3: q / k norms)
        path = inputs["models"][variant]
        cfg = AutoConfig.from_pretrained(path)
        for name, (a, r) in batches.items():
            for packing, attention in (("off", "auto"), ("on", "varlen"), ("on", "dense")):
                out = {"tokens": int(a.sum()), "width": int(a.sum(1).max())}
                for sp in (False, True):
                    model = build_gpt_model(cfg, tp_size=2, **({"sequence_parallel": True} if sp else {}))
                    load_hf_into_model(model, LazyHFCheckpoint(path), cfg, tp_size=2,
                                       tp_rank=ps.get_tensor_model_parallel_rank())
                    logp, ent = token_logprobs(model, ids, a, label_mask=r > 0, vocab_size=cfg.vocab_size,
                                               tp_group=group, return_entropy=True, packing=packing,
                                               packed_attention=attention)
                    ((logp * weights).sum() + 0.3 * ent.sum()).backward()
                    if sp:
                        out["norms"] = len(norm_params(model))
                        out["unreduced"] = export_hf_state_dict(model, cfg, tp_group=group, grads=True)
                    reduce_norm_grads([p.grad for p in norm_params(model)], group)
                    out[sp] = {"logp": logp.detach(), "entropy": ent.detach(),
                               "grads": export_hf_state_dict(model, cfg, tp_group=group, grads=True)}
                results[f"sp/{variant}/{name}/{packing}-{attention}"] = out
    ps.destroy_model_parallel()
    spec = inputs["learner"]
    for sp in (False, True):  # bf16 with fp32 masters; Adam's eps large: updates proportional to the gradients
        lcfg = LearnerConfig(**{**spec["learner"], "eps": 1.0, "lr": 0.05}, backend="megatron", tp_size=2,
                             sequence_parallel=sp)
        learner = MegatronLearner(spec["model"], algo=AlgoConfig(**spec["algo"]), learner=lcfg, dtype="bfloat16",
                                  temperature=spec["temperature"], horizon=spec["horizon"])
        before = [p.detach().clone() for p in learner.opt_params]  # this rank's fp32 masters (bf16: a step rounds)
        batch = RolloutBatch(**spec["batch"])
        batch.old_logp = batch.ref_logp = learner.compute_logprobs(batch)
        metrics = learner.update(batch, seed=spec["seed"])
        norms = {id(p) for p in learner.norm_params}
        results[f"sp/learner/{sp}"] = {
            "metrics": metrics, "delta": [p.detach() - b for p, b in zip(learner.opt_params, before)],
            "is_norm": [id(p) in norms for p in learner.opt_params],
            "masters": [p.dtype for p in learner.opt_params]}
        learner.close()


def full_disk_errors(learner, workdir) -> dict:
    """What every rank raises when the writer (rank 0) hits a full disk writing the learner state (torch's zip
    writer raises a RuntimeError, not an OSError) or the weights (safetensors' own error) in buckets small enough
    that several are gathered after the failure: each rank comes back with an error (a rank that raised alone
    left the other waiting in its next collective: a 2-rank run hung at a full disk). Also the files a small-bucket
    save writes when nothing fails."""
    import safetensors.torch
    from safetensors import SafetensorError

    real_save, real_file = torch.save, safetensors.torch.save_file

    def zip_writer(*a, **kw):
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 4096 vs 3982")

    def safetensors_writer(*a, **kw):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    small = 1 << 14
    learner.save_hf(os.path.join(workdir, "small_buckets"), bucket_bytes=small)
    got = {"files": sorted(os.listdir(os.path.join(workdir, "small_buckets")))}
    calls = {"state": lambda: learner.save_state(os.path.join(workdir, "full_state"),
                                                 is_writer=dist.get_rank() == 0),
             "weights": lambda: learner.save_hf(os.path.join(workdir, "full_hf"), bucket_bytes=small)}
    for what, call in calls.items():
        if dist.get_rank() == 0:
            torch.save, safetensors.torch.save_file = zip_writer, safetensors_writer
        try:
            call()
            got[what] = None
        except ValueError as e:
            got[what] = str(e)
        finally:
            torch.save, safetensors.torch.save_file = real_save, real_file
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, got)  # (both ranks came back)
    return every


if __name__ == "__main__":
    from megatron_launch_worker import run_alone

    run_alone(run)
