"""Run configuration: nested dataclasses, a YAML file and dotted command-line overrides.

    cfg = load_config("my.yaml", ["algo.beta=0.5", "train.steps=200"])

Every field has a default and a one-line help text (``python -m pacs_fast.train --help`` lists
them all). Values given on the command line are parsed as YAML scalars (``true``, ``1e-5``, ``[0.9,
0.99]``) and checked against the field's type. Unknown keys raise a ValueError naming the key (with
the closest valid names); :func:`validate` rejects impossible settings before any work starts.
This package imports nothing from the rest of pacs_fast, so every layer may use it.

- :mod:`~pacs_fast.config.schema`: the sections (dataclasses), their defaults and help texts;
- :mod:`~pacs_fast.config.loading`: dict / YAML / override parsing, saving, ``--help``;
- :mod:`~pacs_fast.config.validation`: :func:`validate` and the derived settings it checks;
- :mod:`~pacs_fast.config.launch_checks`: the checks that depend on the launch's processes (:func:`world_size`);
- :mod:`~pacs_fast.config.unused`: :func:`unused_settings`, the chosen values a run never reads (warnings);
- :mod:`~pacs_fast.config.hazards`: :func:`hazard_warnings`, settings that run but train badly (warnings).
"""
from pacs_fast.config.loading import (all_keys, from_dict, help_text, load_config, parse_override, read_yaml,
                                      save_config, set_value, to_dict)
from pacs_fast.config.schema import (ALGORITHMS, AlgoConfig, Config, CorrectionConfig, DataConfig, LearnerConfig,
                                     ModelConfig, RewardConfig, RolloutConfig, TrainConfig, WarmupConfig)
from pacs_fast.config.launch_checks import world_size
from pacs_fast.config.validation import ATTENTIONS, SHIPPED_DATASETS, is_level, validate
from pacs_fast.config.hazards import hazard_warnings
from pacs_fast.config.unused import unused_settings

__all__ = [
    "ALGORITHMS", "ATTENTIONS", "SHIPPED_DATASETS",
    "AlgoConfig", "Config", "CorrectionConfig", "DataConfig", "LearnerConfig", "ModelConfig", "RewardConfig",
    "RolloutConfig", "TrainConfig", "WarmupConfig",
    "all_keys", "from_dict", "hazard_warnings", "help_text", "is_level", "load_config", "parse_override",
    "read_yaml", "save_config", "set_value", "to_dict", "unused_settings", "validate", "world_size",
]
