"""Train a policy with PACS (or a baseline) on a verifiable task.

    python -m pacs_fast.train                                   # built-in task, tiny model, CPU, < 10 min
    python -m pacs_fast.train --config my.yaml algo.beta=0.5    # YAML file + dotted overrides
    python -m pacs_fast.train algo.name=grpo rollout.n=16
    python -m pacs_fast.train data.dataset=train.jsonl model.path=/models/Qwen2.5-0.5B
    python -m pacs_fast.train --resume runs/pacs-20260101-120000   # continue a run exactly
    python -m pacs_fast.train --help                            # every key with its default
    torchrun --nproc_per_node 2 -m pacs_fast.train learner.backend=megatron learner.tp_size=2
                                                  # megatron-core learner, tensor parallel over 2 processes

With no arguments: a tiny Qwen2-architecture model with a character tokenizer is made, briefly
fine-tuned on small-integer arithmetic (cached), and trained with PACS to answer in
``\\boxed{}``; the held-out accuracy before and after is printed at the end. The run folder
(``runs/<name>``) gets ``config.yaml``, ``metrics.jsonl``, TensorBoard events (``tb/``),
checkpoints (``checkpoints/step_*``, Hugging Face format) and plots (``plots/*.png``).

Under ``torchrun`` (``learner.backend=megatron``; processes = ``learner.tp_size`` x data-parallel
size) rank 0 alone generates rollouts, scores them, evaluates, prints and writes the run folder;
the other ranks receive each step's batch from it and take part in the learner's collectives.
``--resume`` works the same way under ``torchrun``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pacs_fast.config import help_text, load_config, validate


def parse_args(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(
        prog="python -m pacs_fast.train", add_help=False,
        description="PACS / GRPO / PPO / RLOO / Dr.GRPO training with verifiable rewards.",
        epilog="Overrides: section.key=value (values parsed as YAML).")
    parser.add_argument("--config", default=None, help="YAML file with config sections")
    parser.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue the run in RUN_DIR")
    parser.add_argument("-h", "--help", action="store_true", help="list every config key and exit")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_args(argv)
    if args.help:
        print(parser.format_help())
        print("Config keys (section.key, type, default):\n")
        print(help_text())
        sys.exit(0)
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    try:
        if args.resume:
            # The run's own config, then any overrides given now (e.g. train.steps=200 to extend it).
            run_dir = Path(args.resume)
            saved = run_dir / "config.yaml"
            if not saved.is_file():
                raise ValueError(f"--resume {run_dir}: no config.yaml there (is it a run folder?)")
            if args.config:
                raise ValueError("--resume uses the run's own config.yaml; drop --config")
            cfg = load_config(saved, args.overrides)
        else:
            cfg = load_config(args.config, args.overrides)
            name = cfg.train.run_name or f"{cfg.algo.name}-{time.strftime('%Y%m%d-%H%M%S')}"
            run_dir = Path(cfg.train.out_dir) / name
        validate(cfg)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)

    from pacs_fast.trainer.loop import SetupError, train  # heavy imports only after the config is known good
    try:
        return train(cfg, run_dir, resume=bool(args.resume))
    except SetupError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
