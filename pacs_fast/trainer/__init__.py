"""The trainer behind ``python -m pacs_fast.train``: the loop (:mod:`.loop`), batch building
(:mod:`.batch`), data order (:mod:`.sampler`), metrics (:mod:`.metrics`), checkpoints
(:mod:`.checkpoint`), plots (:mod:`.plots`) and the default model's warm-up (:mod:`.warmup`)."""
from pacs_fast.trainer.loop import train

__all__ = ["train"]
