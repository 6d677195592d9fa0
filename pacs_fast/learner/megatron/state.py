"""Checkpoint state of :class:`~pacs_fast.learner.megatron.learner.MegatronLearner` (everything but
the policy weights, which travel as a Hugging Face folder through ``save_hf``).

Two formats:

- **Per-rank shard files** (:func:`save_state` / :func:`load_state`, the trainer's path). Each rank
  of data-parallel group 0 writes ``learner_tp{t}_dp0.pt``: its local AdamW state (megatron names,
  its own shards), its reference-model shard and the counters. Nothing is gathered, so the extra
  memory is one serialised copy of the rank's own optimiser state (no full-model tensor anywhere).
  Data-parallel replicas hold identical state, so only DP group 0 writes; on load every rank reads
  its TP rank's file (a bf16 model's fp32 master weights travel in it too, this rank's shards). A sharded
  optimiser (``learner.distributed_optimizer``) is first consolidated on DP rank 0 in the same format, so
  checkpoints do not depend on that setting. Resume is exact under the same ``tp_size`` (any data-parallel
  size); another ``tp_size`` is refused with a clear error (convert through :func:`full_state_dict`). With
  several nodes the folder must be visible to every node on resume (a shared filesystem); when TP
  groups sit inside one node, DP group 0's files are all written by the node of global rank 0.
  The writer (``is_writer``) adds ``learner_state.json`` (format, tp size, file names).
- **Full HF-named state** (:func:`full_state_dict` / :func:`load_full_state_dict`): the optimiser
  moments and reference model gathered to full tensors on every rank; resumes under any
  ``tp_size`` but costs a full-model copy (times three) per rank.

Every file is written atomically (tmp + ``os.replace``); errors are decided collectively (every rank
raises, none waits in a barrier).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from pacs_fast.collective import collective_check
from pacs_fast.files import write_atomic
from pacs_fast.learner.base import maps_state_files, unmap_optimizer_state

FORMAT = "pacs_fast.megatron.shards/1"
META = "learner_state.json"


def shard_file(tp_rank: int) -> str:
    return f"learner_tp{tp_rank}_dp0.pt"


def _names(learner) -> list[str]:
    return [n for n, p in learner.model.named_parameters() if p.requires_grad]


def save_state(learner, folder, *, is_writer: bool) -> None:
    """Collective: DP group 0 writes one shard file per TP rank, the writer the metadata."""
    from pacs_fast.learner.megatron.optimizer import full_state_dict_on_dp0

    folder = Path(folder)
    error = None
    optimizer = full_state_dict_on_dp0(learner.optimizer, learner.dp_rank)  # collective when sharded
    try:
        if learner.dp_rank == 0:
            folder.mkdir(parents=True, exist_ok=True)
            # megatron's state dicts hold ``_extra_state`` entries that are None (no Transformer Engine)
            ref = ({k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in learner.ref_model.state_dict().items()}
                   if learner.ref_model is not None else None)
            state = {"format": FORMAT, "tp_size": learner.tp_size, "tp_rank": learner.tp_rank,
                     "param_names": _names(learner), "optimizer": optimizer,
                     "master_weights": learner.master.state_dict() if learner.master is not None else None,
                     "ref_model": ref, "steps": learner.steps, "value_head": _value_head_weights(learner)}
            write_atomic(folder / shard_file(learner.tp_rank), lambda tmp: torch.save(state, tmp))
        if is_writer:
            folder.mkdir(parents=True, exist_ok=True)
            meta = {"format": FORMAT, "backend": "megatron", "tp_size": learner.tp_size,
                    "files": [shard_file(t) for t in range(learner.tp_size)]}
            tmp = folder / f".{META}.tmp-{os.getpid()}"
            tmp.write_text(json.dumps(meta, indent=2))
            os.replace(tmp, folder / META)
    except Exception as e:  # noqa: BLE001 - OSError, and torch's zip writer's RuntimeError on a full disk
        # ("unexpected pos"): a rank that raised alone left the others waiting in this check (a 2-rank run hung)
        error = f"save_state: writing {folder}: {getattr(e, 'strerror', None) or e} ({type(e).__name__})"
    collective_check(error)
    if dist.get_world_size() > 1:
        dist.barrier()


def load_state(learner, folder) -> None:
    """Collective inverse of :func:`save_state` (same ``tp_size``; any data-parallel size)."""
    folder = Path(folder)
    error, state = None, None
    path = folder / shard_file(learner.tp_rank)
    mapped = maps_state_files(learner.device)
    try:
        meta = json.loads((folder / META).read_text())
        if meta.get("format") != FORMAT:
            raise ValueError(f"{folder / META}: format {meta.get('format')!r}, expected {FORMAT!r}")
        if meta["tp_size"] != learner.tp_size:
            raise ValueError(f"{folder}: saved with learner.tp_size={meta['tp_size']}, this run has "
                             f"{learner.tp_size}; resume with the same tensor-parallel size")
        state = torch.load(path, map_location="cpu", mmap=mapped, weights_only=False)
        if state.get("format") != FORMAT or state.get("tp_rank") != learner.tp_rank:
            raise ValueError(f"{path}: not this rank's learner shard")
        if state["param_names"] != _names(learner):
            raise ValueError(f"{path}: parameter names differ from this model's")
        if learner.ref_model is not None and state["ref_model"] is None:
            raise ValueError(f"{path}: the checkpoint has no reference model but this run needs one")
        if learner.value_head is not None and state.get("value_head") is None:
            raise ValueError(f"{path}: the checkpoint has no value head but this run (algo.name=ppo) needs one")
    except (OSError, ValueError, KeyError, RuntimeError, json.JSONDecodeError) as e:
        error = f"load_state: {e}" if isinstance(e, ValueError) else f"load_state: {path}: {type(e).__name__}: {e}"
    collective_check(error)
    learner.optimizer = learner._make_optimizer()
    learner.optimizer.load_state_dict(state["optimizer"])
    if mapped:  # (a CPU learner read the file whole: its state is its own already)
        unmap_optimizer_state(learner.optimizer)
    if learner.master is not None:  # (a checkpoint without masters: the model's weights, loaded before this)
        learner.master.load_state_dict(_with_norm_masters(learner, state.get("master_weights")))
    if learner.ref_model is not None:
        learner.ref_model.load_state_dict(state["ref_model"])
    _load_value_head(learner, state.get("value_head"))
    learner.steps = int(state["steps"])


def _value_head_weights(learner) -> dict | None:
    """PPO's value head as ``{name: CPU tensor}`` (:data:`~.value_head.NAMES`), or None without one."""
    from pacs_fast.learner.megatron.value_head import NAMES

    if learner.value_head is None:
        return None
    return {n: p.detach().cpu().clone() for n, p in zip(NAMES, learner.value_params)}


def _load_value_head(learner, weights: dict | None) -> None:
    from pacs_fast.learner.megatron.value_head import NAMES

    if learner.value_head is not None:
        with torch.no_grad():
            for n, p in zip(NAMES, learner.value_params):
                p.copy_(weights[n].to(p.device, p.dtype))


def _with_norm_masters(learner, masters):
    """A shard's masters with those of the norms added where it has none: checkpoints written before the norms
    were built in the model's dtype (2026-11-29, :func:`pacs_fast.learner.megatron.model.in_params_dtype`) kept
    fp32 norms, which needed no master; their fp32 values came with the checkpoint's weights, which
    :meth:`~pacs_fast.learner.megatron.learner.MegatronLearner.load_hf_weights` loaded into the masters."""
    pairs = learner.master._separate()
    if masters is None or len(masters) >= len(pairs):
        return masters
    norms = {id(m.weight) for m in learner.model.modules() if isinstance(m, torch.nn.RMSNorm)}
    if len(masters) + sum(id(p) in norms for p, _ in pairs) != len(pairs):
        return masters  # (not that layout: load_state_dict names the mismatch)
    given = iter(masters)
    return [m.detach().cpu() if id(p) in norms else next(given) for p, m in pairs]


# ----------------------------------------------------------------------------- full HF-named state
def full_state_dict(learner) -> dict:
    """Optimiser moments and the reference model as full HF-named tensors (collective over TP;
    every rank gets the whole dict)."""
    from pacs_fast.learner.megatron.convert import gather_to_hf

    def gather(local):
        return {k: v.cpu().clone() for k, v in gather_to_hf(local, learner.hf_config,
                                                               tp_group=learner.tp_group).items()}

    from pacs_fast.learner.megatron.optimizer import param_states

    # the optimiser's parameters (fp32 masters of a bf16 model, else the parameters) by their model names
    names = {id(q): n for n, q in zip(_names(learner), learner.opt_params)}
    moments = {"exp_avg": {}, "exp_avg_sq": {}}
    step = None
    states = param_states(learner.optimizer, learner.opt_params, learner.dp_group)
    for p in learner.opt_params:
        st = states.get(id(p))
        if not st:
            continue
        step = float(st["step"])
        for key in moments:
            moments[key][names[id(p)]] = st[key]
    optim = None
    if step is not None:
        optim = {"step": step, **{k: gather(v) for k, v in moments.items()}}
    ref = gather(dict(learner.ref_model.named_parameters())) if learner.ref_model is not None else None
    masters = (gather({n: q.detach() for n, q in zip(_names(learner), learner.opt_params)})
               if learner.master is not None else None)
    value = None
    if learner.value_head is not None:  # (replicated: every rank's are the whole head's)
        from pacs_fast.learner.megatron.value_head import NAMES

        vs = param_states(learner.optimizer, learner.value_params, learner.dp_group)
        value = {"weights": _value_head_weights(learner),
                 **{k: {n: vs[id(p)][k].cpu().clone() for n, p in zip(NAMES, learner.value_params)} if vs else None
                    for k in ("exp_avg", "exp_avg_sq")}}
    return {"backend": "megatron", "optimizer": optim, "ref_model": ref, "master_weights": masters,
            "steps": learner.steps, "value_head": value}


def load_full_state_dict(learner, state: dict) -> None:
    from pacs_fast.learner.megatron.convert import hf_to_megatron, load_hf_into_model

    if state.get("backend") != "megatron":
        raise ValueError("state: not a megatron learner state (key 'backend' != 'megatron')")
    learner.steps = int(state["steps"])
    learner.optimizer = learner._make_optimizer()
    optim = state.get("optimizer")
    if optim is not None:
        shards = {k: hf_to_megatron(optim[k], learner.hf_config, tp_size=learner.tp_size, tp_rank=learner.tp_rank)
                  for k in ("exp_avg", "exp_avg_sq")}
        from pacs_fast.learner.megatron.optimizer import local_state, owns

        for name, p in zip(_names(learner), learner.opt_params):
            if not owns(learner.optimizer, p):  # a sharded optimiser keeps its own share
                continue
            local_state(learner.optimizer)[p] = {
                "step": torch.tensor(optim["step"], dtype=torch.float32),
                "exp_avg": shards["exp_avg"][name].to(p.device, p.dtype),
                "exp_avg_sq": shards["exp_avg_sq"][name].to(p.device, p.dtype),
            }
    if learner.master is not None:
        full = state.get("master_weights")  # None: a state without masters (they take the model's weights)
        if full is not None:
            shards = hf_to_megatron(full, learner.hf_config, tp_size=learner.tp_size, tp_rank=learner.tp_rank)
            full = [shards[n] for n, p, m in zip(_names(learner), learner.params, learner.opt_params) if m is not p]
        learner.master.load_state_dict(full)
    if learner.value_head is not None:
        value = state.get("value_head")
        if value is None:
            raise ValueError("load_state_dict: the checkpoint has no value head but this run (algo.name=ppo) needs one")
        _load_value_head(learner, value["weights"])
        from pacs_fast.learner.megatron.optimizer import local_state, owns
        from pacs_fast.learner.megatron.value_head import NAMES

        for n, p in zip(NAMES, learner.value_params):
            if optim is not None and value.get("exp_avg") is not None and owns(learner.optimizer, p):
                local_state(learner.optimizer)[p] = {"step": torch.tensor(optim["step"], dtype=torch.float32),
                                                     **{k: value[k][n].to(p.device, p.dtype)
                                                        for k in ("exp_avg", "exp_avg_sq")}}
    if learner.ref_model is not None:
        if state.get("ref_model") is None:
            raise ValueError("load_state_dict: the checkpoint has no reference model but this run needs one")
        load_hf_into_model(learner.ref_model, state["ref_model"], learner.hf_config, tp_size=learner.tp_size,
                           tp_rank=learner.tp_rank)
