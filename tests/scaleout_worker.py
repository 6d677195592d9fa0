"""Worker for tests/test_scaleout.py: ``torchrun --nproc_per_node N tests/scaleout_worker.py``.

Every rank holds a megatron learner shard (DP-local batches) and a colocated vLLM engine (one per TP
group, ``external_launcher``), as the trainer will. One launch, one layout ``(tp, dp = N / tp)``:

1. rollout: each DP group generates its share of the step's prompts (seeds by global prompt index);
2. learner: log-probs and one update on the group's own rollouts (local batches);
3. sync: shard-local bucketed weight sync; the engine's teacher-forced log-probs vs the learner's;
4. bad syncs (a wrong name on one rank, a wrong shard shape on another): every rank raises, the
   engine is untouched and still scores as before;
5. ``save_hf`` (sharded, gathered to rank 0) and ``save_state`` / ``load_state``: a learner rebuilt
   from the saved folder and state repeats the next update bit for bit;
6. a non-finite loss raises ``NonFiniteError`` on every rank with the weights unchanged;
7. (``--equivalence``) DP-local update == full-batch update when the local batches are the shares.

Each rank writes ``<workdir>/rank{r}.pt``; the test reads them all.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import time
import warnings

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore")


def make_batch(prompts, comps, rewards, G):
    """Right-padded ``RolloutBatch`` from prompts and their G completions each (the trainer's own
    :func:`pacs_fast.trainer.batch.build_batch`, pad id 0)."""
    from pacs_fast.trainer.batch import build_batch

    assert all(len(cs) == G for cs in comps)
    return build_batch(prompts, [[c.token_ids for c in cs] for cs in comps], torch.as_tensor(rewards).tolist(),
                       pad_id=0)


def build_learner(spec, model_path, **kw):
    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.learner.megatron.learner import MegatronLearner

    from transformers import AutoTokenizer

    kw.setdefault("vocab_size", len(AutoTokenizer.from_pretrained(spec["model"])))
    return MegatronLearner(model_path, algo=AlgoConfig(**spec["algo"]),
                           learner=LearnerConfig(**spec["learner"], backend="megatron", tp_size=spec["tp"]),
                           temperature=1.0, horizon=spec["horizon"], **kw)


def local_params(learner):
    return {k: v.detach().clone() for k, v in learner.model.named_parameters()}


def expect_error(fn, exc=ValueError):
    try:
        fn()
    except exc as e:  # noqa: PERF203
        return f"{type(e).__name__}: {e}"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--equivalence", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import faulthandler

    # a hang in a collective shows where every rank waits (the test's timeout is 400 s)
    faulthandler.dump_traceback_later(int(os.environ.get("SCALEOUT_HANG_S", "300")), exit=True)
    spec = torch.load(os.path.join(args.workdir, "spec.pt"))
    from pacs_fast.rollout.base import SamplingParams
    from pacs_fast.rollout.parallel_engines import colocated_engine_kwargs, dp_share, sync_colocated
    from pacs_fast.rollout.vllm_engine import VLLMEngine

    out, t = {}, {}
    t0 = time.perf_counter()
    learner = build_learner(spec, spec["model"], local_batches=True)
    rank, world, tp = dist.get_rank(), dist.get_world_size(), spec["tp"]
    dp = world // tp
    engine = VLLMEngine(spec["model"], seed=0, max_model_len=128, gpu_memory_utilization=0.05,
                        **colocated_engine_kwargs(tp, dp, lockstep=spec.get("lockstep", False)))
    t["start"] = time.perf_counter() - t0
    lay = engine.layout
    # vLLM's CPU all-reduce of the TP group: its shared memory, named after this job, names removed after the start
    from vllm.distributed.parallel_state import get_tp_group

    shm = get_tp_group().device_communicator.dist_module
    name = getattr(shm, "group_name", "")
    job = f"{os.environ['MASTER_ADDR']}_{os.environ['MASTER_PORT']}"
    # vLLM's kernels for AVX2-only CPUs (vllm._C_AVX2) have no shared-memory all-reduce: it falls back to
    # torch.distributed there, and no segment of this job may exist
    left = glob.glob(os.path.join("/dev/shm", glob.escape(name.lstrip("/")) + "*")) if name else \
        glob.glob(os.path.join("/dev/shm", "*" + glob.escape(re.sub(r"[^A-Za-z0-9.]", "_", job)) + "*"))
    out["shm"] = (type(shm).__name__, name, left, job, hasattr(torch.ops._C, "init_shm_manager"))
    out["layout"] = (lay.tp_rank, lay.dp_rank, lay.dp_size, learner.tp_rank, learner.dp_rank)

    # 1. rollout: this DP group's share of the step's prompts
    G = spec["G"]
    prompts, offset = dp_share(spec["prompts"], lay.dp_rank, lay.dp_size)
    t0 = time.perf_counter()
    comps = engine.generate(prompts, SamplingParams(n=G, max_new_tokens=spec["max_new_tokens"],
                                                    seed=spec["seed"] + offset * G))
    t["generate"] = time.perf_counter() - t0
    out["prompts"], out["offset"] = prompts, offset
    out["completions"] = [[c.token_ids for c in cs] for cs in comps]
    rewards = spec["rewards"][offset * G:(offset + len(prompts)) * G]
    batch = make_batch(prompts, comps, rewards, G)
    seqs = [row[m > 0].tolist() for row, m in zip(batch.input_ids, batch.attention_mask)]
    resp = batch.response_mask

    # 2. learner step on the local batch
    t0 = time.perf_counter()
    batch.old_logp = learner.compute_logprobs(batch)
    batch.ref_logp = batch.old_logp
    t["logprobs"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    out["metrics"] = learner.update(batch, seed=spec["seed"])
    t["update"] = time.perf_counter() - t0
    out["terms_rows"] = len(next(iter(learner.last_terms.values())))

    def engine_vs_learner():
        """max |engine score - learner log-prob| over the response tokens of the local rows."""
        lp = learner.compute_logprobs(batch)
        sc = engine.score(seqs)
        d = 0.0
        for b, s in enumerate(sc):
            n = len(s)
            e = torch.tensor(s)
            mine = lp[b, 1:n + 1]
            m = resp[b, 1:n + 1] > 0
            d = max(d, float((e - mine)[m].abs().max()))
        return d

    # an empty share (e.g. an uneven evaluation split) still joins the data-parallel engines' steps
    empty_turn = lay.dp_rank == lay.dp_size - 1 and lay.dp_size > 1
    got = engine.generate([] if empty_turn else prompts, SamplingParams(n=1, max_new_tokens=4, seed=1))
    out["empty_share"] = (empty_turn, len(got))
    got = engine.score([] if empty_turn else seqs[:1])
    out["empty_share_score"] = (empty_turn, len(got))

    out["diff_before_sync"] = engine_vs_learner()
    # 3. shard-local sync
    out["sync"] = sync_colocated(engine, learner, bucket_bytes=spec["bucket_bytes"])
    out["diff_after_sync"] = engine_vs_learner()

    # 4. bad syncs: a wrong name (on the last rank) and a wrong shard shape (on rank 0)
    last = engine.last_sync
    real = learner.hf_weight_manifest
    name = "model.layers.1.mlp.up_proj.weight"
    if rank == world - 1:
        learner.hf_weight_manifest = lambda: [(n.replace("up_proj", "upp_proj") if n == name else n, s)
                                              for n, s in real()]
    out["bad_name"] = expect_error(lambda: sync_colocated(engine, learner))
    learner.hf_weight_manifest = real
    p = dict(learner.model.named_parameters())["decoder.layers.0.self_attention.linear_proj.weight"]
    saved = p.data
    if rank == 0:
        p.data = torch.zeros(saved.shape[0], saved.shape[1] + 1)
    out["bad_shape"] = expect_error(lambda: sync_colocated(engine, learner))
    p.data = saved
    out["sync_untouched"] = engine.last_sync is last
    out["diff_after_bad"] = engine_vs_learner()
    out["bad_name_tensor"] = name.replace("up_proj", "upp_proj")

    # 5. checkpoint: HF folder (sharded) + learner state; a rebuilt learner repeats the next update
    ck = os.path.join(args.workdir, "ckpt")
    t0 = time.perf_counter()
    learner.save_hf(os.path.join(ck, "hf"), bucket_bytes=spec["bucket_bytes"])
    learner.save_state(os.path.join(ck, "state"), is_writer=rank == 0)
    t["checkpoint"] = time.perf_counter() - t0
    weights = dict(learner.export_hf_weights())  # collective over the TP group
    out["weights_at_save"] = weights if rank == 0 else None
    at_save = local_params(learner)
    learner.update(batch, seed=spec["seed"] + 1)
    after = local_params(learner)
    again = build_learner(spec, os.path.join(ck, "hf"), local_batches=True)
    again.load_state(os.path.join(ck, "state"))
    again.update(batch, seed=spec["seed"] + 1)
    out["resume_max_diff"] = max(float((after[k] - v.detach()).abs().max())
                                 for k, v in again.model.named_parameters())
    out["resume_steps"] = (learner.steps, again.steps)
    out["moved_by_update"] = max(float((after[k] - v).abs().max()) for k, v in at_save.items())

    # 6. non-finite loss: NaN rewards in the last DP group only; every rank raises, weights unchanged
    from pacs_fast.learner.base import NonFiniteError

    bad = make_batch(prompts, comps, rewards.clone(), G)
    bad.old_logp = bad.ref_logp = batch.old_logp
    if lay.dp_rank == lay.dp_size - 1:
        bad.rewards[0] = float("nan")
    before = local_params(again)
    out["nonfinite"] = expect_error(lambda: again.update(bad, seed=0), NonFiniteError)
    out["nonfinite_unchanged"] = all(torch.equal(before[k], v) for k, v in again.model.named_parameters())

    # 7. DP-local update == full-batch update on the union (one mini-batch = the whole batch)
    if args.equivalence:
        full = spec["full_batch"]
        from pacs_fast.learner.base import RolloutBatch

        fb = RolloutBatch(**full)
        a = build_learner(spec, spec["model"])
        fb.old_logp = fb.ref_logp = a.compute_logprobs(fb)
        ma = a.update(fb, seed=3)
        b = build_learner(spec, spec["model"], local_batches=True)
        k = fb.num_groups // lay.dp_size
        lb = fb.groups(range(lay.dp_rank * k, (lay.dp_rank + 1) * k))
        mb = b.update(lb, seed=3)
        out["equiv_weights"] = max(float((pa - pb).abs().max()) for pa, pb in
                                   zip(a.model.parameters(), b.model.parameters()))
        out["equiv_moved"] = max(float((pa.detach() - v.detach()).abs().max()) for pa, v in
                                 zip(a.model.parameters(), build_learner(spec, spec["model"]).model.parameters()))
        out["equiv_metrics"] = (ma, mb)
        mine = b.compute_logprobs(lb)
        ref = a.compute_logprobs(fb)[lay.dp_rank * k * fb.group_size:(lay.dp_rank + 1) * k * fb.group_size]
        out["equiv_logp"] = float((mine - ref[:, :mine.shape[1]]).abs().max())
    out["seconds"] = t
    torch.save(out, os.path.join(args.workdir, f"rank{rank}.pt"))
    dist.barrier()
    engine.close()


if __name__ == "__main__":
    main()
