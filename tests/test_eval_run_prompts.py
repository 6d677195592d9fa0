"""``python -m pacs_fast.eval --model <a training run's checkpoint>``: the prompt flags not given take the run's
``data.prompt_template`` / ``data.instruction`` / ``data.system_prompt`` / ``data.chat_template_kwargs`` /
``reward.extraction`` (pacs_fast/evaluation/run_prompts.py).

One real short ``python -m pacs_fast.train`` (in this process) on the Qwen2.5-Math-shaped base folder of
tests/test_prompt_template.py with R1's template and ``reward.extraction=answer_tag`` (a Zero run), then evals of its
checkpoint: with no prompt flag, R1's prompts, the ``answer_tag`` extraction, a note line, both recorded in
``run_config.json`` (a rerun into the folder sees the same settings; ``eval compare`` tells them apart from the chat
template's); a flag given wins, with a warning naming both values (a flag at eval's default value is given too); a
model that is no run's: nothing said, eval's defaults; a damaged run config: one warning line, eval's defaults.
"""
from __future__ import annotations

import contextlib
import io
import json
import shutil

import pytest

from test_llama3_path_sweep import _data
from test_prompt_template import R1, base  # noqa: F401 (the base folder fixture)
from test_qwen25_math_path_sweep import no_model_load

A = "answer_tag"


def _r1(i: int) -> str:
    return R1.replace("{problem}", f"What is {i} plus {i % 7}?")


@pytest.fixture(scope="module")
def checkpoint(base, tmp_path_factory):  # noqa: F811
    """A Zero run's checkpoint (``RUN/checkpoints/step_000001``): 1 step of 2 prompts x 2 responses of 4 tokens."""
    from pacs_fast.train import main

    folder, _ = base
    tmp = tmp_path_factory.mktemp("run_prompts")
    data = _data(tmp / "train.jsonl", n=12)
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        main([f"model.path={folder}", f"data.dataset={data}", f"data.prompt_template={R1}",
              f"reward.extraction={A}", "rollout.n=2", "rollout.eval_n=1", "rollout.max_new_tokens=4",
              "train.prompts_per_step=2", "train.steps=1", "learner.mini_batch_prompts=2",
              "learner.micro_batch_prompts=1", "train.progress=false", "train.plots=false",
              "train.tensorboard=false", "train.save_every=1", "train.eval_every=0", "data.eval_size=2",
              f"train.out_dir={tmp}", "train.run_name=zero"])
    step = tmp / "zero" / "checkpoints" / "step_000001"
    assert (step / "config.yaml").is_file(), text.getvalue()
    return step


def _eval(model, out, *flags, load=True) -> tuple[int, list[str]]:
    """``python -m pacs_fast.eval`` (its ``main``) on 2 toy problems, 1 greedy sample of 4 tokens each: exit code and
    stderr / stdout lines (``load=False``: any model load fails, for a run refused before it)."""
    from pacs_fast import eval as ev

    bench = _data(out.parent / "toy.jsonl", n=2, offset=50)
    text = io.StringIO()
    with (contextlib.nullcontext() if load else no_model_load()), contextlib.redirect_stdout(text), \
            contextlib.redirect_stderr(text):
        code = ev.main(["--model", str(model), "--benchmarks", str(bench), "--temperature", "0", "--max-tokens", "4",
                        "--engine", "hf", "--out", str(out), "--no-progress", "--scorer-workers", "0", *flags])
    return code, text.getvalue().splitlines()


def _said(lines: list[str], kind: str) -> list[str]:
    return [line for line in lines if line.startswith(kind)]


def test_a_checkpoint_is_evaluated_on_the_prompts_its_run_trained_with(checkpoint, tmp_path):
    """No prompt flag: the samples' prompts are R1's text around each problem, ``run_config.json`` records R1's
    template and ``answer_tag`` as given flags are, one note line names both; a rerun into the folder with no flag
    resumes (the same settings), one with ``--prompt-template chat`` is refused (other settings); ``eval compare``
    names the template against an eval of the same checkpoint on the chat template."""
    from pacs_fast import eval as ev

    out = tmp_path / "ev"
    code, lines = _eval(checkpoint, out)
    assert code == 0 and not _said(lines, "warning:"), lines
    notes = _said(lines, "note: --model is a checkpoint of run")
    assert len(notes) == 1 and f"--extraction {A}" in notes[0] and "--prompt-template 'A conversation" in notes[0] \
        and str(checkpoint.parent.parent) in notes[0] and "give a flag to override" in notes[0], lines
    records = [json.loads(x) for x in (out / "samples_toy.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in records] == [_r1(50), _r1(51)]
    settings = json.loads((out / "run_config.json").read_text())
    assert (settings["prompt_template"], settings["extraction"], settings["system"], settings["instruction"],
            settings["template_kwargs"]) == (R1, A, None, None, {}), settings
    code, lines = _eval(checkpoint, out, load=False)  # (every problem sampled: nothing loads)
    assert code == 0 and not _said(lines, "error:") and _said(lines, "note:"), lines
    code, lines = _eval(checkpoint, out, "--prompt-template", "chat", load=False)
    assert code == 2 and "prompt_template" in lines[-1] and "other settings" in lines[-1], lines
    code, lines = _eval(checkpoint, tmp_path / "chat", "--prompt-template", "chat", "--extraction", "reference")
    assert code == 0, lines
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        assert ev.main(["compare", str(out / "results.json"), str(tmp_path / "chat" / "results.json"),
                        "--out", str(tmp_path / "plot.png")]) == 0, text.getvalue()
    assert [line for line in _said(text.getvalue().splitlines(), "warning:") if "prompt_template" in line], \
        text.getvalue()


def test_a_flag_given_wins_and_a_warning_names_both_values(checkpoint, tmp_path):
    """``--extraction boxed`` given: the run's template is still taken (the note names it alone), the extraction is
    the flag's, recorded so, and one warning line names boxed and the run's answer_tag; ``--prompt-template chat``,
    eval's default value, given: the chat template's prompts, and the warning names it and R1's."""
    code, lines = _eval(checkpoint, tmp_path / "boxed", "--extraction", "boxed")
    assert code == 0, lines
    differ = _said(lines, "warning: --extraction boxed differs from the run's reward.extraction answer_tag")
    assert len(differ) == 1 and "checkpoint of run" in differ[0], lines
    notes = _said(lines, "note: --model is")
    assert len(notes) == 1 and "--prompt-template" in notes[0] and "--extraction" not in notes[0], lines
    code, lines = _eval(checkpoint, tmp_path / "chat", "--prompt-template=chat")
    assert code == 0, lines
    differ = _said(lines, "warning: --prompt-template chat differs from the run's data.prompt_template 'A conv")
    assert len(differ) == 1, lines
    notes = _said(lines, "note: --model is")  # (the extraction taken; the template given)
    assert len(notes) == 1 and f"--extraction {A}" in notes[0] and "--prompt-template" not in notes[0], lines
    settings = json.loads((tmp_path / "chat" / "run_config.json").read_text())
    assert (settings["prompt_template"], settings["extraction"]) == ("chat", A), settings
    prompt = json.loads((tmp_path / "chat" / "samples_toy.jsonl").read_text().splitlines()[0])["prompt"]
    assert prompt.startswith("<|im_start|>system") and "<think>" not in prompt, prompt


def test_a_model_of_no_run_changes_nothing_and_a_model_in_a_runs_folder_takes_its_run(base, checkpoint,  # noqa: F811
                                                                                      tmp_path):
    """The base folder (no run's): no note, no warning of a run's (only the base template's own about its end of
    turn), eval's defaults recorded. A model folder inside a run's folder
    (an export beside its ``config.yaml``, no checkpoint files of its own) takes the run's settings."""
    folder, _ = base
    code, lines = _eval(folder, tmp_path / "base")
    assert code == 0 and not [line for line in lines if "--model is" in line or "the run's" in line], lines
    settings = json.loads((tmp_path / "base" / "run_config.json").read_text())
    assert (settings["prompt_template"], settings["extraction"]) == ("chat", "reference"), settings
    export = checkpoint.parent.parent / "export"
    shutil.copytree(checkpoint, export, ignore=shutil.ignore_patterns("config.yaml", "trainer_state*", "manifest.json"))
    code, lines = _eval(export, tmp_path / "export")
    assert code == 0, lines
    notes = _said(lines, "note: --model is in the folder of run")
    assert len(notes) == 1 and f"--extraction {A}" in notes[0], lines


@pytest.mark.parametrize("damage", ["data: [unclosed", "data: 3", "reward: {extraction: tags}",
                                    "data: {prompt_template: 'no placeholder'}"])
def test_a_damaged_run_config_is_one_warning_and_evals_defaults(checkpoint, tmp_path, damage):
    """The checkpoint's ``config.yaml`` cut, not a mapping, or holding a value eval cannot take: one warning line
    naming the file, no traceback, and eval goes on with its own defaults (recorded so)."""
    copy = tmp_path / "RUN" / "checkpoints" / "step_000001"
    shutil.copytree(checkpoint, copy)
    (copy / "config.yaml").write_text(damage + "\n")
    code, lines = _eval(copy, tmp_path / "ev")
    assert code == 0 and "Traceback" not in "\n".join(lines) and not _said(lines, "note: --model"), lines
    warned = _said(lines, "warning: --model is a checkpoint of run")
    assert len(warned) == 1 and str(copy / "config.yaml") in warned[0] and "cannot be read" in warned[0], lines
    settings = json.loads((tmp_path / "ev" / "run_config.json").read_text())
    assert (settings["prompt_template"], settings["extraction"]) == ("chat", "reference"), settings
