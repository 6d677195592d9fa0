"""The eval command's arguments (``python -m pacs_fast.eval --help``): the parser, with the paper's defaults, and
the types of ``--n`` and ``--k``. Their values are checked by :mod:`pacs_fast.evaluation.args`."""
from __future__ import annotations

import argparse

from pacs_fast.config import ATTENTIONS
from pacs_fast.data.datasets import BENCHMARKS
from pacs_fast.evaluation.args import ArgumentParser
from pacs_fast.reward.verifier import EXTRACTIONS

DEFAULT_BENCHMARKS = "math500,amc23,aime2024,aime2025"


def int_list(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not out or any(k < 1 for k in out):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return out


# samples per problem at most: a problem's n responses are one samples record (one JSON line, held in memory while
# written and read); --n 100000000000 ran out of memory after 20 GB with no message (the paper's largest n: 512)
MAX_N = 65536


def _n_spec(text: str) -> dict[str, int] | int:
    """``--n 8`` (every benchmark) or ``--n math500=32,amc23=64``; each N in ``1..MAX_N``."""
    try:
        if "=" not in text:
            values = n = int(text)
        else:
            n = {}
            for part in text.split(","):
                name, value = part.split("=")
                if name.strip() in n:  # (the last had silently counted)
                    raise argparse.ArgumentTypeError(f"--n names {name.strip()} twice, got {text!r}")
                n[name.strip()] = int(value)
            values = min(n.values()), max(n.values())
        if not all(1 <= v <= MAX_N for v in ([values] if isinstance(values, int) else values)):
            raise ValueError
        return n
    except ValueError:
        raise argparse.ArgumentTypeError(f"--n takes N or name=N,name=N (1 <= N <= {MAX_N:,}: a problem's samples are "
                                         f"one record), got {text!r}") from None


def run_parser() -> argparse.ArgumentParser:
    """The eval command's parser (``python -m pacs_fast.eval --help``)."""
    p = ArgumentParser(prog="python -m pacs_fast.eval",
                       description="pass@k evaluation on the shipped math benchmarks (or your own), resumable.",
                       epilog="Other commands: 'report --out DIR', 'compare A.json B.json --out plot.png'")
    p.add_argument("--model", required=True, help="Hugging Face model folder, or hub id org/name (cached, when "
                   "offline); a hub id's commit is recorded, and a resume on another one refused")
    p.add_argument("--revision", default=None, metavar="REV",
                   help="with a hub id --model: the commit, branch or tag to evaluate (default: the default branch's "
                        "newest commit)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="run the model folder's own code (auto_map in its config.json or tokenizer_config.json), as "
                        "transformers' and vLLM's trust_remote_code=True; read those files first")
    p.add_argument("--benchmarks", default=DEFAULT_BENCHMARKS,
                   help=f"comma-separated: {', '.join(BENCHMARKS)} or dataset files, folders or globs "
                        f"(default: all four)")
    p.add_argument("--n", type=_n_spec, default=None,
                   help="samples per problem: N, or name=N,... (default: 32 for math500, 512 otherwise; "
                        "1 at --temperature 0)")
    p.add_argument("--k", type=int_list, default=None, help="k values (default 1,2,4,...,256 capped at n)")
    p.add_argument("--table-k", type=int_list, default=None, help="k shown in table.md (default 1,16,256)")
    p.add_argument("--engine", choices=["hf", "vllm", "auto"], default="auto",
                   help="rollout engine (auto: vllm when CUDA and vllm are available, else hf)")
    p.add_argument("--temperature", type=float, default=0.6, help="sampling temperature (default 0.6, the "
                   "paper's; 0 = greedy, one sample per problem)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling (default 0.95, the paper's)")
    p.add_argument("--top-k", type=int, default=0, help="sample from the k largest logits only (default 0: off; "
                   "a model card's top_k, e.g. Qwen's 20); applied before --top-p, after --min-p, as vLLM does")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min-p x the most likely one's "
                   "probability (default 0: off)")
    p.add_argument("--max-tokens", type=int, default=4096, help="max new tokens per response (default 4096)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="a string that ends a response, kept in it (vLLM's stop; repeat the flag for several; "
                        "the training run's rollout.stop): e.g. --stop '</answer>'")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--limit", type=int, default=None, help="first N problems of each benchmark (smoke runs)")
    p.add_argument("--out", default=None, help="output folder (default eval_results/<model name>)")
    p.add_argument("--label", default=None,
                   help="model name in tables and plots (default: folder name; RUN-step_N for a training checkpoint)")
    p.add_argument("--overwrite", action="store_true", help="discard the samples in --out of the benchmarks asked "
                   "for (another benchmark's samples are kept; made with other settings, they are an error)")
    p.add_argument("--samples-per-call", type=int, default=2048,
                   help="samples generated per engine call; also the resume granularity")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="model dtype (auto: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--device", default=None, help="hf engine device (default cuda if available, else cpu)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="hf engine: rows decoded at once (a problem's --n samples beyond it: that many at a time)")
    p.add_argument("--attention", default="auto", choices=ATTENTIONS,
                   help="hf engine: attention implementation (auto: pacs_fast's short-sequence attention "
                        "on CPU, the model's own on GPU; or sdpa, eager, flash_attention_2, ...)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="vllm engine")
    p.add_argument("--max-model-len", type=int, default=None, help="vllm engine context length")
    p.add_argument("--scorer-workers", type=int, default=None, help="verifier processes (default: CPUs)")
    p.add_argument("--time-limit", type=float, default=5.0, help="verifier seconds per response")
    p.add_argument("--extraction", default="reference", choices=EXTRACTIONS,
                   help="what the verifier reads: reference (PACS's: a 'final answer is' phrase, else the boxed "
                        "answers, else the last expression), boxed (only complete \\boxed{} answers) or answer_tag "
                        "(the last complete <answer>...</answer> after the thinking, read as a box)")
    p.add_argument("--reward-fn", default="", metavar="MODULE:FUNCTION",
                   help="your own reward in the verifier's place: function(problems, responses, answers) -> one "
                        "number in [0, 1] per response (the trainer's reward.fn); pass@k counts a response that "
                        "scores above 0.5 as correct, as the trainer does")
    p.add_argument("--reward-weights", default="", metavar="W[,W...]",
                   help="weights of a --reward-fn list (verifier,my_checks:format_score: the math verifier and your "
                        "function), >= 0 and summing to 1: each response's reward is their weighted sum (the "
                        "trainer's reward.fn_weights); default equal")
    p.add_argument("--reward-fields", default="", metavar="FIELD[,FIELD...]",
                   help="dataset fields handed to --reward-fn as keyword arguments, a list with each response's "
                        "row value (test cases, ...): tests,entry_point -> function(problems, responses, answers, "
                        "tests, entry_point); a dotted name reads a nested field and arrives under its last part "
                        "(the trainer's reward.fn_fields)")
    p.add_argument("--system-prompt", default="pacs",
                   help="system message: pacs (the paper's, the trainer's default), '' (none) or the text")
    p.add_argument("--chat-template-kwargs", default="{}", metavar="JSON",
                   help="variables of the model's chat template, a JSON object: '{\"enable_thinking\": false}' for "
                        "Qwen3's (the trainer's data.chat_template_kwargs)")
    p.add_argument("--instruction", default="pacs",
                   help="text after each problem: pacs (the paper's \\boxed{} instruction), '' (none) or the text")
    p.add_argument("--prompt-template", default="chat", metavar="chat|plain|TEXT",
                   help="how each prompt is written: chat (the model's chat template; the plain format where it has "
                        "none), plain (the plain format even where it has one: a base model's R1-Zero-style prompts) "
                        "or a text of your own holding {problem} once, and {instruction} / {system} where they go "
                        "(other braces, as \\boxed{}'s, stay as written) (the trainer's data.prompt_template)")
    p.add_argument("--problem-field", default="problem", help="question field of dataset files")
    p.add_argument("--answer-field", default="answer", help="gold answer field of dataset files")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return p
