"""Eval of a training run's checkpoint on the prompts the run trained with.

A checkpoint of ``python -m pacs_fast.train`` (``RUN/checkpoints/step_N/``: a model folder holding the run's resolved
``config.yaml`` beside ``trainer_state.json`` / ``manifest.json``, pacs_fast/trainer/checkpoint.py), or a model folder
inside a run's folder (``RUN/<model>/``, ``RUN`` holding ``config.yaml`` and ``checkpoints/``), carries how the run
wrote and scored its prompts: ``data.prompt_template``, ``data.instruction``, ``data.system_prompt``,
``data.chat_template_kwargs``, ``reward.extraction`` and where its responses end, ``rollout.stop``. Eval's flags for
them (``--prompt-template``, ..., ``--stop``) have defaults of their own: a Zero run's checkpoint (R1's template,
``answer_tag``, ``rollout.stop=["</answer>"]``) evaluated without repeating every flag was sampled on the chat
template, past its answer, and scored on boxes, a meaningless accuracy, without a word.

:func:`take_run_prompts`: each of those flags not given on the command line takes the run's value (one ``note:`` line
lists those that change anything); a given flag whose value differs from the run's is one ``warning:`` line naming
both. The values taken are set on ``args`` as if given, so ``run_config.json`` records them as it records flags (a
rerun into the same ``--out`` takes them again and compares alike). A run config that cannot be read, or holds values
eval cannot take, is one ``warning:`` line, and eval goes on with its own defaults. Any other model: nothing changes.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

CONFIG_FILE = "config.yaml"
CHECKPOINT_MARKS = ("trainer_state.json", "manifest.json")
# (args attribute, eval's flag, the run's config key)
PROMPT_FLAGS = (("prompt_template", "--prompt-template", "data.prompt_template"),
                ("instruction", "--instruction", "data.instruction"),
                ("system_prompt", "--system-prompt", "data.system_prompt"),
                ("chat_template_kwargs", "--chat-template-kwargs", "data.chat_template_kwargs"),
                ("extraction", "--extraction", "reward.extraction"),
                ("stop", "--stop", "rollout.stop"))


def given_flags(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The destinations of ``PROMPT_FLAGS`` that ``argv`` gives (``--flag VALUE``, ``--flag=VALUE``, an abbreviation
    argparse accepts; a flag given at its default value is given): ``argv`` parsed again by ``parser`` with those
    defaults replaced by a marker no value is, so that only a given flag's attribute is not the marker. A repeatable
    flag (``--stop``, ``action="append"``: argparse appends to a copy of its default) has None for its marker, which
    argparse starts a list from."""
    dests = [dest for dest, _, _ in PROMPT_FLAGS]
    appended = {a.dest for a in parser._actions if isinstance(a, argparse._AppendAction)}
    defaults, unset = {dest: parser.get_default(dest) for dest in dests}, object()
    markers = {dest: None if dest in appended else unset for dest in dests}
    parser.set_defaults(**markers)
    try:
        parsed = parser.parse_args(argv)
        return {dest for dest in dests if getattr(parsed, dest) is not markers[dest]}
    finally:
        parser.set_defaults(**defaults)


def run_config_of(model: str) -> tuple[Path, str] | None:
    """``(the run's config.yaml, what --model is of the run: "a checkpoint of run RUN")`` for a checkpoint of a
    pacs_fast run, or a model folder inside a run's folder; None for any other model (a hub id, a folder of its
    own)."""
    folder = Path(model)
    if not folder.is_dir():
        return None
    if (folder / CONFIG_FILE).exists() and any((folder / m).is_file() for m in CHECKPOINT_MARKS):
        run = folder.parent.parent if folder.parent.name == "checkpoints" else folder
        return folder / CONFIG_FILE, f"a checkpoint of run {run}"
    parent = folder.resolve().parent
    if (parent / CONFIG_FILE).is_file() and (parent / "checkpoints").is_dir():
        return parent / CONFIG_FILE, f"in the folder of run {parent}"
    return None


def _run_values(path: Path) -> dict[str, object]:
    """The run's prompt settings, ``{args attribute: eval's value}`` (``chat_template_kwargs`` as JSON text); a
    ValueError saying why for a config that cannot be read or holds a value eval cannot take."""
    from pacs_fast.config import DataConfig, RewardConfig, RolloutConfig, read_yaml
    from pacs_fast.config.prompt_template_checks import check_prompt_template
    from pacs_fast.config.stop_string_checks import check_stop_strings
    from pacs_fast.config.validation import check_template_kwargs
    from pacs_fast.reward.verifier import EXTRACTIONS

    saved = read_yaml(path)  # (its keys alone, not load_config: a key a later version dropped is no damage)
    sections = {name: saved.get(name, {}) for name in ("data", "reward", "rollout")}
    for name, section in sections.items():
        if not isinstance(section, dict):
            raise ValueError(f"its {name} section is {type(section).__name__}, not a mapping")
    # (a key it lacks: a run from before the key)
    defaults = {"data": DataConfig(), "reward": RewardConfig(), "rollout": RolloutConfig()}
    values = {}
    for dest, _, key in PROMPT_FLAGS:
        section, name = key.split(".")
        values[dest] = sections[section].get(name, getattr(defaults[section], name))
    check_prompt_template(values["prompt_template"], "data.prompt_template")
    check_template_kwargs(values["chat_template_kwargs"], "data.chat_template_kwargs")
    values["stop"] = sorted(check_stop_strings(values["stop"], "rollout.stop"))  # (as eval's --stop: a sorted list)
    for key in ("instruction", "system_prompt"):
        if not isinstance(values[key], str):
            raise ValueError(f"data.{key} is {values[key]!r}, not a text")
    if values["extraction"] not in EXTRACTIONS:
        raise ValueError(f"reward.extraction {values['extraction']!r} is none of {', '.join(EXTRACTIONS)}")
    try:
        values["chat_template_kwargs"] = json.dumps(values["chat_template_kwargs"], sort_keys=True)
    except (TypeError, ValueError):
        raise ValueError(f"data.chat_template_kwargs {values['chat_template_kwargs']!r} is not JSON") from None
    return values


def _shown(value) -> str:
    """A value on one line, quoted, a long text cut (R1's template is 400 characters)."""
    if isinstance(value, str) and re.fullmatch(r"[\w.-]+", value):
        return value
    text = repr(value)
    return text if len(text) <= 48 else text[:40] + "...'"


def _effect(dest: str, value, template: str):
    """What a prompt flag's value does under ``template``: ``--system-prompt`` / ``--instruction`` the text the prompts
    carry (None where the template names none), ``--chat-template-kwargs`` the variables (none but under the chat
    template), ``--stop`` the set of strings, the others the value."""
    from pacs_fast.config.prompt_template_checks import CHAT

    if dest in ("system_prompt", "instruction"):
        from pacs_fast.data.prompts import prompt_parts

        system, instruction = prompt_parts(value if dest == "system_prompt" else "pacs",
                                           value if dest == "instruction" else "pacs", template)
        return system if dest == "system_prompt" else instruction
    if dest == "chat_template_kwargs":
        try:
            kwargs = json.loads(value or "{}")
        except ValueError:
            return value  # (a bad --chat-template-kwargs: its own error follows)
        return kwargs if template == CHAT else {}
    if dest == "stop":
        return sorted(value, key=repr)  # (the order changes no response)
    return value


def take_run_prompts(args, argv: list[str], parser: argparse.ArgumentParser, *, err=None) -> dict[str, object]:
    """Sets each prompt flag of ``args`` the command line does not give to the value of the run whose checkpoint
    ``args.model`` is (module docstring), with the lines that say so on ``err`` (stderr); returns what it took
    (``{args attribute: value}``; empty for a model that is no run's, or a run config eval cannot read)."""
    from pacs_fast.config.reward_specs import uses_verifier

    err = err or sys.stderr
    found = run_config_of(args.model)
    if found is None:
        return {}
    path, where = found
    try:
        run = _run_values(path)
    except ValueError as e:
        why = " ".join(str(e).split())
        why = why if str(path) in why else f"{path}: {why}"  # (read_yaml's own errors name the file)
        print(f"warning: --model is {where}, whose config cannot be read ({why}): its prompt settings are "
              f"unknown; eval uses its own defaults for the prompt flags not given", file=err)
        return {}
    given = given_flags(parser, argv)
    template = args.prompt_template if "prompt_template" in given else run["prompt_template"]
    taken = {}
    for dest, flag, key in PROMPT_FLAGS:
        if dest == "extraction" and not uses_verifier(args.reward_fn):
            continue  # (the verifier does not score: its extraction is idle, neither taken nor compared)
        if dest in given:
            if _effect(dest, getattr(args, dest), template) != _effect(dest, run[dest], template):
                print(f"warning: {flag} {_shown(getattr(args, dest))} differs from the run's {key} "
                      f"{_shown(run[dest])} (--model is {where}): evaluating with the flag's", file=err)
        elif _effect(dest, run[dest], template) != _effect(dest, parser.get_default(dest), template):
            taken[dest] = run[dest]
            setattr(args, dest, run[dest])
    if taken:
        flags = ", ".join(f"{flag} {_shown(taken[dest])}" for dest, flag, _ in PROMPT_FLAGS if dest in taken)
        print(f"note: --model is {where}: its prompts as trained: {flags} (give a flag to override)", file=err)
    return taken
