"""A hostile sweep of the "Zero run" features: ``data.prompt_template`` / ``--prompt-template``,
``reward.extraction=answer_tag`` / ``--extraction answer_tag`` and eval of a run's checkpoint on the run's settings.

Checked (the fixtures of tests/test_prompt_template.py and tests/test_eval_run_prompts.py, by import):

- eval of a checkpoint of a run with ``rollout.stop=["</answer>"]``: ``--stop`` was not taken from the run (R1's
  responses ran past their answer, unlike in training), and the given-flag detection could not tell a given
  ``--stop`` (``action="append"``, default ``[]``: argparse appends to a copy of the marker default) -- FIXED:
  ``--stop`` not given takes ``rollout.stop`` (the note line, ``run_config.json``), a given one that differs is a
  warning line naming both (order aside), one that agrees is silent;
- a template of one's own in Qwen's ``<|im_start|>`` format on a base model (EOS ``<|endoftext|>``): its
  ``<|im_end|>`` is not a stop token, so responses ran past their turn to the token limit, without a word (the chat
  template's own case was warned of) -- FIXED: a warning line, trainer and eval; and problems holding the tokenizer's
  special tokens under ``plain`` or a template of one's own were encoded as those tokens, silently (the chat
  template's case was warned of) -- FIXED: a warning line;
- a template whose ``\\n`` is typed as two characters (an override or a config file without YAML's double quotes,
  and eval's ``--prompt-template``, which never reads escapes: the README's R1 text pasted after it) put a backslash
  and an ``n`` in every prompt, where training's YAML had a line break -- FIXED: a warning line naming the way to
  write it (LaTeX commands, ``\\nabla`` / ``\\times``, are not escapes);
- fine as they were: a problem text holding ``{instruction}`` / ``{system}`` / ``<answer>`` goes in as given;
  ``answer_tag`` reads the last complete tag after the thinking (a tag in a code block before it, or in the
  thinking, is not read; a response stopped at ``</answer>`` keeps the tag whole); an arm of the experiment runner
  holding R1's template in double quotes (its commas and braces) is one override, one not quoted one line.

Left alone: ``--stop`` cannot be emptied to evaluate a stopping run's checkpoint without stop strings (``--stop ''``
is refused: give another ``--out`` and the flag ``--stop`` of a string that never occurs); a ``{problem}`` right
after a LaTeX command (``\\text{problem}``) counts as the placeholder.
"""
from __future__ import annotations

import argparse
import json
import shutil

import pytest
import yaml

from pacs_fast.config import hazard_warnings, load_config
from pacs_fast.data.prompts import fill_template, prompt_warnings
from pacs_fast.reward import score_item
from test_eval_run_prompts import _eval, _said, checkpoint  # noqa: F401 (the Zero run's checkpoint fixture)
from test_prompt_template import R1, base  # noqa: F401 (the Qwen2.5-Math base folder fixture)

QWEN = "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{problem}<|im_end|>\n<|im_start|>assistant\n"


def _stopping(checkpoint, tmp_path):  # noqa: F811
    """A copy of the Zero run's checkpoint whose run had ``rollout.stop: ["</answer>"]``."""
    copy = tmp_path / "RUN" / "checkpoints" / "step_000001"
    shutil.copytree(checkpoint, copy)
    saved = yaml.safe_load((copy / "config.yaml").read_text())
    saved["rollout"]["stop"] = ["</answer>"]
    (copy / "config.yaml").write_text(yaml.safe_dump(saved))
    return copy


def test_eval_takes_the_runs_stop_strings_and_warns_of_another(checkpoint, tmp_path):  # noqa: F811
    """No ``--stop``: the run's ``rollout.stop`` (the note names it; ``run_config.json`` records it); the same
    ``--stop`` given: silent; another: one warning naming both; the given-flag detection reads a repeatable flag."""
    from pacs_fast.eval import _run_parser
    from pacs_fast.evaluation.run_prompts import given_flags

    parser = _run_parser()
    assert "stop" in given_flags(parser, ["--model", "m", "--stop", "a", "--stop=b"])
    assert "stop" not in given_flags(parser, ["--model", "m"]) and parser.get_default("stop") == []
    model = _stopping(checkpoint, tmp_path)
    code, lines = _eval(model, tmp_path / "ev")
    assert code == 0 and not _said(lines, "warning:"), lines
    notes = _said(lines, "note: --model is a checkpoint of run")
    assert len(notes) == 1 and "--stop ['</answer>']" in notes[0], lines
    assert json.loads((tmp_path / "ev" / "run_config.json").read_text())["stop"] == ["</answer>"]
    code, lines = _eval(model, tmp_path / "same", "--stop", "</answer>")
    assert code == 0 and not [line for line in lines if "--stop" in line], lines
    code, lines = _eval(model, tmp_path / "other", "--stop", "\n\n")
    differ = _said(lines, "warning: --stop")
    assert code == 0 and len(differ) == 1 and "rollout.stop ['</answer>']" in differ[0], lines
    assert json.loads((tmp_path / "other" / "run_config.json").read_text())["stop"] == ["\n\n"]


def test_a_template_in_qwens_format_on_a_base_model_and_problems_holding_special_tokens(base):  # noqa: F811
    """Under a template of one's own whose user turn ends with ``<|im_end|>``, not a stop token of the base model: a
    warning (``--max-tokens`` named for eval); with it a stop token, or R1's template: none. Problems holding
    ``<|im_end|>`` under ``plain`` or a template of one's own: a warning that they are encoded as the token."""
    folder, tokenizer = base
    from pacs_fast.rollout.base import folder_stop_ids

    stop = folder_stop_ids(str(folder), tokenizer)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end not in stop
    lines = prompt_warnings(tokenizer, ["What is 1+1?"], stop, prompt_template=QWEN)
    assert len(lines) == 1 and lines[0].startswith("data.prompt_template ends the user's turn with '<|im_end|>'") \
        and "rollout.max_new_tokens" in lines[0], lines
    assert "--prompt-template ends" in prompt_warnings(tokenizer, ["x"], stop, prompt_template=QWEN,
                                                       length_key="--max-tokens")[0]
    assert prompt_warnings(tokenizer, ["x"], [*stop, im_end], prompt_template=QWEN) == []
    assert prompt_warnings(tokenizer, ["x"], stop, prompt_template=R1) == []
    for template in ("plain", R1):
        lines = prompt_warnings(tokenizer, ["a <|im_end|> b", "c"], stop, held_out=["d"], prompt_template=template)
        assert lines == ["1 of 2 problems already hold the tokenizer's special tokens (e.g. '<|im_end|>'): each is "
                         "encoded as those tokens, not as its text; give the problems as plain text"], lines


def test_a_typed_backslash_n_in_a_template_is_warned_of():
    """``\\\\n`` as two characters (an override without YAML's double quotes; eval's flag, which never reads
    escapes): a warning line in the trainer and in eval; a line break, LaTeX commands or YAML's ``"\\\\n"``: none."""
    from pacs_fast.evaluation.args import prompt_flag_warnings

    def said(override):
        return [line for line in hazard_warnings(load_config(None, [override])) if "backslash" in line]

    typed = R1.replace("\n", "\\n")
    assert "\\n" in load_config(None, [f"data.prompt_template={typed}"]).data.prompt_template
    lines = said(f"data.prompt_template={typed}")
    assert len(lines) == 1 and "'\\\\n'" in lines[0] and "double quotes" in lines[0], lines
    assert said(f'data.prompt_template="{typed}"') == []  # (YAML's double quotes: a line break)
    assert said(f"data.prompt_template={R1}") == []
    assert said("data.prompt_template=Use \\nabla and \\times: {problem}") == []
    args = argparse.Namespace(reward_fn="", system_prompt="pacs", instruction="pacs", prompt_template=typed,
                              extraction="answer_tag")
    lines = prompt_flag_warnings(args)
    assert len(lines) == 1 and lines[0].startswith("--prompt-template 'A conversation") and "$'" in lines[0], lines
    assert prompt_flag_warnings(argparse.Namespace(**{**vars(args), "prompt_template": R1})) == []


def test_what_held_hostile_text_and_the_runners_quoting():
    """Fine as they were: a problem's ``{instruction}`` / ``<answer>`` goes in as given; ``answer_tag`` reads the tag
    after the thinking, not one in a code block before it; an arm with R1's template quoted is one override."""
    from pacs_fast.config.loading import parse_override
    from pacs_fast.experiment_args import parse_arm

    problem = "Is {instruction} {system} <answer>3</answer> a trap?"
    assert fill_template(R1, problem, instruction="I", system="S") == R1.replace("{problem}", problem)
    code = "<think>```\n<answer>3</answer>\n```</think> <answer>12</answer>"
    assert (score_item(code, "12", extraction="answer_tag").score,
            score_item("</think> ```<answer>3</answer>``` then", "3", extraction="answer_tag").score) == (1.0, 1.0)
    assert score_item("<think>x <answer>12</answer></think>", "12", extraction="answer_tag").score == 0.0
    arm = parse_arm(f"zero:data.prompt_template={json.dumps(R1)},reward.extraction=answer_tag")
    assert len(arm.overrides) == 2 and parse_override(arm.overrides[0]) == ("data.prompt_template", R1)
    with pytest.raises(ValueError, match="must look like section.key=value") as e:
        parse_arm(f"zero:data.prompt_template={R1}")  # (unquoted: R1's commas split it)
    assert "\n" not in str(e.value)
