"""Dataset fields handed to a user's reward function (``reward.fn_fields``, ``eval --reward-fields``).

``reward.fn`` is called as ``function(problems, responses, answers, **fields)``: each field the user
names arrives as one keyword argument, a list with each response's row value (TRL hands a reward
function the dataset's columns this way, verl its ``extra_info``). A dotted name reads a nested field
(``extra_info.tests``) and arrives under its last part (``tests``). The names are checked here, before
any file or model is read.
"""
from __future__ import annotations

import keyword

POSITIONAL = ("problems", "responses", "answers")  # what every call already passes


def field_keyword(name: str) -> str:
    """The keyword argument a dataset field arrives under: its last dotted part."""
    return name.rsplit(".", 1)[-1]


def field_keywords(names, setting: str) -> dict[str, str]:
    """``{field name: keyword}`` for ``names`` (a list of field names, ``setting``: how the user gave
    them, for the error); a ValueError naming ``setting`` for a name that is not text, a keyword that
    is not a Python identifier, one of :data:`POSITIONAL`, or given twice."""
    if not isinstance(names, (list, tuple)):
        raise ValueError(f"{setting} must be a list of dataset field names, got {names!r}")
    out: dict[str, str] = {}
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{setting}: each entry must be a dataset field's name, got {name!r}")
        kw = field_keyword(name)
        if not kw.isidentifier() or keyword.iskeyword(kw):
            raise ValueError(f"{setting}: {name!r} would arrive as the keyword argument {kw!r}, which is not a "
                             f"Python name (the reward function takes each field as a keyword argument)")
        if kw in POSITIONAL:
            raise ValueError(f"{setting}: {name!r} would arrive as {kw!r}, the name of an argument every call already "
                             f"passes ({', '.join(POSITIONAL)})")
        if kw in out.values():
            other = next(n for n, k in out.items() if k == kw)
            raise ValueError(f"{setting}: {other!r} and {name!r} would both arrive as the keyword argument {kw!r}")
        out[name] = kw
    return out


def row_fields(values: dict, keywords: dict[str, str]) -> dict:
    """A row's ``{field name: value}`` (:attr:`pacs_fast.data.datasets.Problem.fields`) as
    ``{keyword: value}``, what a call of the reward function takes from this row."""
    return {kw: values[name] for name, kw in keywords.items()}
