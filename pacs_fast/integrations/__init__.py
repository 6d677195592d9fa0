"""PACS inside other RL frameworks: one small adapter module per framework.

- ``pacs_fast.integrations.trl``: ``PACSTrainer`` / ``PACSConfig``, drop-in for TRL's
  ``GRPOTrainer`` / ``GRPOConfig`` (tested with trl 1.16.0).
- ``pacs_fast.integrations.verl``: the advantage estimator ``"pacs"`` and the policy loss
  ``"pacs"`` in verl's registries, plus ``check_config`` for the settings that keep groups whole
  (tested with verl 0.9.1).
- ``pacs_fast.integrations.openrlhf``: ``PACSPolicyLoss``, a drop-in for OpenRLHF's
  ``PolicyLoss`` (interface of openrlhf 0.11.2), with ``pacs_advantages`` and ``check_args``.

Each module imports its framework only when it is imported itself (``import pacs_fast`` never
does). Usage, versions and limits: docs/INTEGRATIONS.md.
"""
