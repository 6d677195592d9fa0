"""The verifier's extraction against the answer format the prompts ask for: a warning line where they disagree.

``reward.extraction=answer_tag`` (eval: ``--extraction answer_tag``) pays only an answer in ``<answer>...</answer>``
(pacs_fast/reward/answer_tag.py): with prompts that never ask for the tag (the default instruction asks for
``\\boxed{}``; a ``data.prompt_template`` / ``data.instruction`` / ``data.system_prompt`` without ``<answer>``), every
response that follows its prompt scores 0. The reverse: ``reward.extraction=boxed`` with prompts that ask for the tag
(R1's template) and never for ``\\boxed{}``: an answer written as asked, unboxed, scores 0. Read off the settings'
texts alone (a chat template's own system message is not seen); silent where a user's ``reward.fn`` scores alone.
"""
from __future__ import annotations

from pacs_fast.config.prompt_template_checks import is_custom, names

TAG = "<answer>"
BOX = "\\boxed"
TRAINER_KEYS = ("reward.extraction=", "data.prompt_template", "data.instruction", "data.system_prompt")
EVAL_FLAGS = ("--extraction ", "--prompt-template", "--instruction", "--system-prompt")


def _asked(template: str, system: str, instruction: str, keys) -> list[tuple[str, str]]:
    """``(key, text)`` of each text the prompts carry that the settings tell: a template of one's own, and the
    ``system`` / ``instruction`` settings it names (``pacs``: the paper's instruction asks for ``\\boxed{}``; its
    system message asks for no format; ``''``: none)."""
    out = [(keys[1], template)] if is_custom(template) else []
    for part, value, key, paper in (("instruction", instruction, keys[2], BOX + "{}"), ("system", system, keys[3], "")):
        if names(template, part) and value:
            out.append((f"{key}{keys[0][-1]}pacs (the default)", paper) if value == "pacs" else (key, value))
    return out


def answer_format_warning(extraction: str, template: str, system: str, instruction: str,
                          flags: bool = False) -> str | None:
    """One line where ``extraction`` cannot read the answer format the prompts ask for (module docstring), else None.
    ``template`` / ``system`` / ``instruction``: the settings as given (``data.prompt_template``, ...);
    ``flags``: name eval's flags (``--extraction``, ...) instead of the trainer's keys."""
    keys = EVAL_FLAGS if flags else TRAINER_KEYS
    asked = _asked(template, system, instruction, keys)
    tags = [key for key, text in asked if TAG in text]
    boxes = [key for key, text in asked if BOX in text]
    if extraction == "answer_tag" and not tags:
        why = (f"{boxes[0]} asks for \\boxed{{}}" if boxes else
               f"neither {keys[1]} nor {keys[2]} names <answer>")
        return (f"{keys[0]}answer_tag pays only an answer in <answer> </answer> tags, but the prompts never ask for "
                f"them ({why}): a response without them scores 0; ask for them in {keys[1]} (R1's template does) or "
                f"{keys[2]}, or use {keys[0]}boxed")
    if extraction == "boxed" and tags and not boxes:
        return (f"{keys[0]}boxed reads only \\boxed{{}} answers, but {tags[0]} asks for the answer in <answer> "
                f"</answer> tags and never for \\boxed{{}}: an answer given there as asked scores 0; use "
                f"{keys[0]}answer_tag")
    return None
