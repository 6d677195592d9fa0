"""Learners: the policy's optimiser side.

- :class:`Learner` / :class:`RolloutBatch` (:mod:`.base`): the interface the trainer uses and the
  batch it passes; :func:`objective` (:mod:`.objective`) is the loss every learner shares.
- :class:`TorchLearner` (:mod:`.torch_learner`): PyTorch, one process.
- the Megatron-core tensor-parallel learner (:mod:`.megatron`), selected with ``learner.backend=megatron``.
"""
from pacs_fast.learner.base import Learner, RolloutBatch
from pacs_fast.learner.objective import minibatch_counts, objective
from pacs_fast.learner.torch_learner import TorchLearner

__all__ = ["Learner", "RolloutBatch", "TorchLearner", "minibatch_counts", "objective"]
