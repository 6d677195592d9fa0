"""Data: math problem sets (shipped benchmarks, user JSONL / parquet), prompts, the tiny model.

Submodules: ``datasets`` (:func:`load_benchmark`, :func:`load_dataset`, :class:`Problem`; the files of a folder
or glob of shards: :mod:`pacs_fast.config.dataset_files`),
``prompts`` (:func:`build_prompt`, :func:`encode_prompts`, the paper's system prompt and
instruction), ``tiny`` (a tiny Qwen2 model + char tokenizer) and ``arithmetic`` (the built-in task).
"""
from pacs_fast.data.datasets import (BENCHMARK_SIZES, BENCHMARKS, TRAIN_SETS, Problem, available_datasets,
                                     load_benchmark, load_dataset, shipped_path)
from pacs_fast.data.prompts import (INSTRUCTION, SYSTEM_PROMPT, build_messages, build_prompt, encode_prompts,
                                    has_chat_template)

__all__ = ["BENCHMARKS", "BENCHMARK_SIZES", "INSTRUCTION", "Problem", "SYSTEM_PROMPT", "TRAIN_SETS",
           "available_datasets", "build_messages", "build_prompt", "encode_prompts", "has_chat_template",
           "load_benchmark", "load_dataset", "shipped_path"]
