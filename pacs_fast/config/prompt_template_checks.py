"""``data.prompt_template`` / eval's ``--prompt-template``: how each prompt is written.

``chat`` (the default) is the tokenizer's chat template where it has one, else the plain format; ``plain`` is the
plain format even where the tokenizer has a chat template (a base model trained R1-Zero style: base Qwen2.5 ships
one); anything else is a text of the user's own (R1's "A conversation between User and Assistant. ...\\nUser:
{problem}\\nAssistant: <think>", Qwen2.5-Math's ``<|im_start|>system ...``) holding ``{problem}`` once, and, where
it wants them, ``{instruction}`` and ``{system}`` (``data.instruction``'s / ``data.system_prompt``'s text, empty
when that is none). Only those literal placeholders are replaced (pacs_fast/data/prompts.py ``fill_template``), never
as ``str.format`` would: a template's other braces (``\\boxed{}``) stay as written.

A text without ``{problem}``, with it twice, or with another ``{word}`` of letters and underscores (a typo such as
``{question}``) is refused in one line naming the key, before any model loads. A ``{word}`` right after a LaTeX
command, a ``}``, ``^`` or ``_`` (``\\text{answer}``, ``\\frac{a}{b}``, ``x^{n}``) is LaTeX's, not a placeholder.
"""
from __future__ import annotations

import re

CHAT, PLAIN = "chat", "plain"
PLACEHOLDERS = ("problem", "instruction", "system")
_WORD = re.compile(r"\{([A-Za-z_]+)\}")
_LATEX_BEFORE = re.compile(r"(?:\\[A-Za-z]+|[}^_])$")
_TYPED_ESCAPE = re.compile(r"\\[ntr](?![a-z])")  # (a LaTeX command, \nabla or \times, goes on in lower case)


def is_custom(template: str) -> bool:
    """Whether ``template`` is a text of the user's own (not ``chat`` or ``plain``)."""
    return template not in (CHAT, PLAIN)


def names(template: str, part: str) -> bool:
    """Whether the prompts carry ``part`` (``"system"`` / ``"instruction"``) under ``template``: ``chat`` and
    ``plain`` carry both, a text of its own those it names (``{system}`` / ``{instruction}``)."""
    return not is_custom(template) or "{" + part + "}" in template


def shown(template: str, key: str) -> str:
    """``key=<the text>`` (a flag: ``key <the text>``), the text quoted on one line and cut at 80 characters."""
    text = repr(template[:80]) + ("..." if len(template) > 80 else "")
    return f"{key} {text}" if key.startswith("--") else f"{key}={text}"


def check_prompt_template(template, key: str) -> str:
    """``template`` as a prompt template (module docstring), or a ValueError naming ``key`` on one line."""
    if not isinstance(template, str):
        raise ValueError(f"{key} must be a text: chat, plain or a template holding {{problem}}, got {template!r}")
    if not is_custom(template):
        return template
    for m in _WORD.finditer(template):  # (first: {question} for {problem} is a typo, not a template without it)
        if m.group(1) not in PLACEHOLDERS and not _LATEX_BEFORE.search(template, 0, m.start()):
            raise ValueError(f"{shown(template, key)} holds {m.group(0)}, which is no placeholder: a template "
                             f"takes {{problem}}, {{instruction}} and {{system}} (other braces, as \\boxed{{}}'s, "
                             f"stay as written)")
    count = template.count("{problem}")
    if count != 1:
        where = ("does not hold {problem}, where each problem goes" if not count else
                 f"holds {{problem}} {count} times: it takes it once")
        raise ValueError(f"{shown(template, key)} {where}; give chat (the chat template), plain (the plain "
                         f"format) or a text holding {{problem}} once (and {{instruction}} / {{system}} where they go)")
    return template


def typed_escape_warning(template, key: str) -> str | None:
    """A warning line for a template of one's own holding a backslash and ``n`` / ``t`` / ``r`` (two characters: a
    YAML value reads an escape only inside double quotes, a shell or an eval flag never), which the model sees as
    written instead of the line break meant (R1's ``\\nUser: {problem}\\nAssistant:``); None otherwise."""
    if not isinstance(template, str) or not is_custom(template):
        return None
    m = _TYPED_ESCAPE.search(template)
    if not m:
        return None
    how = ("in a shell as $'...' (bash reads \\n there) or from the run's checkpoint (--model RUN/checkpoints/..., "
           "no --prompt-template)" if key.startswith("--") else
           "in a config or override in YAML's double quotes (data.prompt_template='\"...\\n...\"')")
    return (f"{shown(template, key)} holds {m.group(0)!r}, a backslash and a letter (two characters), not a line "
            f"break or tab: every prompt carries it as written; write the line break {how}")
