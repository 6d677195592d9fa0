"""What a checkpoint of the torch learner holds, and its policy's weights under Hugging Face names.

:class:`TorchCheckpointing` is a part of :class:`~pacs_fast.learner.torch_learner.TorchLearner` (a mixin): its
``state_dict`` / ``load_state_dict`` (optimiser, held reference model or LoRA reference adapters, value head, fp32
master weights, LoRA adapters and the digest of their frozen base) and ``save_hf`` / ``export_hf_weights`` /
``load_hf_weights`` (the policy, with LoRA its adapters merged). It reads the learner's ``model``, ``optimizer``,
``ref_model``, ``ref_adapters``, ``value_head``, ``master``, ``lora``, ``hf_config``, ``_base_digest`` and
``_loaded_merged`` (set in ``TorchLearner.__init__``).
"""
from __future__ import annotations

from typing import Iterable, Iterator

import torch

from pacs_fast.learner.base import CheckpointMismatch
from pacs_fast.learner.fused_checkpoint import FusedLayout
from pacs_fast.learner.hf_folder import RenamedWeights, weights_and_shapes
from pacs_fast.learner.lora import (adapter_state, base_digest, check_same_merge, checked_merged, copy_adapters,
                                   iter_merged_weights, load_adapter_state, save_adapter)
from pacs_fast.learner.master_weights import loading_weights


class TorchCheckpointing:
    """The checkpoint and Hugging Face weights of a :class:`~pacs_fast.learner.torch_learner.TorchLearner`."""

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "ref_model": self.ref_model.state_dict() if self.ref_model is not None else None,
            "value_head": self.value_head.state_dict() if self.value_head is not None else None,
            "master_weights": self.master.state_dict() if self.master is not None else None,
            "lora": adapter_state(self.model) if self.lora else None,
            "lora_base": self._lora_base() if self.lora else None,
            "ref_adapters": ({n: t.detach().cpu().clone() for n, t in self.ref_adapters.items()}
                             if self.ref_adapters is not None else None),
        }

    def load_state_dict(self, state: dict) -> None:
        if self.lora:  # the adapters on model.path's base: their merge must give the checkpoint's weights
            if state.get("lora") is None:
                raise ValueError("load_state_dict: the checkpoint has no LoRA adapters but this run trains some "
                                 "(model.lora_rank)")
            load_adapter_state(self.model, state["lora"])
            if state.get("lora_base") not in (None, self._lora_base()):  # (checkpoints before it: the merge below)
                raise CheckpointMismatch("model.path's weights are not the base the checkpoint's LoRA adapters were "
                                         "trained on (their digest differs): give model.path the base model the run "
                                         "started from (a checkpoint holds merged weights: as the base, the adapters "
                                         "would apply twice)")
            if self._loaded_merged is not None:
                check_same_merge(self.model, self._loaded_merged)
                self._loaded_merged = None
        elif state.get("lora") is not None:
            raise ValueError("load_state_dict: the checkpoint trained LoRA adapters (model.lora_rank) but this run "
                             "trains the whole model")
        self.optimizer.load_state_dict(state["optimizer"])
        if self.ref_model is not None:
            if state.get("ref_model") is None:
                raise ValueError("load_state_dict: the checkpoint has no reference model but this run needs one")
            self.ref_model.load_state_dict(state["ref_model"])
        if self.ref_adapters is not None:
            if state.get("ref_adapters") is None:
                raise ValueError("load_state_dict: the checkpoint has no reference adapters but this run needs them "
                                 "(a fixed reference under model.lora_rank)")
            copy_adapters(self.ref_adapters, state["ref_adapters"])
        if self.value_head is not None:
            if state.get("value_head") is None:
                raise ValueError("load_state_dict: the checkpoint has no value head but this run needs one")
            self.value_head.load_state_dict(state["value_head"])
        if self.master is not None:  # (a checkpoint without them: the model's weights, loaded before this)
            self.master.load_state_dict(state.get("master_weights"))

    def _lora_base(self) -> str:
        """:func:`~pacs_fast.learner.lora.base_digest` of the model's frozen base, once (it never changes)."""
        if self._base_digest is None:
            self._base_digest = base_digest(self.model)
        return self._base_digest

    def save_hf(self, path, *, bucket_bytes: int | None = None) -> None:
        """The merged policy as a Hugging Face folder (:meth:`Learner.save_hf`); with LoRA, its adapters too, as a
        PEFT adapter folder in ``path/adapter`` (on the base the run loaded)."""
        super().save_hf(path, bucket_bytes=bucket_bytes)
        if self.lora:
            from pathlib import Path

            save_adapter(self.model, Path(path) / "adapter", base=getattr(self.hf_config, "_name_or_path", None))

    def carry_from(self, source) -> None:
        """Sets :attr:`~pacs_fast.learner.base.Learner.carried`: the tensors of model folder ``source`` (the one the
        model was loaded from) that transformers did not load into it (:mod:`pacs_fast.learner.carried_tensors`:
        multi-token-prediction layers), which every :meth:`save_hf` copies and a checkpoint's load skips."""
        from pacs_fast.data.checkpoint_names import unit_of
        from pacs_fast.learner.carried_tensors import CarriedTensors, unloaded_pattern

        units = {unit_of(name) for name, _ in self._hf_tensors(merge=False)}
        self.carried = CarriedTensors(source, unloaded_pattern(self.model), units)

    def export_hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy under Hugging Face names (with LoRA: each adapted layer merged, ``W + scale * B @ A``)."""
        yield from self._hf_tensors(merge=True)

    def hf_weight_layout(self) -> Iterator[tuple[str, tuple[int, ...], torch.dtype]]:
        """:meth:`Learner.hf_weight_layout`: with LoRA no layer is merged for it (a save's shard count merged every
        adapted layer once more than its writing did)."""
        for name, t in self._hf_tensors(merge=False):
            yield name, tuple(t.shape), t.dtype

    def _hf_tensors(self, merge: bool) -> Iterator[tuple[str, torch.Tensor]]:
        """:meth:`export_hf_weights`; ``merge=False``: with LoRA each adapted weight a ``meta`` tensor of its merge's
        shape and dtype (:func:`~pacs_fast.learner.lora.iter_merged_weights`), the same names in the same order.
        Named as the model's checkpoint names them (:meth:`_checkpoint_names`: a multimodal wrapper's prefixes)."""
        names = self._checkpoint_names()
        for name, t in self._state_tensors(merge):
            yield names.get(name, name), t

    def _checkpoint_names(self) -> dict[str, str]:
        """``{the model's name: its checkpoint's}`` where transformers renamed tensors on load
        (:func:`~pacs_fast.causal_lm.checkpoint_names`: Gemma 3 4B+'s ``language_model.model.*``); found once. A
        checkpoint written under the model's names (transformers 4 could not read its vision tower; vLLM's sync
        refused them) is what these had been."""
        if getattr(self, "_ckpt_names", None) is None:
            from pacs_fast.causal_lm import checkpoint_names

            self._ckpt_names = checkpoint_names(self.model, self._state_tensors(merge=False))
        return self._ckpt_names

    def _fused_layout(self) -> FusedLayout | None:
        """The model's :class:`~pacs_fast.learner.fused_checkpoint.FusedLayout` (a mixture of experts whose experts
        transformers 5 fuses on load: its checkpoints are written and read in the hub's per-expert layout); None for
        the many models loaded as they are. Found once."""
        if not hasattr(self, "_layout"):
            self._layout = FusedLayout.of(self.model, self._state_tensors(merge=False))
        return self._layout

    def _checkpoint_layout(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """:meth:`Learner._checkpoint_layout`: a fused mixture of experts' bucket under the hub's names."""
        layout = self._fused_layout()
        return tensors if layout is None else layout.to_checkpoint(tensors)

    def _state_tensors(self, merge: bool) -> Iterator[tuple[str, torch.Tensor]]:
        """:meth:`_hf_tensors` under the model's own (state-dict) names."""
        from pacs_fast.causal_lm import lm_head

        # the model's own tying, not its config's: transformers 5's Mistral3Config says tied where config.json is
        # silent, and from_pretrained unties the head the hub's file holds (the trained head had been left out)
        embed = self.model.get_input_embeddings()
        tied = embed is not None and lm_head(self.model).weight.data_ptr() == embed.weight.data_ptr()
        seen: set[int] = set()
        own = {t.data_ptr() for t in self.model.state_dict().values()}
        state = iter_merged_weights(self.model, merge=merge) if self.lora else self.model.state_dict().items()
        for name, t in state:  # (with LoRA each merge made as it is asked for: a streaming consumer holds one)
            if tied and name == "lm_head.weight":
                continue
            ptr = None if t.is_meta else t.data_ptr()  # (a merge's stand-in: not the model's, as the merge is not)
            if ptr in seen and name.endswith("lm_head.weight"):
                continue
            if ptr in own:  # (a merge's storage is freed once used: a later one may reuse its address)
                seen.add(ptr)
            yield name, t.detach()

    def load_hf_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Loads Hugging Face weights into the policy: every name and shape checked first (nothing copied when one is
        wrong), then a tensor at a time; a checkpoint's :class:`~pacs_fast.learner.hf_folder.LazyHFCheckpoint` (its
        ``items()``, a resume's) is checked from its headers and read a tensor at a time, so host memory holds one
        tensor, not the model. With LoRA the base stays model.path's (frozen) and the weights are a checkpoint's
        merged ones: kept (a lazy checkpoint unread), and compared with the merge of the adapters
        :meth:`load_state_dict` loads next (a base that changed since is an error there)."""
        if self.carried is not None:  # (a checkpoint's copies of the input's tensors the model does not hold)
            from pacs_fast.learner.carried_tensors import WithoutCarried

            named_tensors = WithoutCarried(named_tensors, self.carried)
        layout = self._fused_layout()
        if layout is not None:  # (the hub's per-expert tensors, or the fused ones of a checkpoint written before)
            named_tensors = layout.model_weights(*weights_and_shapes(named_tensors))
        to_model = {v: k for k, v in self._checkpoint_names().items()}  # (a checkpoint's names: the model's, or these)
        if self.lora:
            if to_model:  # (renamed lazily: the merge check reads a tensor at a time)
                weights, shapes = weights_and_shapes(named_tensors)
                named_tensors = RenamedWeights(weights, to_model, shapes)
            self._loaded_merged = checked_merged(self.model, named_tensors)
            return
        state = self.model.state_dict()
        weights, shapes = weights_and_shapes(named_tensors)
        if to_model:
            weights, shapes = RenamedWeights(weights, to_model), {to_model.get(n, n): s for n, s in shapes.items()}
        bad = [n for n, shape in shapes.items() if n not in state or tuple(state[n].shape) != shape]
        if bad:
            raise ValueError(f"load_hf_weights: unknown names or wrong shapes: {bad[:5]}")
        # every tensor of the policy given (a tied head: by its embedding's storage), as the megatron learner asks: one
        # left out had kept model.path's value without a word (a checkpoint's weights are the whole policy)
        given = {state[n].data_ptr() for n in shapes if state[n].numel()}
        missing = [n for n, t in state.items() if t.numel() and t.data_ptr() not in given]
        if missing:
            raise ValueError(f"load_hf_weights: {len(missing)} of the policy's tensors are not in the weights given "
                             f"(they would keep model.path's values): {missing[:5]}")
        with loading_weights(self.master), torch.no_grad():  # fp32 tensors keep their digits in the masters
            state = self.model.state_dict()  # (with masters: theirs; the model takes them rounded on exit)
            for name in shapes:  # (each read as it is copied, then dropped)
                t = weights[name]
                state[name].copy_(t.to(device=state[name].device, dtype=state[name].dtype))
