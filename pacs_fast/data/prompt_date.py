"""Chat templates that date their prompts: one date for a whole run, its resumes included.

Llama 3.2's and 3.3's templates write ``Today Date: <d b Y>`` from transformers' ``strftime_now`` (the clock when a
prompt is rendered) unless the ``date_string`` variable is given. A run resumed on another day, or an eval resumed
into the same folder, rendered other prompts than its first session's, without a word (sweep of 2026-12-07). Here
the first session's date is given as ``date_string`` in every later one: the trainer keeps it in each checkpoint
(``prompt_date``), eval in its settings file. A ``date_string`` the user gives is theirs. A template that reads the
clock with no ``date_string`` to set it (gpt-oss's ``Current date: %Y-%m-%d``, SmolLM3's ``Today Date``) gets a
stopped clock instead: a template variable ``strftime_now`` (the render's variables take the place of transformers'
global of that name) that gives the first session's date at midnight; a warning line where neither changes it.
"""
from __future__ import annotations

from datetime import datetime

from pacs_fast.config.prompt_template_checks import CHAT

DATE_FORMAT = "%d %b %Y"  # Llama 3.1-3.3's "Today Date: 26 Jul 2024"


def today() -> str:
    """Today's date as Llama 3's templates write it (the local clock, read as transformers' ``strftime_now`` reads
    it)."""
    return datetime.now().strftime(DATE_FORMAT)


def reads_the_clock(tokenizer) -> bool:
    """Whether the tokenizer's chat template (any of its named ones) calls transformers' ``strftime_now``."""
    template = getattr(tokenizer, "chat_template", None)
    texts = template.values() if isinstance(template, dict) else [template]
    return any(isinstance(t, str) and "strftime_now" in t for t in texts)


def stopped_clock(date: str):
    """transformers' ``strftime_now`` (``fmt -> str``) stopped at ``date`` (:data:`DATE_FORMAT`), midnight."""
    when = datetime.strptime(date, DATE_FORMAT)
    return lambda fmt: when.strftime(fmt)


def pinned_date_kwargs(tokenizer, template_kwargs: dict | None, date: str, *, key: str, again: str,
                       prompt_template: str = CHAT) -> tuple[dict, str | None, str | None]:
    """``(template kwargs, the date pinned or None, a line to print or None)``. For a template that reads the
    clock and no ``date_string`` in ``template_kwargs`` (``key`` names the setting): ``date`` given as
    ``date_string`` when that changes the prompt, else as a stopped clock (:func:`stopped_clock`, the variable
    ``strftime_now``: for rendering only, never recorded) when that does, else a warning that ``again``, a resume on
    another day, renders other prompts. Nothing where the prompts are not the chat template's (``prompt_template``
    plain or a text of the user's own: ``data.prompt_template``), which no clock reaches."""
    from pacs_fast.data.prompts import build_prompt

    kwargs = dict(template_kwargs or {})
    if "date_string" in kwargs or prompt_template != CHAT or not reads_the_clock(tokenizer):
        return kwargs, None, None

    def differ(name: str, values) -> bool:  # (whether the variable `name` changes the prompt)
        first, second = (build_prompt(tokenizer, "1+1?", use_chat_template=True, template_kwargs={**kwargs, name: v})
                         for v in values)
        return first != second

    note = f"note: the chat template dates its prompts (strftime_now): they say {date!r} for the whole run, its resumes"
    try:
        if differ("date_string", ("01 Jan 2000", "02 Jan 2000")):
            return {**kwargs, "date_string": date}, date, f"{note} included ({key} with date_string sets another)"
        if differ("strftime_now", (stopped_clock("01 Jan 2000"), stopped_clock("02 Jan 2000"))):
            return {**kwargs, "strftime_now": stopped_clock(date)}, date, f"{note} included (its clock is stopped)"
    except Exception:  # (a template that cannot render this is reported where the prompts are built)
        return kwargs, None, None
    return kwargs, None, (f"warning: the chat template writes the day it renders a prompt (strftime_now) and "
                          f"date_string does not set it: {again} on another day renders other prompts")
