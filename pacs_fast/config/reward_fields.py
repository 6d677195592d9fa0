"""Dataset fields handed to a user's reward function (``reward.fn_fields``, ``eval --reward-fields``).

``reward.fn`` is called as ``function(problems, responses, answers, **fields)``: each field the user
names arrives as one keyword argument, a list with each response's row value (TRL hands a reward
function the dataset's columns this way, verl its ``extra_info``). A dotted name reads a nested field
(``extra_info.tests``) and arrives under its last part (``tests``). The names are checked here, before
any file or model is read.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import keyword
import pickle

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
        if kw.isdigit():
            raise ValueError(f"{setting}: {name!r} names a list item; a dotted name reads the keys of nested objects, "
                             f"not list positions: hand the whole list ({name.rsplit('.', 1)[0]!r}) and index it in "
                             f"the function")
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


_UNIQUE = itertools.count()


class RowFields(dict):
    """A row's ``{keyword: value}``, with :attr:`memo_key` computed once (a scorer keys its memo by it on every
    call; a row of 1 MB of test cases was serialised again each time)."""

    _memo_key: str | None = None

    @property
    def memo_key(self) -> str:
        if self._memo_key is None:
            self._memo_key = _pickle_key(self)
        return self._memo_key


def memo_key(values: dict) -> str:
    """A key of ``values`` for a scorer's memo: the SHA-1 of their pickle, which keeps apart what JSON (or a
    ``repr``) would mix up (a tuple and a list, bytes and their text, two long numpy arrays that differ in the
    middle); a value that cannot be pickled gets a key of its own (scored, never found again). A
    :class:`RowFields` computes it once and keeps it."""
    return values.memo_key if isinstance(values, RowFields) else _pickle_key(values)


def _pickle_key(values: dict) -> str:
    try:
        return hashlib.sha1(pickle.dumps(dict(values), protocol=4)).hexdigest()  # (a plain dict: no class, no state)
    except Exception:  # noqa: BLE001 - an object pickle refuses (a lambda, a lock): no memo for it
        return f"unique-{next(_UNIQUE)}"


def fields_digest(values: dict) -> str:
    """SHA-1 of ``values``' JSON (keys sorted; values JSON cannot hold by their ``repr``): stable from one
    process to the next, for what a resume compares (the trainer's data digest, eval's samples records)."""
    try:
        text = json.dumps(values, sort_keys=True, ensure_ascii=False, default=repr)
    except TypeError:  # keys of mixed types cannot be sorted
        text = json.dumps(values, ensure_ascii=False, default=repr)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def row_fields(values: dict, keywords: dict[str, str]) -> RowFields:
    """A row's ``{field name: value}`` (:attr:`pacs_fast.data.datasets.Problem.fields`) as
    ``{keyword: value}``, what a call of the reward function takes from this row."""
    return RowFields({kw: values[name] for name, kw in keywords.items()})
