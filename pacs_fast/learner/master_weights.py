"""fp32 master weights for a bf16 / fp16 model (``learner.master_weights``).

Without them a bf16 model's AdamW keeps its moments in bf16 and adds each update to a bf16 weight, where an
update under half a bf16 step (2^-9 of the weight) rounds away: at lr 1e-6, 98% of weights ~ N(0, 0.02) are
unchanged after 10 steps. And the gradients of successive micro-batches add up in bf16 (2e-2 relative off after
256 of them, against 2e-3 for one rounding).

Here each trainable low-precision parameter gets an fp32 master copy. A hook after each parameter's gradient is
accumulated (``register_post_accumulate_grad_hook``) adds that bf16 gradient into the master's fp32 gradient and
frees it, so micro-batches accumulate in fp32 and no bf16 gradient outlives its backward step; clipping, the
gradient norm and AdamW run on the masters (moments in fp32); after each step the model's weights are the masters
rounded once (:meth:`MasterWeights.copy_to_model`). Memory per parameter: 2 (bf16 weight) + 4 (master) + 4 (fp32
gradient) + 8 (moments) = 18 bytes, against 8 in pure bf16 (pacs_fast/trainer/memory_model.py). fp32 parameters
are their own masters (no copy, no hook). As Megatron's and DeepSpeed's mixed-precision optimisers do. Both
learners use it; with a sharded optimiser (``learner.distributed_optimizer``) every data-parallel rank keeps all
masters of its tensor-parallel shard (the moments are what is sharded).
"""
from __future__ import annotations

import contextlib

import weakref

import torch

LOW_PRECISION = (torch.bfloat16, torch.float16)
# id(parameter) -> (a weak reference to it, its current gradient hook), removed when another learner takes the
# parameter; not in the parameter's __dict__, which a deep copy of the model would carry over to the copy's
_HOOKS: dict[int, tuple] = {}


def _current_hook(p):
    entry = _HOOKS.get(id(p))
    return entry[1] if entry is not None and entry[0]() is p else None


class MasterWeights:
    """fp32 masters of ``params`` (a list of the model's trainable parameters). :attr:`masters` is the list to
    give the optimiser (a low-precision parameter's master, or the fp32 parameter itself)."""

    def __init__(self, params: list[torch.nn.Parameter]):
        self.params = list(params)
        self.masters: list[torch.nn.Parameter] = []
        self._hooks = []
        for p in self.params:
            if p.dtype in LOW_PRECISION:
                m = torch.nn.Parameter(p.detach().to(torch.float32, copy=True))
                # the parameter's own attributes (megatron's tensor_model_parallel, partition_dim, ...): code that
                # reads them from the optimiser's parameters (the TP gradient norm) sees the same on the master
                m.__dict__.update({k: v for k, v in p.__dict__.items() if not k.startswith("_")})
                # the newest learner on a model owns its gradients: an earlier one's hook would take them first
                earlier = _current_hook(p)
                if earlier is not None:
                    earlier.remove()
                handle = p.register_post_accumulate_grad_hook(self._mover(m))
                _HOOKS[id(p)] = (weakref.ref(p, lambda _, key=id(p): _HOOKS.pop(key, None)), handle)
                self._hooks.append(handle)
                self.masters.append(m)
            else:
                self.masters.append(p)

    def _separate(self) -> list[tuple[torch.nn.Parameter, torch.nn.Parameter]]:
        """``(parameter, master)`` of the low-precision parameters (the others are their own masters)."""
        return [(p, m) for p, m in zip(self.params, self.masters) if m is not p]

    @property
    def active(self) -> bool:
        """Whether any parameter has a separate master (a low-precision model)."""
        return bool(self._separate())

    @staticmethod
    def _mover(master):
        def move(p):  # after autograd accumulated p.grad for this backward: into fp32, then freed
            g = p.grad
            if g is None:
                return
            if master.grad is None:
                master.grad = g.to(torch.float32)
            else:
                master.grad.add_(g)  # (fp32 += bf16: computed in fp32)
            p.grad = None
        return move

    @torch.no_grad()
    def copy_to_model(self) -> None:
        """The model's low-precision weights := their masters, rounded once (after each optimiser step)."""
        for p, m in self._separate():
            p.copy_(m)

    @torch.no_grad()
    def copy_from_model(self) -> None:
        """Masters := the model's weights (after they were loaded from elsewhere: a checkpoint without masters,
        an HF state dict)."""
        for p, m in self._separate():
            m.copy_(p)

    @contextlib.contextmanager
    def masters_as_params(self):
        """Inside, each low-precision parameter's data is its fp32 master's, so that a load into the model (a
        checkpoint's weights) writes them at their full precision into the masters; on exit the model takes
        the masters rounded. (A bf16 checkpoint loads the same either way; an fp32 tensor keeps its digits.)"""
        pairs = self._separate()
        own = [p.data for p, _ in pairs]
        for p, m in pairs:
            p.data = m.data
        try:
            yield
        finally:
            for (p, _), data in zip(pairs, own):
                p.data = data
            self.copy_to_model()

    def state_dict(self) -> list[torch.Tensor] | None:
        """The separate masters (None when there are none), for an exact resume."""
        pairs = self._separate()  # (copied to the CPU: a save needs no second device copy of the masters)
        return [m.detach().to("cpu", copy=True) for _, m in pairs] if pairs else None

    @torch.no_grad()
    def load_state_dict(self, state: list[torch.Tensor] | None) -> None:
        """Restores :meth:`state_dict`'s masters; None (a checkpoint without them) takes the model's weights."""
        mine = [m for _, m in self._separate()]
        if state is None:
            self.copy_from_model()
            return
        if len(state) != len(mine) or any(tuple(s.shape) != tuple(m.shape) for s, m in zip(state, mine)):
            raise ValueError(f"load_state_dict: the checkpoint's master weights ({len(state)} tensors) do not "
                             f"match this model's ({len(mine)})")
        for m, s in zip(mine, state):
            m.copy_(s)

    def remove(self) -> None:
        """Removes the gradient hooks (the parameters then keep their own gradients again)."""
        for (p, _), h in zip(self._separate(), self._hooks):
            h.remove()
            if _current_hook(p) is h:
                del _HOOKS[id(p)]
        self._hooks = []


def loading_weights(master: MasterWeights | None):
    """The context a learner loads a checkpoint's weights in: :meth:`MasterWeights.masters_as_params` of
    ``master`` (fp32 tensors keep their digits in the masters), nothing without masters."""
    return master.masters_as_params() if master is not None else contextlib.nullcontext()
