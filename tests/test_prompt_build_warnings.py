"""The warnings about prompts the chat template will not build as meant (``prompt_warnings``) reach every set of
prompts a run samples from, not the training file's alone.

Token-level sweep (2026-12-02), on a Qwen2.5-shaped model: ``python -m pacs_fast.eval`` wrapped a benchmark whose
problems already held the chat template in the template a second time, and sampled a base model (EOS
``<|endoftext|>``) under its ``<|im_end|>`` template to ``--max-tokens`` past the end of its turn, the verifier
reading what followed: both without a word, where the trainer warns. The trainer itself checked its training
problems only: an already-templated ``data.eval_dataset`` was wrapped again silently.
"""
import json

import pytest

from test_chat_template_kwargs import templated_tiny_model
from test_run_safety import cli

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WRAPPED = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"  # a problem given with its template
ALREADY = "already hold the chat template's special tokens"


@pytest.fixture(scope="module")
def chatml_model(tmp_path_factory):
    """The tiny model under a ChatML template whose end of turn, ``<|im_end|>``, is not its EOS (the char
    tokenizer's): a base model under an instruct template."""
    return templated_tiny_model(tmp_path_factory.mktemp("chatml") / "m", CHATML, seed=3)


def _write(path, problems):
    path.write_text("".join(json.dumps({"id": f"q{i}", "problem": p, "answer": str(i)}) + "\n"
                            for i, p in enumerate(problems)))
    return path


def test_eval_warns_about_templated_problems_and_an_end_of_turn_that_does_not_stop(chatml_model, tmp_path, capsys):
    from pacs_fast import eval as ev

    plain = _write(tmp_path / "plain.jsonl", [f"{i}+{i}=" for i in range(4)])
    wrapped = _write(tmp_path / "wrapped.jsonl", [WRAPPED.format(f"{i}+1=") for i in range(4)])
    args = ["--model", str(chatml_model), "--benchmarks", f"{plain},{wrapped}", "--n", "1", "--max-tokens", "2",
            "--engine", "hf", "--out", str(tmp_path / "run"), "--no-progress", "--limit", "3", "--temperature", "0"]
    assert ev.main(args) == 0
    warnings = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning:")]
    # the benchmark that holds the template is named, with the problems asked for (--limit 3); the plain one is not
    assert [x for x in warnings if ALREADY in x] == [
        f"warning: wrapped: 3 of 3 problems {ALREADY} (e.g. '<|im_start|>'): each is wrapped in the template again; "
        f"give the problems as plain text"]
    # the template's own line comes once, naming eval's flag, not the trainer's rollout.max_new_tokens
    turn = [x for x in warnings if "ends an assistant turn with '<|im_end|>'" in x]
    assert len(turn) == 1 and "until --max-tokens;" in turn[0], warnings


def test_the_trainer_checks_its_held_out_set_too(chatml_model, tmp_path, capsys):
    train = _write(tmp_path / "train.jsonl", [f"{i}+{i}=" for i in range(8)])
    held = _write(tmp_path / "held.jsonl", [WRAPPED.format(f"{i}+2=") for i in range(2)] + ["9+1="])
    code, out, err = cli([f"model.path={chatml_model}", f"data.dataset={train}", f"data.eval_dataset={held}",
                          "data.eval_size=3", "rollout.n=2", "rollout.eval_n=1", "rollout.max_new_tokens=2",
                          "train.prompts_per_step=2", "train.steps=1", "learner.mini_batch_prompts=2",
                          "learner.micro_batch_prompts=2", "train.progress=false", f"train.out_dir={tmp_path}",
                          "train.run_name=r", "train.tensorboard=false", "train.plots=false", "train.threads=1"],
                         capsys)
    assert code == 0, err
    lines = [x for x in (out + err).splitlines() if ALREADY in x]
    # the training problems are plain: one line, the held-out set's (2 of its 3 problems)
    assert lines == [f"warning: 2 of 3 held-out problems {ALREADY} (e.g. '<|im_start|>'): each is wrapped in the "
                     f"template again; give the problems as plain text"], out + err
