"""``extraction="answer_tag"`` (``reward.extraction``, ``eval --extraction``): R1-Zero's format, the content of the last
complete ``<answer>...</answer>`` after the thinking, read as a box's (pacs_fast/reward/answer_tag.py).

Each decision of the reading (white space, several tags, a tag in the thinking, an unclosed tag, a box in the tag,
prose, braces), LaTeX and the exact integer fast path, the prompt's open ``<think>`` and a hostile item's time limit
through the worker scorer, the gold check (a gold must be matchable as ``<answer>gold</answer>``), the config key and
eval flag, the warnings where the extraction and the prompts' answer format disagree, and one short real
``python -m pacs_fast.train`` with R1's template (forced responses: only the right tag after ``</think>`` pays) and
one ``python -m pacs_fast.eval --extraction answer_tag``.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json

import pytest

from pacs_fast.config import hazard_warnings, load_config, validate
from pacs_fast.reward import BatchScorer, math_reward, score_item
from pacs_fast.reward.answers import extract_answer
from pacs_fast.reward.verifier import NO_ANSWER, OK, TIMEOUT, read_part
from pacs_fast.trainer.metrics import read_jsonl
from test_llama3_path_sweep import _data
from test_prompt_template import R1
from test_qwen25_math_path_sweep import EOT, math_folder, no_model_load

A = "answer_tag"

# (response, gold, score, status, the answer extract_answer reads): each decision of pacs_fast/reward/answer_tag.py
READING = [
    ("<think>7+5</think> <answer>12</answer>", "12", 1.0, OK, "12"),
    ("</think>\n<answer>\n  12 \n</answer>\n", "12", 1.0, OK, "12"),                  # white space inside: dropped
    ("</think> <answer>11</answer> wait, <answer>12</answer>", "12", 1.0, OK, "12"),  # several: the last
    ("</think> <answer>12</answer> wait, <answer>11</answer>", "12", 0.0, OK, "11"),
    ("<think>so <answer>12</answer></think> I give up.", "12", 0.0, NO_ANSWER, None),  # in the thinking: a draft
    ("<think>so <answer>11</answer></think> <answer>12</answer>", "12", 1.0, OK, "12"),
    ("</think> <answer>12", "12", 0.0, NO_ANSWER, None),                              # left open: no answer
    ("</think> <answer>12</answer> <answer>1", "12", 1.0, OK, "12"),                  # open after it: skipped
    ("</think> <answer> </answer>", "12", 0.0, NO_ANSWER, None),                      # empty
    ("</think> So the answer is \\boxed{12}.", "12", 0.0, NO_ANSWER, None),           # no tag at all
    ("</think> <answer>The answer is 12</answer>", "12", 0.0, OK, "The answer is 12"),  # prose: no box's answer
    ("</think> <answer>12}</answer>", "12", 0.0, NO_ANSWER, None),                    # braces that do not balance
    ("</think> <answer>x = 12</answer>", "12", 1.0, OK, "x = 12"),
    ("</think> <answer>$\\frac{1}{2}$</answer>", "0.5", 1.0, OK, "\\frac{1}{2}"),    # LaTeX, as a box's content
    ("</think> <answer>\\dfrac{3}{4}</answer>", "\\frac{3}{4}", 1.0, OK, "\\frac{3}{4}"),
    ("</think> <answer>2\\sqrt{3}</answer>", "\\sqrt{12}", 1.0, OK, "2\\sqrt{3}"),
    ("</think> <answer>so \\boxed{12}</answer>", "12", 1.0, OK, "12"),                # a box in the tag: its box
    ("</think> <answer>\\boxed{11} or \\boxed{12}</answer>", "12", 0.0, OK, None),    # a hedge in boxes: boxed's rule
    ("</think> <answer>\\boxed{}</answer>", "12", 0.0, NO_ANSWER, None),              # an empty box is no box
    ("</think> <answer>3, 5</answer>", "3, 5", 1.0, OK, "3, 5"),
]


@pytest.mark.parametrize("response,gold,score,status,answer", READING)
def test_each_decision_of_the_reading(response, gold, score, status, answer):
    item = score_item(response, gold, extraction=A)
    assert (item.score, item.status) == (score, status), response
    if answer is not None:
        assert extract_answer(response, A) == answer
    elif status == NO_ANSWER:
        assert extract_answer(response, A) is None


def test_what_it_reads_and_how_it_differs_from_the_other_extractions():
    """The tag's content goes to the verifier as ``\\\\boxed{<content>}``; the reference and ``boxed`` read text the
    tag reading does not (a box with no tag pays there), and miss a tag's answer: neither reads one in
    ``<answer>12</answer>`` (math-verify's expressions want a space before them), the reference does in
    ``<answer> 12 </answer>``."""
    assert read_part("<think>a</think> x <answer> 12 </answer> y", A) == "\\boxed{12}"
    assert read_part("</think><answer>a \\boxed{5} b</answer>", A) == "a \\boxed{5} b"
    assert read_part("no tag", A) == "" and read_part(None, A) is None
    boxed_only = "</think> So the answer is \\boxed{12}."
    assert [math_reward(boxed_only, "12", extraction=e) for e in ("reference", "boxed", A)] == [1.0, 1.0, 0.0]
    for tagged, reference in (("</think> <answer>12</answer>", 0.0), ("</think> <answer> 12 </answer>", 1.0)):
        assert [math_reward(tagged, "12", extraction=e) for e in ("reference", "boxed", A)] == [reference, 0.0, 1.0]


def test_an_integer_in_the_tag_takes_the_fast_path(monkeypatch):
    """``<answer> +012 </answer>`` is decided by integer equality, math-verify never called (an integer answer costs
    microseconds, as a boxed one); a fraction does go to math-verify."""
    from pacs_fast.reward import verifier

    def refused(*a, **k):
        raise AssertionError("math-verify was called")

    monkeypatch.setattr(verifier, "warm_up", refused)
    monkeypatch.setattr(verifier, "_score_math_verify", refused)
    assert score_item("</think> <answer> +012 </answer>", "12", extraction=A) == verifier.ScoredItem(1.0, OK)
    assert score_item("</think> <answer>13</answer>", "12", extraction=A) == verifier.ScoredItem(0.0, OK)
    assert extract_answer("</think> <answer> +012 </answer>", A) == "12"
    with pytest.raises(AssertionError, match="math-verify was called"):
        score_item("</think> <answer>\\frac{1}{2}</answer>", "0.5", extraction=A)


def test_the_worker_scorer_reads_the_prompts_open_think_and_bounds_a_hostile_tag():
    """Where the prompt opens the ``<think>`` (R1's), a response that never closes it has no answer part: its tag is a
    draft (paid with ``think_open`` off). A hostile tag stuck in C code past the limit is killed by the parent's
    watchdog (``worker_alarm=False``: no in-worker alarm) and scores 0 as a timeout; the next items score as inline."""
    texts = ["7+5=12 </think> <answer>12</answer>", "maybe <answer>12</answer>",
             "</think> <answer>\\frac{24}{2}</answer>"]
    for think_open, expected in ((True, [1.0, 0.0, 1.0]), (False, [1.0, 1.0, 1.0])):
        with BatchScorer(num_workers=1, extraction=A, think_open=think_open) as scorer:
            got = scorer.score(texts, "12")
        inline = BatchScorer(num_workers=0, extraction=A, think_open=think_open).score(texts, "12")
        assert got.scores == inline.scores == expected, (think_open, got)
    assert got.statuses == [OK] * 3 and inline.statuses[1] == OK
    hostile = "<answer>" + "(" * 5000 + "1" + ")" * 5000 + "</answer>"
    with BatchScorer(num_workers=1, time_limit=0.5, grace=0.5, worker_alarm=False, extraction=A) as scorer:
        res = scorer.score([hostile, "<answer>2.0</answer>", "<answer>3.0</answer>"], "2")
    assert res.statuses[0] == TIMEOUT and res.scores == [0.0, 1.0, 0.0] and scorer.workers_replaced == 1


def test_a_gold_must_be_matchable_as_a_tag():
    """The gold check states each gold as ``<answer>gold</answer>`` under ``answer_tag`` (as ``\\\\boxed{gold}`` it
    would score 0 there: every gold unmatchable); a JSON object still is; the trainer's lines name the tag form."""
    from pacs_fast.data.datasets import shipped_path
    from pacs_fast.reward.gold_check import stated, unmatchable_golds
    from pacs_fast.trainer.problems import check_gold_answers

    golds = [json.loads(line)["answer"] for line in open(shipped_path("math500"))][:60]
    assert unmatchable_golds(golds, extraction=A, time_limit=None) == []
    assert unmatchable_golds(["12", '{"ground_truth": "2"}', "\\frac{1}{2}"], extraction=A) == [1]
    assert stated("<answer>", A) == "<answer><answer></answer>" and stated("7") == "\\boxed{7}"
    cfg = load_config(None, ["reward.extraction=answer_tag", "data.dataset=math_train"])
    lines = []
    check_gold_answers(cfg, [{"id": "t", "answer": "12"}], [{"id": "h", "answer": "\\frac{1}{2}"}], lines.append)
    assert lines == []
    with pytest.raises(ValueError, match=r"states them as <answer><answer></answer> \(e\.g\. 'h'"):
        check_gold_answers(cfg, [{"id": "t", "answer": "12"}], [{"id": "h", "answer": '{"a": "2"}'}], lines.append)


def test_the_config_key_and_the_eval_flag_take_it_and_refuse_a_typo_in_one_line(tmp_path):
    from pacs_fast import eval as ev
    from pacs_fast.evaluation.parser import run_parser
    from pacs_fast.trainer.rewards import Scorer

    cfg = load_config(None, ["reward.extraction=answer_tag"])
    validate(cfg, world=1)
    scorer = Scorer.from_config(cfg)
    assert scorer.batch.extraction == A
    assert scorer.clean(["</think> \\boxed{5}", "</think> <answer>5</answer>"], ["5", "5"]) == [0.0, 1.0]
    with pytest.raises(ValueError) as e:
        validate(load_config(None, ["reward.extraction=answer-tag"]), world=1)
    assert str(e.value) == "reward.extraction must be one of reference, boxed, answer_tag; got 'answer-tag'"
    assert run_parser().parse_args(["--model", "m", "--extraction", A]).extraction == A
    text = io.StringIO()
    with no_model_load(), contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        code = ev.main(["--model", str(tmp_path), "--extraction", "answer-tag"])
    lines = text.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1 and "answer_tag" in lines[0] and "answer-tag" in lines[0], lines


def test_the_warnings_where_the_extraction_and_the_prompts_answer_format_disagree():
    """``answer_tag`` with prompts that never ask for ``<answer>`` (the default instruction asks for ``\\\\boxed{}``),
    ``boxed`` with R1's template (tags, no box): a line each, in the trainer and in eval (its flags named); silent
    where they agree, under the reference, or where a user's reward.fn scores alone."""
    from pacs_fast.evaluation.args import prompt_flag_warnings

    def said(*overrides):
        return [line for line in hazard_warnings(load_config(None, list(overrides))) if "<answer>" in line]

    r1 = f"data.prompt_template={R1}"
    assert said("reward.extraction=answer_tag") == [
        "reward.extraction=answer_tag pays only an answer in <answer> </answer> tags, but the prompts never ask for "
        "them (data.instruction=pacs (the default) asks for \\boxed{}): a response without them scores 0; ask for them "
        "in data.prompt_template (R1's template does) or data.instruction, or use reward.extraction=boxed"]
    assert said("reward.extraction=boxed", r1) == [
        "reward.extraction=boxed reads only \\boxed{} answers, but data.prompt_template asks for the answer in "
        "<answer> </answer> tags and never for \\boxed{}: an answer given there as asked scores 0; use "
        "reward.extraction=answer_tag"]
    assert "neither data.prompt_template nor data.instruction" in said("reward.extraction=answer_tag",
                                                                        "data.instruction=Think.")[0]
    assert said("reward.extraction=answer_tag", r1) == said(r1) == said("reward.extraction=boxed") == []
    assert said("reward.extraction=answer_tag", "data.instruction=Answer in <answer> </answer>.") == []
    assert said("reward.extraction=boxed", "data.prompt_template={problem} <answer>\\boxed{}</answer>") == []
    assert said("reward.extraction=answer_tag", "reward.fn=pacs_fast.reward.code_tests:pass_all") == []
    args = argparse.Namespace(reward_fn="", system_prompt="pacs", instruction="pacs", prompt_template=R1,
                              extraction="boxed")
    assert prompt_flag_warnings(args) == [
        "--extraction boxed reads only \\boxed{} answers, but --prompt-template asks for the answer in <answer> "
        "</answer> tags and never for \\boxed{}: an answer given there as asked scores 0; use --extraction answer_tag"]
    chat = argparse.Namespace(**{**vars(args), "prompt_template": "chat", "extraction": A})
    assert prompt_flag_warnings(chat)[0].startswith("--extraction answer_tag pays only an answer in <answer>")
    assert prompt_flag_warnings(argparse.Namespace(**{**vars(args), "extraction": A})) == []
    assert prompt_flag_warnings(argparse.Namespace(**{**vars(chat), "reward_fn": "m:f"})) == []


# ------------------------------------------------------------------------------------------- real runs

MAX_NEW = 32
# sample k of each training prompt (gold g; R1's prompt opens the <think>): only 0 pays under answer_tag
FORCED = ["done.</think> <answer>{g}</answer>",             # the right tag after the thinking: 1
          "maybe <answer> {g} </answer>",                     # a tag in a thinking never closed: 0
          "ok.</think> So \\boxed{{{g}}}",                    # no tag (boxed would pay): 0
          "</think> <answer> {g} </answer> <answer>{h}</answer>"]  # the last tag is wrong: 0


def forcing(engine, prompts, comps):
    from test_qwen3_path_sweep import _gold, forced_completion

    tok = engine.tokenizer
    for p, cs in zip(prompts, comps):
        g = _gold(tok, p)
        for k, text in enumerate(FORCED[:len(cs)]):
            ids = tok.encode(text.format(g=g, h=g + 1), add_special_tokens=False) + [EOT]
            cs[k] = forced_completion(engine, p, ids, MAX_NEW, cs[k].logprobs is not None)
    return comps


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return math_folder(tmp_path_factory.mktemp("tag") / "base", base=True)


def test_a_zero_run_pays_only_the_right_tag_after_the_thinking(base, tmp_path):
    """``python -m pacs_fast.train`` (in this process) with R1's template and ``reward.extraction=answer_tag``, 1 step
    of 2 prompts x 4 responses, all forced (:data:`FORCED`): samples.jsonl's rewards are 1, 0, 0, 0 for each prompt
    (the reference pays 0, 1, 1, 1: it reads no number in ``<answer>12</answer>``, the thinking's, the box, the
    first tag), the scorer was told the prompts open the ``<think>``,
    and nothing is warned of (R1's template asks for the tags)."""
    from pacs_fast.train import main
    from test_qwen3_path_sweep import recording

    data = _data(tmp_path / "train.jsonl", n=12)
    text = io.StringIO()
    with recording(forcing) as (calls, _, _), contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        main([f"model.path={base}", f"data.dataset={data}", f"data.prompt_template={R1}",
              "reward.extraction=answer_tag", "rollout.n=4", "rollout.eval_n=1", f"rollout.max_new_tokens={MAX_NEW}",
              "train.prompts_per_step=2", "train.steps=1", "learner.mini_batch_prompts=2",
              "learner.micro_batch_prompts=1", "train.progress=false", "train.plots=false", "train.tensorboard=false",
              "train.log_samples=8", "train.save_every=0", "train.eval_every=0", "data.eval_size=2",
              f"train.out_dir={tmp_path}", "train.run_name=zero"])
    output = text.getvalue()
    assert "Traceback" not in output and "warning:" not in output, output
    assert calls.think_open is True
    samples = [s for s in read_jsonl(tmp_path / "zero" / "samples.jsonl") if "row" in s and s["step"] == 1]
    assert len(samples) == 8
    for first in range(0, 8, 4):
        group = samples[first:first + 4]
        g = int(group[0]["answer"])
        assert [s["response"] for s in group] == [t.format(g=g, h=g + 1) for t in FORCED], group
        assert [s["reward"] for s in group] == [1.0, 0.0, 0.0, 0.0], group
        assert [math_reward(s["response"], s["answer"]) for s in group] == [0.0, 1.0, 1.0, 1.0]


def test_eval_with_answer_tag_scores_records_and_refuses_another_extraction_on_resume(base, tmp_path):
    """``python -m pacs_fast.eval --prompt-template <R1's> --extraction answer_tag``: samples 0 / 1 forced (the right
    tag after the thinking, a tag in a thinking never closed) score 1 / 0, the voted answers are the tag's and none,
    ``run_config.json`` records the extraction, no warning; a rerun into the folder under ``--extraction boxed`` is
    refused before any model loads (its new samples would be scored otherwise), with the warning that boxed cannot
    read R1's format."""
    from pacs_fast import eval as ev
    from pacs_fast.evaluation.results import read_samples
    from test_qwen3_path_sweep import recording

    bench = _data(tmp_path / "toy.jsonl", n=2, offset=50)
    common = ["--model", str(base), "--benchmarks", str(bench), "--n", "2", "--max-tokens", str(MAX_NEW), "--engine",
              "hf", "--out", str(tmp_path / "out"), "--no-progress", "--scorer-workers", "0", "--prompt-template", R1]
    text = io.StringIO()
    with recording(forcing, every_call=True) as (calls, _, _), contextlib.redirect_stdout(text), \
            contextlib.redirect_stderr(text):
        code = ev.main([*common, "--extraction", A])
    assert code == 0 and calls and "warning:" not in text.getvalue(), text.getvalue()
    for r in read_samples(tmp_path / "out" / "samples_toy.jsonl").values():
        g = int(r["answer"])
        assert r["responses"] == [FORCED[0].format(g=g), FORCED[1].format(g=g)], r
        assert r["scores"] == [1.0, 0.0] and r["answers"] == [str(g), None], r
    assert json.loads((tmp_path / "out" / "run_config.json").read_text())["extraction"] == A
    text = io.StringIO()
    with no_model_load(), contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        assert ev.main([*common, "--extraction", "boxed"]) == 2
    lines = text.getvalue().splitlines()
    assert lines[0].startswith("warning: --extraction boxed reads only \\boxed{} answers"), lines
    assert lines[-1].startswith("error:") and "extraction" in lines[-1], lines
