"""The run's problems: the training set and the held-out set, loaded and tokenised.

Bad files fail here, before any model work. The built-in arithmetic task brings its own prompt
format (``prompt``); other datasets go through the chat template (:mod:`pacs_fast.data.prompts`).
"""
from __future__ import annotations

import hashlib
import json
import unicodedata
from array import array
from collections import Counter

import torch

from pacs_fast.config import Config
from pacs_fast.config.reward_fields import field_keywords, fields_digest, row_fields
from pacs_fast.config.reward_specs import user_specs, uses_verifier
from pacs_fast.config.validation import splits_groups
from pacs_fast.trainer.user_functions import answer_check


def data_digest(train: list[dict], held_out: list[dict]) -> str:
    """SHA-1 of the training and held-out problems and answers, in order (kept in each checkpoint: a resume
    on edited, moved or replaced data would not continue the same training)."""
    h = hashlib.sha1()
    for rows in (train, held_out):
        for row in rows:  # (reward.fn_fields' values too, when there are: what the reward reads)
            fields = [fields_digest(row["fields"])] if row.get("fields") else []
            h.update(json.dumps([row.get("problem"), row.get("answer")] + fields, ensure_ascii=False).encode("utf-8"))
        h.update(b"|")
    return h.hexdigest()


def load_problems(cfg: Config, *, held_out_per_row: bool = False, split_order: bool = False,
                  nfc_key: bool = True) -> tuple[list[dict], list[dict]]:
    """(train, held-out) problems as dicts with ``problem``, ``answer`` (and ``prompt`` for the
    built-in task, whose prompt format is its own; ``fields``, ``{keyword: value}`` of the
    ``reward.fn_fields``, when it names some). Errors on bad files come here, before any work.
    The training problems of a held-out split keep the file's order with ``data.shuffle=false`` (``split_order``:
    the split's random order, what such a run started before 2026-12-06 trained in: :func:`resumed_problems`).
    ``nfc_key=False``: two rows are the same problem when equal with white space normalised only (not in Unicode
    normal form C as well), the split of a run started before 2026-12-07."""
    if cfg.data.dataset == "arithmetic":
        from pacs_fast.data.arithmetic import arithmetic_splits
        # The problem set is fixed by data.arith_seed (not train.seed): runs with different seeds
        # train and are evaluated on the same problems, so their results pair up.
        return arithmetic_splits(cfg.data.arith_train_size, cfg.data.eval_size, seed=cfg.data.arith_seed,
                                 max_digits=cfg.data.arith_max_digits, ops=cfg.data.arith_ops,
                                 terms=cfg.data.arith_terms)
    from pacs_fast.data.datasets import load_dataset
    from pacs_fast.data.prompts import prompt_parts

    keywords = field_keywords(cfg.reward.fn_fields, "reward.fn_fields")
    # (a chat-message row's own system message is compared with the prompts')
    system = prompt_parts(cfg.data.system_prompt, cfg.data.instruction, cfg.data.prompt_template)[0]
    check = answer_check(user_specs(cfg.reward.fn), "reward.fn") if cfg.reward.fn else None

    def load(path):
        try:
            rows = load_dataset(path, problem_field=cfg.data.problem_key, answer_field=cfg.data.answer_key,
                                field_settings="data.problem_key= / data.answer_key=", fields=list(keywords),
                                fields_setting="reward.fn_fields", check_answer=check,
                                check_setting=f"reward.fn={cfg.reward.fn} reads it", system=system,
                                system_setting="data.system_prompt")
        except ImportError as e:  # a parquet / Arrow file without pyarrow (the parquet extra): one line, exit 2
            raise ValueError(str(e)) from e
        return [{"id": p.id, "problem": p.problem, "answer": p.answer,
                 **({"fields": row_fields(p.fields, keywords)} if keywords else {})} for p in rows]

    train = load(cfg.data.dataset)
    if not train:
        raise ValueError(f"data.dataset {cfg.data.dataset!r} has no rows")
    if cfg.data.eval_dataset:
        held = load(cfg.data.eval_dataset)[: cfg.data.eval_size]
        if not held:  # (it failed after the tokenizer loaded, as "the held-out set: no prompt fits")
            raise ValueError(f"data.eval_dataset {cfg.data.eval_dataset!r} has no rows")
    else:  # a seeded held-out split of the training file: data.split_seed, so that every train.seed trains and
        # is evaluated on the same problems (their results pair up, as the built-in task's with data.arith_seed)
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(cfg.data.split_seed)).tolist()
        n_eval = min(cfg.data.eval_size, len(train) // 5)
        if n_eval == 0:
            raise ValueError(f"data.dataset {cfg.data.dataset!r} has {len(train)} rows: too few to hold out an "
                             f"evaluation split (one row in five, at least 5 rows); give data.eval_dataset")
        # a problem the file repeats stays out of training when one copy is held out (math_train repeats one:
        # with some seeds the held-out accuracy included a problem the run trained on), and is held out once (two
        # copies drawn counted it twice in eval/acc: a file of 100 problems x 8 held out 128 rows of 74 problems, no
        # word); "copies" (the rows that hold it, when more than one) lets data_warnings count what left training
        # (``held_out_per_row``: the split of pacs_fast before 2026-12-06, a copy per row drawn: what a run started
        # then trained with, resumed as it was: :func:`resumed_problems`)
        key_of = _problem_key if nfc_key else _spaced_key
        copies = Counter(key_of(row) for row in train)
        held, kept = [], set()
        for i in order[:n_eval]:
            key = key_of(train[i])
            if held_out_per_row:
                kept.add(key)
                held.append(train[i])
            elif key not in kept:
                kept.add(key)
                held.append({**train[i], "copies": copies[key]} if copies[key] > 1 else train[i])
        rows = len(train)
        # data.shuffle=false draws the rows in order: the file's (a curriculum), not the split's random one (a shuffled
        # run draws a fresh permutation every epoch, of the list in the split's order, as it always has)
        rest = order[n_eval:] if cfg.data.shuffle or split_order else sorted(order[n_eval:])
        train = [train[i] for i in rest if key_of(train[i]) not in kept]
        if not train:  # (it failed after the tokenizer loaded, as "data.dataset: no prompt fits")
            raise ValueError(f"data.dataset {cfg.data.dataset!r}: each of its {rows} rows repeats a problem of the "
                             f"held-out split ({len(kept)} distinct), which stays out of training: nothing is left to "
                             f"train on; give data.eval_dataset, or a file of more distinct problems")
    return train, held


def resumed_problems(cfg: Config, train: list[dict], held_out: list[dict], stored_sha1: str | None
                     ) -> tuple[list[dict], list[dict]]:
    """The problems a resumed run continues with: ``(train, held_out)`` of :func:`load_problems`, or, where the
    checkpoint's digest (``stored_sha1``) is instead that of the held-out split pacs_fast drew before 2026-12-06 (two
    copies of a repeated problem drawn were both held out; with ``data.shuffle=false``, the training rows in the
    split's order, not the file's; before 2026-12-07, the same problem in two Unicode forms was two problems), that
    split, so that the run resumes as it was."""
    if (not stored_sha1 or cfg.data.eval_dataset or cfg.data.dataset == "arithmetic"
            or data_digest(train, held_out) == stored_sha1):
        return train, held_out
    ways = [{"nfc_key": False}, {"held_out_per_row": True, "nfc_key": False}]
    if not cfg.data.shuffle:
        ways += [{"split_order": True, "nfc_key": False},
                 {"held_out_per_row": True, "split_order": True, "nfc_key": False}]
    for way in ways:
        legacy = load_problems(cfg, **way)
        if data_digest(*legacy) == stored_sha1:
            return legacy
    return train, held_out


def _problem_key(row: dict) -> str:
    """A problem's text in Unicode normal form C with its white space normalised (what makes two rows the same
    problem: a problem written with composed and with decomposed accents, "\u00e9" and "e" + U+0301, is one problem,
    to which a tokenizer that normalises to NFC, as Qwen2.5's does, gives one prompt)."""
    return _spaced_key({"problem": unicodedata.normalize("NFC", row["problem"])})


def _spaced_key(row: dict) -> str:
    """A problem's text with its white space normalised: :func:`_problem_key` of runs started before 2026-12-07."""
    return " ".join(row["problem"].split())


GOLD_SAMPLE = 512  # training answers checked by check_gold_answers (all held-out ones are)


def _held_out_name(cfg: Config) -> str:
    return f"data.eval_dataset {cfg.data.eval_dataset!r}" if cfg.data.eval_dataset else "the held-out split"


def _eval_dataset_size(cfg: Config) -> int:
    """Problems in ``data.eval_dataset`` (a shipped benchmark's known size, else the file's rows)."""
    from pacs_fast.data.datasets import BENCHMARK_SIZES, load_dataset

    if cfg.data.eval_dataset in BENCHMARK_SIZES:
        return BENCHMARK_SIZES[cfg.data.eval_dataset]
    return len(load_dataset(cfg.data.eval_dataset, problem_field=cfg.data.problem_key, answer_field=cfg.data.answer_key,
                            field_settings="data.problem_key= / data.answer_key="))


def data_warnings(cfg: Config, train: list[dict], held_out: list[dict]) -> list[str]:
    """Lines about the held-out set a user would want before training: smaller than ``data.eval_size``
    asked (a short ``data.eval_dataset``, or one row in five of a small ``data.dataset``), cut to its first
    ``data.eval_size`` problems (a ``data.eval_dataset`` that holds more: its accuracy is not the set's), and
    problems it shares with the training set (the same file given twice, duplicated rows): its accuracy then
    includes problems the run trains on; for the built-in task, a ``data.arith_train_size`` it cannot give; a
    step that draws more prompts (``train.prompts_per_step``) than the training set holds; problems that state their
    own gold answer (a worked solution as the question field) or already ask for an answer format while
    ``data.instruction`` appends one."""
    lines = []
    if cfg.train.prompts_per_step > len(train) > 0:  # (a sweep of 2026-12-02: 8 a step from 4 problems, no word)
        lines.append(f"train.prompts_per_step={cfg.train.prompts_per_step} is more than the {len(train)} training "
                     f"problems: each step draws some of them more than once (their groups train twice in one step)")
    if cfg.data.dataset == "arithmetic":
        asked = cfg.data.arith_train_size
        default = type(cfg.data)().arith_train_size  # (more than the default family has: it asks for all there are)
        if len(train) < asked and asked != default:
            lines.append(f"data.arith_train_size={asked} is more than the built-in task has with these settings: "
                         f"it trains on its {len(train)} problems (every distinct one less the held-out ones)")
        return lines
    from pacs_fast.data.datasets import BENCHMARKS

    others = sum(row.get("copies", 1) - 1 for row in held_out)  # (0 for a data.eval_dataset)
    rows = len(train) + len(held_out) + others
    if len(held_out) < cfg.data.eval_size and cfg.data.eval_dataset not in BENCHMARKS:  # (a benchmark's size is known)
        why = "its rows" if cfg.data.eval_dataset else f"one row in five of data.dataset's {rows}"
        if others:  # (the copies that left training went without a word)
            why = (f"the {min(cfg.data.eval_size, rows // 5)} rows drawn of data.dataset's {rows} repeat problems: "
                   f"each is held out once, and the {others} other rows of held-out problems stay out of training")
        lines.append(f"{_held_out_name(cfg)} holds {len(held_out)} problem{'s' * (len(held_out) != 1)} ({why}), "
                     f"fewer than data.eval_size={cfg.data.eval_size}")
    elif others > 0.05 * rows:  # (a file of 6 problems x 5 rows lost 16 of its 30 rows to 4 held out, no word)
        lines.append(f"the held-out split's {len(held_out)} problems repeat in {others} other rows of "
                     f"data.dataset's {rows}, which stay out of training (the run trains on none of a held-out "
                     f"problem's copies): {len(train)} rows train; give data.eval_dataset to keep them all")
    if cfg.data.eval_dataset and len(held_out) == cfg.data.eval_size:
        whole = _eval_dataset_size(cfg)
        if whole > len(held_out):
            lines.append(f"{_held_out_name(cfg)} holds {whole} problems and the run evaluates its first "
                         f"{len(held_out)} (data.eval_size={cfg.data.eval_size}): eval/acc is not the whole set's; "
                         f"set data.eval_size={whole} to evaluate every problem")
    from pacs_fast.reward.gold_check import reads_like_prose

    prose = [row for row in train + held_out if reads_like_prose(row["answer"])]
    if prose:
        lines.append(f"{len(prose)} of the {len(train) + len(held_out)} gold answers read like worked solutions or "
                     f"questions, not final answers (a line break, '####', or 8 words or more; e.g. "
                     f"{prose[0].get('id', '')!r}: {prose[0]['answer'][:60]!r}): the verifier matches a response's "
                     f"final answer against all of it; is data.answer_key={cfg.data.answer_key} the final-answer "
                     f"field?")
    from pacs_fast.data.datasets import states_its_answer
    from pacs_fast.data.prompts import asks_for_a_format, prompt_parts

    texts = [row for row in train + held_out if "prompt" not in row]
    told = [row for row in texts if states_its_answer(row["problem"], row["answer"])]
    if told:  # (data.problem_key=solution: the worked solution, its \boxed{} answer, went into every prompt)
        lines.append(f"{len(told)} of the {len(texts)} problems state their own gold answer (as \\boxed{{<answer>}} or "
                     f"'#### <answer>'; e.g. {told[0].get('id', '')!r}: ...{told[0]['problem'][-60:]!r}): the model "
                     f"reads the answer in its prompt; is data.problem_key={cfg.data.problem_key} the question field?")
    instruction = prompt_parts(cfg.data.system_prompt, cfg.data.instruction, cfg.data.prompt_template)[1]
    asked = [row for row in texts if asks_for_a_format(row["problem"], instruction)]
    if asked:  # (verl's and DeepScaleR's problems carry their own "... within \boxed{}." request)
        whose = "the paper's" if cfg.data.instruction == "pacs" else "its text"
        lines.append(f"{len(asked)} of the {len(texts)} problems already ask for an answer format (e.g. "
                     f"{asked[0].get('id', '')!r}: ...{asked[0]['problem'][-60:]!r}) and data.instruction="
                     f"{cfg.data.instruction} appends {whose} "
                     f"to each as well: two instructions in one prompt; set data.instruction='' for data that "
                     f"carries its own")
    distinct = len({_problem_key(row) for row in held_out})
    if cfg.data.eval_dataset and distinct < len(held_out):  # (the split of data.dataset holds each problem once)
        lines.append(f"{len(held_out) - distinct} of the {len(held_out)} problems of data.eval_dataset repeat another "
                     f"(white space and Unicode normal form aside): eval/acc counts each copy, weighting those "
                     f"problems more (rollout.eval_n samples a problem several times)")
    seen = {_problem_key(row) for row in train}
    shared = sum(_problem_key(row) in seen for row in held_out)
    if shared:
        lines.append(f"{shared} of the {len(held_out)} problems of {_held_out_name(cfg)} are also training problems "
                     f"(data.dataset): the held-out accuracy includes problems the run trains on")
    return lines


def check_gold_answers(cfg: Config, train: list[dict], held_out: list[dict], log) -> None:
    """Gold answers no response can match (pacs_fast/reward/gold_check.py): every held-out answer and up to
    ``GOLD_SAMPLE`` training answers (seeded) are scored as ``\\boxed{<gold>}`` (``reward.extraction=answer_tag``:
    ``<answer><gold></answer>``) with the run's verifier.
    Some unmatchable: a warning naming how many and one of them. All of those checked in a set: a
    ValueError (every reward, or the held-out accuracy, would be 0 whatever the model writes), except
    for the training set of a run trained on process rewards alone (``reward.outcome_weight=0``)."""
    if cfg.data.dataset == "arithmetic" or not uses_verifier(cfg.reward.fn):  # (reward.fn: the user's function judges)
        return
    from pacs_fast.reward.gold_check import object_hint, stated, unmatchable_golds

    picked = train
    if len(train) > GOLD_SAMPLE:
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(cfg.train.seed))
        picked = [train[i] for i in order[:GOLD_SAMPLE].tolist()]
    outcome_trains = not (cfg.reward.step_rewards and cfg.reward.outcome_weight == 0)
    for what, rows, total, fatal in (("data.dataset", picked, len(train), outcome_trains),
                                     (_held_out_name(cfg), held_out, len(held_out), True)):
        bad = unmatchable_golds([row["answer"] for row in rows], extraction=cfg.reward.extraction,
                                time_limit=cfg.reward.time_limit_s)
        if not bad:
            continue
        row = rows[bad[0]]
        example = f"e.g. {row.get('id', bad[0])!r}: answer {row['answer'][:60]!r}"
        checked = f"of {len(rows)} checked" if len(rows) < total else f"of {total}"
        form = stated("<answer>", cfg.reward.extraction)  # (\\boxed{<answer>}; answer_tag's <answer><answer></answer>)
        if fatal and len(bad) == len(rows):
            key = f"data.answer_key={cfg.data.answer_key}"
            raise ValueError(f"{what}: none of the {len(rows)} gold answers checked can be matched by the verifier, "
                             f"even by a response that states them as {form} ({example}): every reward "
                             f"would be 0; is {key} the field holding the answer?"
                             f"{object_hint(row['answer'], 'data.answer_key=' + cfg.data.answer_key)}")
        log(f"warning: {what}: {len(bad)} {checked} gold answers cannot be matched by the verifier, even by a "
            f"response that states them as {form} ({example}): those problems score 0 whatever "
            f"the model writes")


def encode(cfg: Config, tokenizer, problems: list[dict], what: str, log, *, held_out: bool = False,
           template_kwargs: dict | None = None) -> tuple[list[dict], float]:
    """Adds ``prompt_ids`` to each problem and drops prompts longer than ``data.max_prompt_tokens``.
    Returns the kept problems and the dropped share; more than 5% dropped is a warning, and any drop from the
    ``held_out`` set (its accuracy is then over fewer problems than the set holds: MATH-500's is not over 500).
    ``template_kwargs``: the chat template's variables (default ``data.chat_template_kwargs``; the session adds a
    dating template's ``date_string``: pacs_fast/data/prompt_date.py).

    ``prompt_ids`` is an ``array('i')`` (4 bytes a token; a Python list of ints takes ~32: a 1M-row set of
    150-token prompts held ~5 GB in every rank). Readers take ``len`` and iterate; what leaves the trainer
    (an engine's prompts, a decode) goes through :func:`prompt_lists`. An ``array`` is not a list: adding
    it to one, or writing it as JSON, fails loudly instead of doing something else."""
    from pacs_fast.data.prompts import ENCODE_CHUNK, encode_prompts, prompt_parts, template_format_request

    template = cfg.data.prompt_template
    system, instruction = prompt_parts(cfg.data.system_prompt, cfg.data.instruction, template)
    kwargs = cfg.data.chat_template_kwargs if template_kwargs is None else template_kwargs
    asked = not held_out and problems and "prompt" not in problems[0] and \
        template_format_request(tokenizer, system, instruction, kwargs, template)
    if asked:  # (Qwen2.5-Math's template: its default system message is the paper's instruction)
        whose = "the paper's" if cfg.data.instruction == "pacs" else "its text"
        log(f"warning: data.system_prompt={cfg.data.system_prompt!r} leaves the system message to the chat template, "
            f"whose own already asks for an answer format ({asked!r}), and data.instruction={cfg.data.instruction} "
            f"appends {whose} to each problem as well: two instructions in one prompt; set data.instruction='' to "
            f"keep the template's alone")
    ids = []
    for start in range(0, len(problems), ENCODE_CHUNK):  # a chunk's lists at a time, then compact arrays
        part = problems[start:start + ENCODE_CHUNK]
        if "prompt" in part[0]:  # the built-in task's own prompt format
            lists = [tokenizer.encode(p["prompt"], add_special_tokens=False) for p in part]
        else:
            lists = encode_prompts(tokenizer, [p["problem"] for p in part], system=system, instruction=instruction,
                                   template_kwargs=kwargs, prompt_template=template)
        ids += [array("i", x) for x in lists]
    out = [{**p, "prompt_ids": i} for p, i in zip(problems, ids) if 0 < len(i) <= cfg.data.max_prompt_tokens]
    dropped = 1.0 - len(out) / max(len(problems), 1)
    if len(out) < len(problems):
        longest = max(len(i) for i in ids)
        warn = "warning: " if dropped > 0.05 or held_out else ""
        then = (f"; eval/acc is over the {len(out)} kept, not the whole set: raise data.max_prompt_tokens to "
                f"evaluate them all" if held_out and out else "")
        log(f"{warn}{what}: dropped {len(problems) - len(out)} of {len(problems)} prompts ({dropped:.0%}) longer "
            f"than data.max_prompt_tokens={cfg.data.max_prompt_tokens} tokens (the longest has {longest}, its "
            f"template included){then}")
    if not out:
        raise ValueError(f"{what}: no prompt fits data.max_prompt_tokens={cfg.data.max_prompt_tokens}")
    return out, dropped


def problem_texts(problems: list[dict], copies: int) -> list[str]:
    """Each problem's text (as the data gives it, before the chat template) ``copies`` times in a row:
    one per response of its group, what ``reward.fn`` is given."""
    return [p.get("problem", "") for p in problems for _ in range(copies)]


def problem_fields(problems: list[dict], copies: int) -> list[dict] | None:
    """Each problem's ``reward.fn_fields`` values (``{keyword: value}``) ``copies`` times in a row, one per
    response of its group; None when the run hands reward.fn no fields."""
    if not problems or "fields" not in problems[0]:
        return None
    return [p["fields"] for p in problems for _ in range(copies)]


def prompt_lists(problems: list[dict]) -> list[list[int]]:
    """The problems' ``prompt_ids`` as lists of ints (what engines, tokenizers and batches take)."""
    return [list(p["prompt_ids"]) for p in problems]


def check_context(cfg: Config, context: int | None, sets: list[tuple[str, list[dict]]], log) -> None:
    """Each ``(name, encoded problems)`` set against the model's ``context`` (prompt + response
    tokens, :func:`pacs_fast.trainer.engine_checks.model_context`; None: nothing to check).

    A prompt of ``context`` tokens or more is a ValueError here (both engines refuse it, in the
    middle of the run). A prompt that leaves fewer than ``rollout.max_new_tokens`` tokens of the
    context is a warning: both engines end its responses at the context."""
    if not context:
        return
    new, engine = cfg.rollout.max_new_tokens, cfg.rollout.engine
    limit = "vLLM's max_model_len" if engine == "vllm" else "max_position_embeddings"
    threshold = context - new if context > new else context - 1
    drop_them = f"data.max_prompt_tokens={threshold} or lower drops them"
    for what, problems in sets:
        lengths = [len(p["prompt_ids"]) for p in problems]
        i = max(range(len(lengths)), key=lengths.__getitem__)
        longest = f"the longest (problem {problems[i].get('id', i)!r}) has {lengths[i]} tokens, its template included"
        none_fit = all(n > threshold for n in lengths)  # dropping would leave nothing
        drop = (f"every prompt has more than {threshold} tokens: give a model with a longer context "
                f"(max_position_embeddings) or shorter problems") if none_fit else drop_them
        over = sum(n >= context for n in lengths)
        if over:
            if over == len(lengths):
                fit = ("every prompt fills the context: give a model with a longer context (max_position_embeddings) "
                       "or shorter problems")
            else:  # dropping those that do not fit; the threshold too where that keeps some prompts
                fit = f"data.max_prompt_tokens={context - 1} drops them" + (
                    "" if none_fit else f" ({threshold} or lower also those that leave fewer than "
                                        f"rollout.max_new_tokens={new} tokens)")
            raise ValueError(f"{what}: {over} of {len(lengths)} prompts do not fit the model's context of {context} "
                             f"tokens ({limit}): {longest}; {fit}")
        short = sum(n + new > context for n in lengths)
        if short:
            room = f"rollout.max_new_tokens={context - lengths[i]} or lower leaves room for every response"
            # when dropping would leave nothing (or new >= context), a shorter response is what helps (4k-context
            # models at max_new_tokens=4000)
            fix = room if none_fit or new >= context else f"{drop}, or {room}"
            log(f"warning: {what}: {short} of {len(lengths)} prompts leave fewer than rollout.max_new_tokens={new} "
                f"tokens of the model's context of {context} ({limit}): the {engine} engine ends their responses "
                f"at the context; {longest}; {fix}")


def check_token_budget(cfg: Config, what: str, problems: list[dict]) -> None:
    """``learner.max_tokens_per_micro_batch`` (when set) against the largest group these encoded training prompts
    can give, ``rollout.n x (longest prompt + rollout.max_new_tokens)`` tokens, or with ``learner.split_groups=auto``
    (a larger group trains a few rows at a time; not with ``model.lora_dropout``) against its longest row. A
    ValueError naming the key, the longest prompt and the budget that fits, before any model loads (the learner
    would refuse it at its first step, or, with LoRA dropout, at the first step with a group over the budget)."""
    budget = cfg.learner.max_tokens_per_micro_batch
    if not budget or not problems:
        return
    lengths = [len(p["prompt_ids"]) for p in problems]
    i = max(range(len(lengths)), key=lengths.__getitem__)
    split = splits_groups(cfg)  # (not with LoRA dropout: a group must then fit)
    largest = (1 if split else cfg.rollout.n) * (lengths[i] + cfg.rollout.max_new_tokens)
    if budget < largest:
        head = (f"one full-length row of {what} (the" if split else
                f"the largest group of {what}: rollout.n={cfg.rollout.n} x (its")
        raise ValueError(f"learner.max_tokens_per_micro_batch={budget} cannot hold {head} longest prompt, problem "
                         f"{problems[i].get('id', i)!r}, {lengths[i]} tokens + rollout.max_new_tokens="
                         f"{cfg.rollout.max_new_tokens}) = {largest} tokens; raise it to {largest}, or lower "
                         f"data.max_prompt_tokens to drop the long prompts"
                         + ("" if split else ", or set learner.split_groups=auto (a group trains a few rows at a "
                                             "time)" if cfg.learner.split_groups == "off" else
                            ", or set model.lora_dropout=0 (then a larger group trains a few rows at a time)"))
