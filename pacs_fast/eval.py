"""pass@k evaluation on the shipped math benchmarks (or your own), resumable.

Run (defaults = the paper's settings: temperature 0.6, top-p 0.95, 4,096 new tokens, n = 32 for
MATH-500 and 512 for AMC23 / AIME 2024 / AIME 2025, k = 1, 2, 4, ..., 256 capped at n)::

    python -m pacs_fast.eval --model PATH --benchmarks math500,amc23,aime2024,aime2025 --engine vllm
    python -m pacs_fast.eval --model PATH --benchmarks amc23 --n 8 --limit 5 --engine hf   # smoke run

writes into ``--out`` (default ``eval_results/<model folder name>``):

- ``samples_<benchmark>.jsonl``: one line per problem (responses, scores, statuses), appended as
  generated; rerunning the same command resumes where an interrupted run stopped. Each problem samples
  under its own seed (``--seed``, the benchmark and its index): a resumed run, a larger ``--limit`` and
  another ``--samples-per-call`` sample every problem under the seed one uninterrupted run gives it (the
  same samples up to the float rounding of batched logits, which can tip a near tie when the batching
  differs: a resume with the same ``--samples-per-call`` batches as the uninterrupted run did);
- ``results.json`` (pass@k, maj@k + per-problem correct counts), ``table.md`` (the paper's layout),
  ``pass_at_k.png`` (curves), ``run_config.json`` (the settings; a resume must match them). A hub id ``--model``
  (``org/name``) is evaluated from its snapshot folder in the Hugging Face cache, the commit of ``--revision`` (a
  commit, branch or tag; default: the default branch's newest), recorded as ``revision``: a resume on another
  commit is refused.

Other commands::

    python -m pacs_fast.eval report --out DIR [--k 1,2,4]          # recompute from the samples
    python -m pacs_fast.eval compare a.json b.json --out plot.png [--table table.md]

A benchmark entry may also be a dataset file (``.jsonl`` / ``.jsonl.gz`` / ``.json`` / ``.parquet`` / ``.arrow``;
``--problem-field`` / ``--answer-field`` name its fields), or a folder or glob of one split's shards (a hub
download); its name is the file's stem, or the folder's name.

Every argument, the model folder and every benchmark file are checked before the model loads; an
error is one line (``error: ...`` naming the flag or file) and exit code 2 (``--debug``: the traceback).
"""
from __future__ import annotations

import errno
import json
import os
import sys
import time
import zlib
from pathlib import Path

from pacs_fast.openmp import quiet_openmp_waits

quiet_openmp_waits()  # before torch loads: idle OpenMP threads spin briefly, then sleep (pacs_fast/openmp.py)

from pacs_fast.config.reward_fields import fields_digest, row_fields  # noqa: E402
from pacs_fast.config.reward_specs import VERIFIER, checked_weights, reward_specs
from pacs_fast.evaluation.args import (ArgumentParser, UsageError, check_ks, check_run_args, load_benchmarks,
                                       model_label, prompt_flag_warnings, prompt_kwargs, read_json)
from pacs_fast.evaluation.parser import int_list, run_parser as _run_parser
from pacs_fast.evaluation.prompt_fit import check_prompt_lengths, engine_context, prompt_build_warnings
from pacs_fast.evaluation.run_prompts import take_run_prompts
from pacs_fast.evaluation.engine import (check_vllm_runs_model, engine_and_dtype, make_engine, rope_factors,
                                         vllm_cpu_sizes)
from pacs_fast.evaluation.folder import coverage_warnings, covered_benchmarks, lost_benchmarks, previous_results
from pacs_fast.files import remove_temporaries, write_text_atomic
from pacs_fast.evaluation.report import incomplete_warnings, markdown_table, plot_pass_at_k
from pacs_fast.evaluation.results import (append_records, check_records_match, default_n, is_correct,
                                          parts_warnings, problem_digest, read_samples, results_from_samples,
                                          samples_path)
from pacs_fast.evaluation.settings import (check_settings, hub_snapshot, recorded_prompt_date, recorded_sources,
                                           report_time_limit, weights_stamp)
from pacs_fast.evaluation.user_reward import UserScorer, load_reward_fn, reward_field_keywords
from pacs_fast.gc_heap import freeze_at_start_up
from pacs_fast.trainer.run_claim import RunLock
from pacs_fast.trainer.user_functions import answer_check

# -- helpers ------------------------------------------------------------------------------------
def _n_for(name: str, spec, temperature: float) -> int:
    """Samples per problem of one benchmark: ``--n`` when it names one, else the paper's; at
    ``--temperature 0`` (greedy decoding, every sample the same) 1, and more is an error."""
    given = spec if isinstance(spec, int) else None if spec is None else spec.get(name)
    if temperature == 0:
        if given is not None and given > 1:
            raise UsageError(f"--n {given} with --temperature 0: greedy decoding gives every sample of a problem "
                             f"the same response; use --n 1 (the default at temperature 0) or a temperature > 0")
        return 1
    return default_n(name) if given is None else given


def _make_engine(args, vllm_sizes: dict | None = None):
    """The engine ``--engine`` names (:func:`pacs_fast.evaluation.engine.make_engine`), with a warning per
    flag of the other engine given."""
    return make_engine(args, vllm_sizes, parser=_run_parser())


def _progress(total: int, disabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="problem", disable=disabled, dynamic_ncols=True, file=sys.stderr)


def write_reports(out_dir: Path, results: dict, table_k=None) -> str:
    """results.json, table.md and pass_at_k.png in ``out_dir``, each written atomically (a warning for component
    rewards recorded in part: :func:`~pacs_fast.evaluation.results.parts_warnings`)."""
    for line in parts_warnings(results):
        print(f"warning: {line}", file=sys.stderr)
    write_text_atomic(out_dir / "results.json", json.dumps(results, indent=1) + "\n")
    table = markdown_table([results], table_k)
    write_text_atomic(out_dir / "table.md", table)
    if results["benchmarks"]:
        plot_pass_at_k([results], out_dir / "pass_at_k.png")
    return table


# -- commands -----------------------------------------------------------------------------------
def run(argv: list[str]) -> int:
    args = _run_parser().parse_args(argv)
    if args.out:  # (--out=~/x: the shell leaves that ~)
        args.out = os.path.expanduser(args.out)
    if Path(args.model).expanduser().exists():  # (a hub id never starts with ~)
        args.model = os.path.expanduser(args.model)
    take_run_prompts(args, argv, _run_parser())  # a training run's checkpoint: its prompt settings, for flags not given
    check_run_args(args)  # numbers, choices, the model folder, --out: before anything loads
    args.reward_fn = ",".join(reward_specs(args.reward_fn))  # (recorded as written without spaces or stray commas)
    if args.reward_weights.strip() and len(reward_specs(args.reward_fn)) < 2:  # (the check's own line: one name)
        checked_weights(args.reward_fn, args.reward_weights.split(","), "--reward-weights", "--reward-fn")
    if args.reward_fn == VERIFIER:  # (the math verifier alone: no --reward-fn)
        args.reward_fn = ""
    verifier_scores = not args.reward_fn or VERIFIER in reward_specs(args.reward_fn)
    for line in prompt_flag_warnings(args):  # (the trainer's: the code reward's instruction, unused prompt texts)
        print(f"warning: {line}", file=sys.stderr)
    if not verifier_scores:  # the verifier's flags, idle: named (and the extraction not recorded as a setting)
        parser = _run_parser()
        for flag, key in (("--extraction", "extraction"), ("--time-limit", "time_limit")):
            if getattr(args, key) != parser.get_default(key):
                print(f"warning: {flag} {getattr(args, key)} has no effect with --reward-fn {args.reward_fn} (the "
                      f"math verifier's setting; your function scores every response)", file=sys.stderr)
        args.extraction = parser.get_default("extraction")
    keywords = reward_field_keywords(args.reward_fields, args.reward_fn)
    args.reward_field_keywords = keywords  # (the benchmark loader reads these fields of every row)
    reward_fn = load_reward_fn(args.reward_fn, list(keywords.values()), args.reward_weights,
                               verifier_factory=lambda: _verifier(args))
    args.answer_check = answer_check(reward_specs(args.reward_fn), "--reward-fn") if args.reward_fn else None
    model_id = str(Path(args.model).resolve()) if Path(args.model).exists() else args.model
    label = args.label or model_label(args.model)
    out_dir = Path(args.out or Path("eval_results") / label)
    sets, sources = load_benchmarks(args.benchmarks, args)
    if isinstance(args.n, dict) and set(args.n) - set(sets):
        raise UsageError(f"--n names {sorted(set(args.n) - set(sets))}, not among the benchmarks {list(sets)}")
    if not sets:
        raise UsageError("--benchmarks names no benchmark")
    ns = {b: _n_for(b, args.n, args.temperature) for b in sets}
    check_ks(args.k, ns, greedy=args.temperature == 0)
    # a hub id: its commit's snapshot folder, what loads (downloaded; a resume on another commit refused before)
    hub = hub_snapshot(args.model, args.revision, None if args.overwrite else out_dir)
    if hub:
        args.model = hub[0]
    config = {"model": model_id, "temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
              "min_p": args.min_p, "max_tokens": args.max_tokens, "stop": args.stop, "seed": args.seed, "n": ns,
              **prompt_kwargs(args), "sources": sources, "weights": weights_stamp(model_id),
              "revision": hub[1] if hub else None}
    config["engine"], config["dtype"] = engine_and_dtype(args)
    config.update(rope_factors(args, sets))  # (a longrope model's: those every sample of the folder is made with)
    config["extraction"] = args.extraction
    if verifier_scores:  # (the verifier's seconds per response: what `eval report` re-extracts answers under)
        config["time_limit"] = args.time_limit
    config["reward_fn"] = args.reward_fn
    if keywords:  # (recorded when given: a folder written before the flag existed used none)
        config["reward_fields"] = list(keywords)
    if getattr(reward_fn, "components", None):  # a mix of rewards: its weights (recorded when it is one)
        config["reward_weights"] = [w for _, _, w in reward_fn.components]
    try:  # one eval per --out: a second appended every sample again, and its --overwrite deleted the first's
        lock = RunLock(out_dir, new=False, what="--out", other="choose another --out",
                       writes="its lock, samples and results")
    except ValueError as e:
        raise UsageError(str(e)) from None
    remove_temporaries(out_dir)  # a killed eval's (.results.json.tmp-PID, ...), stale under this lock
    commit = check_settings(out_dir, config, args.overwrite)  # (its deletions and writes once the run starts)

    # (--overwrite: the asked benchmarks' samples are discarded, when the run starts)
    done = {b: {} if args.overwrite else read_samples(samples_path(out_dir, b), repair=True) for b in sets}
    sampled_from = recorded_sources(out_dir)
    for b, problems in sets.items():  # a resume continues the same problems, or refuses
        check_records_match(samples_path(out_dir, b), done[b], problems, sources[b], keywords, ns[b],
                            sampled_from.get(b))
    # the folder's results: this run's benchmarks, then those other runs sampled here (same settings: run_config.json)
    asked = {b: len(p) for b, p in sets.items()}
    prev, unreadable = previous_results(out_dir)
    if unreadable:  # (the other benchmarks' problem counts, a --limit, are unknown without it)
        print(f"warning: {unreadable}: the other benchmarks' problem counts are unknown", file=sys.stderr)
    names, expected = covered_benchmarks(out_dir, prev, asked)
    try:  # (the other benchmarks' samples read before sampling: a bad record had failed the run at its end)
        for b in names[len(asked):]:
            read_samples(samples_path(out_dir, b))
    except ValueError as e:
        raise UsageError(f"{e}; this run's results cover every benchmark sampled in {out_dir}: fix or move that "
                         f"file, or use another --out") from None
    todo = {b: [i for i in range(len(probs)) if i not in done[b]] for b, probs in sets.items()}
    total = sum(len(t) for t in todo.values())
    skipped = sum(len(sets[b]) - len(todo[b]) for b in sets)
    if skipped:
        print(f"resuming: {skipped} problems already in {out_dir}, {total} to go", file=sys.stderr)
    if total:
        _generate(args, out_dir, sets, ns, todo, reward_fn, commit)
    else:
        commit()

    meta = {"model": model_id, **({"revision": hub[1]} if hub else {}), "label": label, "limit": args.limit,
            "settings": read_json(out_dir / "run_config.json", "run settings file")}
    results = results_from_samples(out_dir, names, ks=args.k, meta=meta, expected=expected, extra_ks=args.table_k,
                                   time_limit=args.time_limit)
    gone = lost_benchmarks(prev, results, asked)
    for line in [*coverage_warnings(results, expected, gone), *incomplete_warnings(results, had_results=True,
                                                                                   out_dir=out_dir)]:
        print(f"warning: {line}", file=sys.stderr)
    print(write_reports(out_dir, results, args.table_k))
    print(f"wrote {out_dir / 'results.json'}, table.md, pass_at_k.png", file=sys.stderr)
    lock.release()
    return 0


def _consecutive_calls(indices: list[int], per_call: int) -> list[list[int]]:
    """``indices`` (ascending) cut into calls of at most ``per_call`` consecutive problem indices."""
    calls: list[list[int]] = []
    for i in indices:
        if calls and len(calls[-1]) < per_call and calls[-1][-1] == i - 1:
            calls[-1].append(i)
        else:
            calls.append([i])
    return calls


def _verifier(args):
    """The math verifier's batch scorer of ``--scorer-workers``, ``--time-limit`` and ``--extraction`` (and whether
    the prompts open a ``<think>``: ``args.think_open``, set once the tokenizer has built one)."""
    from pacs_fast.reward.batch import BatchScorer

    return BatchScorer(args.scorer_workers, time_limit=args.time_limit, extraction=args.extraction,
                       think_open=getattr(args, "think_open", False))


def _generate(args, out_dir: Path, sets, ns, todo, reward_fn=None, commit=None) -> None:
    """Samples and scores the problems ``todo`` names, appending each call's records; ``commit()`` (the settings'
    :func:`~pacs_fast.evaluation.settings.check_settings`) runs once the prompts fit and the engine loaded."""
    from pacs_fast.config.stop_string_checks import escape_warning
    from pacs_fast.data.prompt_date import pinned_date_kwargs, today
    from pacs_fast.data.prompts import build_prompt, encode_prompts, system_in_user_turn, template_kwargs_effect
    from pacs_fast.reward.answers import extract_answer
    from pacs_fast.reward.boxes import opens_think, with_prompt_think
    from pacs_fast.reward.verifier import OK
    from pacs_fast.rollout.base import SamplingParams
    from pacs_fast.rollout.stop_strings import special_token_warning

    from pacs_fast.data.tokenizer_files import load_tokenizer

    tokenizer = load_tokenizer(args.model, key="--model")
    template = prompt_kwargs(args)["prompt_template"]  # (chat, plain or the user's own: pacs_fast/data/prompts.py)
    if system_in_user_turn(tokenizer, prompt_kwargs(args)["system"], template):
        print("note: the chat template of --model takes no system message: the system prompt goes first in the user "
              "message (pacs_fast/data/prompts.py)", file=sys.stderr)  # (as the trainer says; eval said nothing)
    idle = template_kwargs_effect(tokenizer, args.template_kwargs, template, "--prompt-template")
    if idle:
        print(f"warning: --chat-template-kwargs {args.chat_template_kwargs}: {idle}", file=sys.stderr)
    # a template that dates its prompts (Llama 3.2's strftime_now): the date the folder's samples were drawn on
    args.template_kwargs, prompt_date, line = pinned_date_kwargs(
        tokenizer, args.template_kwargs, recorded_prompt_date(out_dir) or today(), key="--chat-template-kwargs",
        again="a rerun into this --out", prompt_template=template)
    if line:
        print(line, file=sys.stderr)
    try:  # (a prompt that opens the <think> its response continues: DeepSeek-R1's, read off the template alone, not
        # a system text that mentions <think>; one that fails is said below)
        args.think_open = opens_think(build_prompt(tokenizer, "1+1?", system=None, instruction=None,
                                                   template_kwargs=prompt_kwargs(args)["template_kwargs"],
                                                   prompt_template=template))
    except ValueError:
        args.think_open = False
    for line in (special_token_warning(tokenizer, args.stop, "--stop"), escape_warning(args.stop, "--stop"),
                 *prompt_build_warnings(args, tokenizer, sets, todo)):
        if line:
            print(f"warning: {line}", file=sys.stderr)
    check_vllm_runs_model(args)  # (before vLLM sizes the engine from the model's config)
    vllm_sizes = vllm_cpu_sizes(args, sets, todo, ns)
    name = engine_and_dtype(args)[0]
    check_prompt_lengths(args, name, engine_context(args, name, vllm_sizes), tokenizer, sets, todo)  # before loading
    engine_name, engine = _make_engine(args, vllm_sizes)
    if commit is not None:
        commit({"prompt_date": prompt_date} if prompt_date else None)
    scorer = UserScorer(reward_fn) if reward_fn else _verifier(args)
    bar = _progress(sum(len(t) for t in todo.values()), args.no_progress)
    t0, samples_done = time.perf_counter(), 0
    try:
        for bench, problems in sets.items():
            n = ns[bench]
            per_call = max(1, args.samples_per_call // n)
            path = samples_path(out_dir, bench)
            # Problem i samples under seed base + i * n (the engines give prompt j of a call seed + j * n): its
            # samples do not depend on which call it lands in, so a resumed run, a larger --limit or another
            # --samples-per-call sample every problem as one run would (calls are runs of consecutive indices).
            base = zlib.crc32(f"{args.seed}:{bench}".encode()) & 0x7FFFFFFF
            for idx in _consecutive_calls(todo[bench], per_call):
                params = SamplingParams(n=n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                        min_p=args.min_p, max_new_tokens=args.max_tokens, seed=base + idx[0] * n,
                                        stop=tuple(args.stop))
                prompts = encode_prompts(tokenizer, [problems[i].problem for i in idx], **prompt_kwargs(args))
                # the exact prompt text, kept next to the responses
                prompt_texts = [build_prompt(tokenizer, problems[i].problem, **prompt_kwargs(args)) for i in idx]
                outs = engine.generate(prompts, params)
                texts = [c.text for comp in outs for c in comp]
                answers = [problems[i].answer for i, comp in zip(idx, outs) for _ in comp]
                problem_of_each = [problems[i].problem for i, comp in zip(idx, outs) for _ in comp]
                rows = {i: row_fields(problems[i].fields, args.reward_field_keywords) for i in idx} \
                    if args.reward_field_keywords else {}  # (one per row)
                fields = [rows[i] for i, comp in zip(idx, outs) for _ in comp] if rows else None
                scored = scorer.score(texts, answers, problem_of_each, fields) if reward_fn else \
                    scorer.score(texts, answers)
                parts = scorer.last_parts if reward_fn else {}  # a mix's components, per response
                # the verifier's answers (maj@k votes), read once here: a report need not parse the responses again
                read = with_prompt_think(texts, args.think_open, args.extraction)
                voted = None if reward_fn else [extract_answer(t, args.extraction, args.time_limit) if s == OK else None
                                                for t, s in zip(read, scored.statuses)]
                records, pos = [], 0
                for i, prompt_text, comp in zip(idx, prompt_texts, outs):
                    sc = scored.scores[pos:pos + len(comp)]
                    st = scored.statuses[pos:pos + len(comp)]
                    part = {name: values[pos:pos + len(comp)] for name, values in parts.items()}
                    ans = None if voted is None else voted[pos:pos + len(comp)]
                    pos += len(comp)
                    records.append({
                        "benchmark": bench, "index": i, "id": problems[i].id, "answer": problems[i].answer,
                        "problem_sha1": problem_digest(problems[i].problem),
                        **({"fields_sha1": fields_digest(rows[i])} if args.reward_field_keywords else {}),
                        "prompt": prompt_text, "n": n, "num_correct": sum(map(is_correct, sc)), "scores": sc,
                        **({"score_parts": part} if part else {}), "statuses": st,
                        "finish_reasons": [c.finish_reason for c in comp],
                        "num_tokens": [len(c.token_ids) for c in comp],
                        "responses": [c.text for c in comp],
                        **({"answers": ans} if ans is not None else {}),
                    })
                append_records(path, records)
                samples_done += len(texts)
                bar.update(len(idx))
                bar.set_postfix_str(f"{bench} | {samples_done / (time.perf_counter() - t0):.1f} samples/s")
    finally:
        bar.close()
        scorer.close()
        engine.close()


def report(argv: list[str]) -> int:
    p = ArgumentParser(prog="python -m pacs_fast.eval report",
                       description="Recompute results.json, table.md and pass_at_k.png from every samples file in "
                                   "--out (the problems each run asked for: from its results.json)")
    p.add_argument("--out", required=True, help="run folder holding samples_*.jsonl")
    p.add_argument("--k", type=int_list, default=None)
    p.add_argument("--table-k", type=int_list, default=None)
    p.add_argument("--label", default=None)
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    args = p.parse_args(argv)
    out_dir = Path(args.out).expanduser()
    meta = {}
    cfg = out_dir / "run_config.json"
    if not out_dir.is_dir():
        raise UsageError(f"--out {out_dir}: no such folder")
    try:  # an eval still writing into --out: its results.json comes when it ends (one written now was of a part)
        lock = RunLock(out_dir, new=False, what="--out", other="report after it ends",
                       writes="its lock and results")
    except ValueError as e:
        raise UsageError(str(e)) from None
    remove_temporaries(out_dir)
    # the folder's last results.json: the problems each benchmark's run asked for (a --limit), its label
    prev, unreadable = previous_results(out_dir)
    if unreadable:  # what report is for: write it again, from every samples file
        print(f"warning: {unreadable}: recomputing from every samples file in {out_dir}", file=sys.stderr)
    benchmarks, expected = covered_benchmarks(out_dir, prev, {})
    meta.update({k: prev[k] for k in ("model", "revision", "label", "limit") if k in prev})
    if cfg.exists():
        meta["settings"] = read_json(cfg, "run settings file")
        meta["model"] = meta["settings"].get("model")
        meta.pop("revision", None)
        if meta["settings"].get("revision"):  # (a hub id's commit, as the settings record it)
            meta["revision"] = meta["settings"]["revision"]
    meta["label"] = args.label or meta.get("label") or (model_label(meta["model"]) if meta.get("model")
                                                        else out_dir.name)
    time_limit, note = report_time_limit(meta.get("settings"), cfg)  # (the run's own; else the default, said)
    try:
        results = results_from_samples(out_dir, benchmarks or None, ks=args.k, meta=meta, expected=expected,
                                       extra_ks=args.table_k, time_limit=time_limit)
    except ValueError as e:
        raise UsageError(str(e)) from None
    gone = lost_benchmarks(prev, results)
    if gone:  # (a results.json written without them would lose them for good)
        raise UsageError(f"{out_dir / 'results.json'} lists {', '.join(gone)}, whose samples file is missing or "
                         f"empty: restore it, or delete results.json to report the other benchmarks")
    if not results["benchmarks"]:
        raise UsageError(f"the samples files in {out_dir} hold no problem records")
    ns = {b: min(r["n"]) if isinstance(r["n"], list) else r["n"] for b, r in results["benchmarks"].items()}
    most = max(ns, key=ns.get)  # (a k past one benchmark's n is left out for it, as a run does; past every n: refused)
    check_ks(args.k, {most: ns[most]}, command="report")
    capped = [f"{b} (n = {n})" for b, n in ns.items() if any(k > n for k in args.k or ())]
    if capped:
        print(f"warning: --k {max(args.k)}: pass@k past a benchmark's samples per problem is left out for "
              f"{', '.join(capped)}", file=sys.stderr)
    had_results = (out_dir / "results.json").is_file()  # (before this report writes one)
    for line in [*(coverage_warnings(results, expected) if prev else []),
                 *incomplete_warnings(results, had_results=had_results, out_dir=out_dir)]:
        print(f"warning: {line}", file=sys.stderr)
    if note and any("maj_at_k" in br for br in results["benchmarks"].values()):  # (where the limit was used)
        print(f"note: {note}", file=sys.stderr)
    print(write_reports(out_dir, results, args.table_k))
    lock.release()
    return 0


def main(argv: list[str] | None = None) -> int:
    """The CLI. A bad argument or input file prints one line ``error: ...`` and returns 2
    (``--debug``: raises it, with the traceback); a full disk, one line saying so and that the same command resumes,
    and 1 (it had been ``error: [Errno 28] No space left on device`` and 2, as for a bad argument). Ctrl-C, SIGTERM
    or SIGHUP (when run as the command) end it with one line naming how to resume and 128 + the signal (the samples
    of every finished engine call are kept)."""
    from pacs_fast.signals import Stopped, exit_status, name

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "compare":
            from pacs_fast.evaluation.compare import compare
            return compare(argv[1:])
        if argv and argv[0] == "report":
            return report(argv[1:])
        return run(argv[1:] if argv and argv[0] == "run" else argv)
    except (UsageError, ValueError, OSError) as e:
        if "--debug" in argv:
            raise
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):  # not a bad argument: how to go on
            where = f" writing {e.filename}" if e.filename else ""
            print(f"error: no space left on device{where}; free some and run the same command again (the samples of "
                  f"every finished engine call are kept: it resumes)", file=sys.stderr)
            return 1
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Stopped) as e:  # (a traceback of ~40 lines ended in the sampler; SIGTERM: silent)
        if "--debug" in argv:
            raise
        signum = e.signum if isinstance(e, Stopped) else 2
        print(f"stopped by {name(signum)}: the samples of every finished engine call are kept; run the same "
              f"command again to resume", file=sys.stderr)
        return exit_status(signum)


if __name__ == "__main__":
    from pacs_fast.signals import raise_on_stop_signals

    freeze_at_start_up()  # this process is the command line's (pacs_fast/gc_heap.py)
    raise_on_stop_signals()  # SIGTERM / SIGHUP end it as Ctrl-C does (main's one line)
    code = main()
    if code > 128:  # stopped by a signal: a second one during the exit's clean-up ends it at once, quietly
        from pacs_fast.signals import exit_at_next_signal

        exit_at_next_signal()
    sys.exit(code)
