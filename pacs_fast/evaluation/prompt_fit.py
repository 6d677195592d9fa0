"""Whether each prompt fits the eval engine's context, checked once the tokenizer loads and before the model
does: a prompt longer than the context is an error naming the benchmark and the problem (the engines had failed in
the middle of a benchmark); one that leaves fewer than ``--max-tokens`` is a warning. Also the trainer's warnings
about prompts the chat template will not build as meant (:func:`prompt_build_warnings`)."""
from __future__ import annotations

import sys

from pacs_fast.config.model_files import trained_positions
from pacs_fast.evaluation.args import UsageError, prompt_kwargs


def engine_context(args, engine_name: str, vllm_sizes: dict) -> int | None:
    """The context (prompt + response tokens) the engine will have, before it loads: vLLM's
    ``max_model_len`` (``--max-model-len``, the CPU engine's size for this run, or vLLM's own derivation),
    the HF engine's ``max_position_embeddings`` (None under a RoPE scaling: no limit)."""
    if engine_name != "vllm":
        return trained_positions(args.model)
    given = args.max_model_len or vllm_sizes.get("max_model_len")
    if given:
        return given
    from pacs_fast.rollout.vllm_setup import derived_max_model_len

    try:
        return derived_max_model_len(args.model)
    except Exception:  # a folder vLLM cannot read: its own error comes when the engine loads
        return None


def check_prompt_lengths(args, engine_name: str, context: int | None, tokenizer, sets, todo) -> None:
    """A prompt that does not fit the engine's ``context`` (vLLM's max_model_len, the HF engine's
    ``max_position_embeddings``: :func:`engine_context`) is a UsageError naming the benchmark, the problem
    and the limit, raised before the model loads (not in the middle of a benchmark, as the engine would). A
    prompt that leaves fewer than ``--max-tokens`` of the context is one warning line per benchmark: both
    engines end those responses at the context (the trainer warns alike)."""
    from pacs_fast.data.prompts import encode_prompts

    if not context:
        return
    for bench, problems in sets.items():
        texts = [problems[i].problem for i in todo[bench]]
        lengths = {i: len(p) for i, p in zip(todo[bench], encode_prompts(tokenizer, texts, **prompt_kwargs(args)))}
        if not lengths:
            continue
        long = [i for i, n in lengths.items() if n >= context]
        if long:
            i = max(long, key=lengths.get)
            larger = ("give a larger --max-model-len if the model allows it" if engine_name == "vllm"
                      else "give a model with a longer context (max_position_embeddings)")
            raise UsageError(f"{bench}: {len(long)} of {len(problems)} prompts do not fit the {engine_name} engine's "
                             f"context of {context} tokens (prompt and response), the longest problem {i} "
                             f"(id {problems[i].id}) with {lengths[i]} prompt tokens; {larger}, or leave the "
                             f"benchmark out")
        short = [i for i, n in lengths.items() if n + args.max_tokens > context]
        if short:
            i = max(short, key=lengths.get)
            print(f"warning: {bench}: {len(short)} of {len(lengths)} prompts leave fewer than --max-tokens "
                  f"{args.max_tokens} tokens of the model's context of {context} tokens: the {engine_name} engine "
                  f"ends their responses at the context; the longest, problem {i} (id {problems[i].id}), has "
                  f"{lengths[i]} prompt tokens; --max-tokens {context - lengths[i]} or lower leaves room for every "
                  f"response", file=sys.stderr)


def prompt_build_warnings(args, tokenizer, sets, todo) -> list[str]:
    """The trainer's lines about prompts the chat template will not build as meant
    (:func:`pacs_fast.data.prompts.prompt_warnings`), for the problems asked for, each with its benchmark's name:
    problems that already hold the template's tokens (wrapped in it a second time), a template without an
    assistant header, an end of turn that is not a stop token (a base model under its instruct template: each
    response ran past its turn to ``--max-tokens``, the verifier reading what followed), and a template whose own
    system message (``--system-prompt ''``) asks for an answer format while ``--instruction`` appends one
    (:func:`pacs_fast.data.prompts.template_format_request`). Eval had none of them."""
    from pacs_fast.data.prompts import prompt_warnings, template_format_request
    from pacs_fast.rollout.base import folder_stop_ids

    stop_ids = folder_stop_ids(args.model, tokenizer)
    lines: list[str] = []
    asked = template_format_request(tokenizer, **prompt_kwargs(args))
    if asked:  # (Qwen2.5-Math's template: its default system message is the paper's instruction)
        lines.append(f"--system-prompt '' leaves the system message to the chat template, whose own already asks for "
                     f"an answer format ({asked!r}), and --instruction appends one to each problem as well: two "
                     f"instructions in one prompt; give --instruction '' to keep the template's alone")
    for bench, problems in sets.items():
        for line in prompt_warnings(tokenizer, [problems[i].problem for i in todo[bench]], stop_ids,
                                    length_key="--max-tokens", prompt_template=prompt_kwargs(args)["prompt_template"]):
            line = f"{bench}: {line}" if "problems already hold" in line else line  # (the template's lines once)
            if line not in lines:
                lines.append(line)
    return lines
