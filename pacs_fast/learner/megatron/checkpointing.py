"""The megatron learner's weights and checkpoints (:class:`~pacs_fast.learner.megatron.learner.MegatronLearner`'s
mixin, as :mod:`pacs_fast.learner.torch_checkpoint` is the torch learner's): the policy as full Hugging Face tensors
(gathered inside the tensor-parallel group, a bucket of layers at a time: :mod:`.export`), loaded back into this
rank's shards (:func:`~pacs_fast.learner.megatron.convert.load_hf_into_model`), written as an HF folder, and the
optimiser / reference state per rank (:mod:`.state`).
"""
from __future__ import annotations

from typing import Iterable, Iterator

import torch
import torch.distributed as dist

from pacs_fast.collective import collective_check
from pacs_fast.learner.hf_folder import weights_and_shapes
from pacs_fast.learner.master_weights import loading_weights
from pacs_fast.learner.megatron import state as megatron_state
from pacs_fast.learner.megatron.convert import load_hf_into_model
from pacs_fast.learner.megatron.export import iter_hf_buckets, save_hf_folder, weight_manifest


class MegatronCheckpointing:
    """Weights and checkpoints of a megatron learner (``model``, ``hf_config``, ``tp_group`` / ``tp_size`` /
    ``tp_rank``, ``dp_rank``, ``master``, ``model_path``)."""

    def export_hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every HF tensor, full, on every rank (collective over TP; gathered eagerly, so a rank that
        does not consume the iterator cannot leave the others waiting). Costs a full-model copy per
        rank: the scale-out paths use :meth:`iter_hf_weight_buckets` / :meth:`save_hf` instead."""
        params = {p.untyped_storage().data_ptr() for p in self.model.parameters()}
        pairs = [(name, t.cpu().clone() if t.untyped_storage().data_ptr() in params else t.cpu())  # no aliasing
                 for bucket in self.iter_hf_weight_buckets(1 << 62) for name, t in bucket]
        return iter(pairs)

    def hf_weight_manifest(self) -> list[tuple[str, tuple[int, ...]]]:
        """``[(hf_name, full shape)]`` from the local shard shapes (no communication); a weight sync
        checks it against the engine before anything is gathered. ValueError on an impossible shard."""
        return weight_manifest(self.model, self.hf_config, tp_size=self.tp_size)

    def iter_hf_weight_buckets(self, bucket_bytes: int, *, dtype: torch.dtype | None = None
                               ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Buckets of whole layers as full HF tensors (cast to ``dtype`` before the gather), gathered
        inside this rank's TP group only; collective over the TP group (consume it to the end)."""
        return iter_hf_buckets(self.model, self.hf_config, tp_group=self.tp_group, tp_size=self.tp_size,
                               bucket_bytes=bucket_bytes, dtype=dtype)

    def load_hf_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Full HF tensors into this rank's shards, names and shapes checked first; a :class:`LazyHFCheckpoint`'s
        (a resume's) read a tensor at a time: each rank holds one full tensor in host memory, not the model."""
        state, shapes = weights_and_shapes(named_tensors)  # (a tied lm_head.weight: not asked for, never read)
        with loading_weights(self.master):  # fp32 tensors (a checkpoint's fp32 norms) keep their digits
            load_hf_into_model(self.model, state, self.hf_config, tp_size=self.tp_size, tp_rank=self.tp_rank,
                               shapes=shapes)

    def save_hf(self, path, *, bucket_bytes: int = 1 << 30) -> None:
        """Writes the policy as an HF folder; collective. Global rank 0 writes; only data-parallel
        group 0 gathers, to global rank 0 alone, one bucket of layers at a time (sharded safetensors
        + index when the model takes several buckets); ``generation_config.json`` is carried over."""
        error = None
        try:
            save_hf_folder(self.model, self.hf_config, path, tp_group=self.tp_group, tp_size=self.tp_size,
                           is_writer=dist.get_rank() == 0, participates=self.dp_rank == 0,
                           bucket_bytes=bucket_bytes, extra_files=(self.model_path / "generation_config.json",))
        except Exception as e:  # noqa: BLE001 - the writer's (a full disk): every rank raises it, none waits
            error = f"save_hf: writing {path}: {getattr(e, 'strerror', None) or e} ({type(e).__name__})"
        collective_check(error)
        if dist.get_world_size() > 1:
            dist.barrier()

    # ------------------------------------------------------------------ checkpoints
    def save_state(self, folder, *, is_writer: bool) -> None:
        """Collective: per-rank optimiser / reference shards (see :mod:`.state`); nothing gathered."""
        megatron_state.save_state(self, folder, is_writer=is_writer)

    def load_state(self, folder) -> None:
        """Collective inverse of :meth:`save_state` (same ``tp_size``)."""
        megatron_state.load_state(self, folder)

    def state_dict(self) -> dict:
        """Optimiser moments and the reference model as full HF-named tensors (collective; a full
        copy per rank; resumes under any ``tp_size``). The trainer uses :meth:`save_state`."""
        return megatron_state.full_state_dict(self)

    def load_state_dict(self, state: dict) -> None:
        megatron_state.load_full_state_dict(self, state)
