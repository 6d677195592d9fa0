"""Math problem sets: the shipped benchmarks / training sets, and user files (JSONL, parquet or Arrow; a folder
or glob of shards: :mod:`pacs_fast.config.dataset_files`).

Shipped with the package (``pacs_fast/data/benchmarks/``, provenance in ``PROVENANCE.md`` there;
no hub access needed):

========== ====== ==================================================
name       rows   what
========== ====== ==================================================
math500    500    MATH-500 (HuggingFaceH4/MATH-500 = PRM800K test)
amc23      40     AMC 2023 (zwhe99/amc23; answers as integer strings)
aime2024   30     AIME 2024 I+II (Maxwell-Jia/AIME_2024)
aime2025   30     AIME 2025 I+II (yentinglin/aime_2025)
math_train 7,496  MATH train split (the DeepScaleR set was not available)
gsm8k_train 7,473 GSM8K train split
========== ====== ==================================================

Every row becomes a :class:`Problem` ``(id, problem, answer, source, meta)``.
"""
from __future__ import annotations

import gzip
import itertools
import json
import math
import re
import zlib
from dataclasses import dataclass, field
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

from pacs_fast.config.dataset_files import dataset_files
from pacs_fast.reward.verifier import gold_text

BENCHMARKS: dict[str, str] = {
    "math500": "math500.jsonl",
    "amc23": "amc23.jsonl",
    "aime2024": "aime2024.jsonl",
    "aime2025": "aime2025.jsonl",
}
BENCHMARK_SIZES: dict[str, int] = {"math500": 500, "amc23": 40, "aime2024": 30, "aime2025": 30}
TRAIN_SETS: dict[str, str] = {
    "math_train": "math_train.jsonl.gz",
    "gsm8k_train": "gsm8k_train.jsonl.gz",
}
# Display names in tables (the paper's spelling).
DISPLAY_NAMES: dict[str, str] = {"math500": "MATH-500", "amc23": "AMC23", "aime2024": "AIME 2024",
                                 "aime2025": "AIME 2025", "math_train": "MATH (train)",
                                 "gsm8k_train": "GSM8K (train)"}


@dataclass
class Problem:
    """One math problem.

    id: unique within its dataset (a string). problem: the question text (no instruction appended).
    answer: the gold answer as LaTeX text (what :func:`pacs_fast.reward.math_reward` compares to).
    source: where it came from. meta: the row's other fields (solution, level, ...).
    fields: the values of the fields :func:`load_dataset` was asked for by name (``fields=``: what a
    ``reward.fn`` is handed, test cases for instance), as the file holds them, keyed by the name asked for.
    """

    id: str
    problem: str
    answer: str
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    fields: dict[str, Any] = field(default_factory=dict)


def available_datasets() -> list[str]:
    """Names accepted by :func:`load_benchmark` / :func:`load_dataset` besides file paths."""
    return list(BENCHMARKS) + list(TRAIN_SETS)


def shipped_path(name: str) -> Path:
    """Path of a shipped dataset file (``math500``, ..., ``math_train``, ``gsm8k_train``)."""
    files = {**BENCHMARKS, **TRAIN_SETS}
    if name not in files:
        raise ValueError(f"unknown dataset name {name!r}; shipped: {', '.join(files)}")
    return Path(str(resources.files("pacs_fast.data").joinpath("benchmarks", files[name])))


def load_benchmark(name: str, *, limit: int | None = None) -> list[Problem]:
    """A shipped evaluation benchmark (or training set) by name; ``limit`` keeps the first N rows."""
    return load_dataset(shipped_path(name), limit=limit)


def _read_rows(path: Path):
    """:func:`_iter_rows`, with a file that cannot be read (a gzip file cut short or not gzip at all, a damaged
    parquet / arrow file) a ValueError naming it, as a bad line is."""
    try:
        yield from _iter_rows(path)
    except FileNotFoundError:
        raise
    except (OSError, EOFError, zlib.error) as e:
        raise ValueError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None
    except Exception as e:
        if type(e).__module__.split(".")[0] != "pyarrow":  # (pyarrow's ArrowInvalid is a ValueError)
            raise
        raise ValueError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None


def _iter_rows(path: Path):
    """Yields ``(where, row)``: ``where`` is ``file:line`` (JSONL) or ``file row N`` (others), 1-based."""
    name = path.name.lower()
    if name.endswith(".parquet") or name.endswith(".arrow"):
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as e:
            raise ImportError(f"reading {path} needs pyarrow: pip install 'pacs_fast[parquet]'") from e
        if name.endswith(".parquet"):
            batches = pq.ParquetFile(path).iter_batches()
        else:  # Dataset.save_to_disk's shards: Arrow IPC streams (an Arrow IPC file is read as well)
            source = pa.memory_map(str(path))
            try:
                batches = pa.ipc.open_stream(source)
            except pa.ArrowInvalid:
                reader = pa.ipc.open_file(source)
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        i = 0  # a batch at a time: a whole table's rows as Python objects at once took several times the file
        for batch in batches:
            for row in batch.to_pylist():
                i += 1
                yield f"{path} row {i}", row
        return
    opener = gzip.open if name.endswith(".gz") else open
    if name.endswith(".json") or name.endswith(".json.gz"):
        with opener(path, "rb") as f:
            raw = f.read()
        try:
            text = raw.decode("utf-8-sig")  # a leading byte-order mark (Windows editors write one) is not data
        except UnicodeDecodeError as e:
            line = raw.count(b"\n", 0, e.start) + 1
            raise ValueError(f"{path}:{line}: not UTF-8 text ({e.reason} at byte {e.start} of the file)") from None
        try:
            data = _json_loads(text)
        except json.JSONDecodeError as e:
            if e.msg != "Extra data":
                raise ValueError(f"{path}: invalid JSON: {e}") from None
            # one object per line in a .json file (what datasets' Dataset.to_json writes by default); split at
            # "\n" only, as a .jsonl file is: str.splitlines also splits at U+2028 / U+0085, which JSON strings hold
            for i, line in enumerate(text.split("\n"), start=1):
                if line.strip():
                    try:
                        yield f"{path}:{i}", _json_loads(line)
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{i}: invalid JSON ({e.msg} at column {e.colno}; read as one "
                                         f"object per line: the file is not one JSON document)") from None
            return
        if isinstance(data, dict) and text.strip().count("\n") == 0:
            data = [data]  # one object on one line: Dataset.to_json of a one-row dataset
        if not isinstance(data, list):
            raise ValueError(f"{path}: a .json dataset must hold a list of objects, got {type(data).__name__}")
        for i, row in enumerate(data, start=1):
            yield f"{path} row {i}", row
        return
    if not (name.endswith(".jsonl") or name.endswith(".jsonl.gz")):
        raise ValueError(f"{path}: unsupported dataset format (use .jsonl, .jsonl.gz, .json, .parquet or .arrow)")
    with opener(path, "rb") as f:
        for i, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8-sig" if i == 1 else "utf-8")  # a byte-order mark opening the file is not data
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{i}: not UTF-8 text ({e.reason} at byte {e.start} of the line)") from None
            if not line.strip():
                continue
            try:
                yield f"{path}:{i}", _json_loads(line)
            except json.JSONDecodeError as e:
                lone_cr = "\r" in line.rstrip("\r\n").replace("\r\n", "")  # (a CR inside a string is escaped)
                hint = ("; its lines end in a carriage return alone (classic Mac line endings): save the file with "
                        "LF or CRLF line endings" if lone_cr else "")
                raise ValueError(f"{path}:{i}: invalid JSON ({e.msg} at column {e.colno}){hint}") from None


class _LongNumber(Decimal):
    """A JSON number of more significant digits than a float keeps (``0.123456789012345678901``): a gold answer keeps
    its digits (it became ``0.12345678901234568``); any other field gets the float it always got."""


_long_numbers = [0]  # how many :func:`_json_number` has read (rows are walked by :func:`_as_floats` only once it has)


def _json_number(text: str) -> float | Decimal:
    """``json.loads``' ``parse_float``: the float, or a :class:`_LongNumber` when the float would lose digits."""
    value = float(text)
    if not math.isfinite(value) or Decimal(repr(value)) == Decimal(text):  # (1e400: no finite float, refused as before)
        return value
    _long_numbers[0] += 1
    return _LongNumber(text)


def _json_loads(text: str):
    return json.loads(text, parse_float=_json_number)


def _as_floats(value):
    """``value`` with each :class:`_LongNumber` in it a float (what every field but the gold answer holds)."""
    if isinstance(value, _LongNumber):
        return float(value)
    if isinstance(value, dict):
        return {k: _as_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_floats(v) for v in value]
    return value


_MISSING = object()
_UNCHECKED = object()  # load_dataset(system=...) not given: a chat-message problem's system message is not compared


def _field(row: dict, name: str):
    """``row[name]``; a dotted ``name`` not in the row reads nested objects (verl's parquet files keep the
    answer in ``reward_model.ground_truth``). ``_MISSING`` when absent."""
    if name in row:
        return row[name]
    if "." not in name:
        return _MISSING
    value = row
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _answer_text(value: Any, where: str, field_name: str) -> str:
    if isinstance(value, str):
        if not value.strip():
            raise ValueError(f"{where}: field {field_name!r} is empty")
        return value.strip()
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{where}: field {field_name!r} must be a string, a number, a list or an object, got "
                         f"{value!r}")
    if isinstance(value, (int, float, Decimal)):  # a parquet decimal column too
        try:  # positional: 7.2e-05 -> "0.000072" (math-verify reads "e" as Euler's number)
            return gold_text(value)
        except ValueError:  # JSON's NaN / Infinity: never trained as the text "nan"
            raise ValueError(f"{where}: field {field_name!r} is not a finite number ({value!r})") from None
    if isinstance(value, (list, tuple, dict)):  # test cases, several accepted answers: their JSON text, for a
        if not value:                           # reward.fn (json.loads); the math verifier's gold check reads it
            raise ValueError(f"{where}: field {field_name!r} is empty")
        try:
            return json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: field {field_name!r} is not JSON-serialisable ({e})") from None
    raise ValueError(f"{where}: field {field_name!r} must be a string, a number, a list or an object, got "
                     f"{type(value).__name__}")


def _chat_problem(messages: list, where: str, field_name: str, system, system_setting: str) -> str:
    """The problem of a row that gives it as chat messages (verl's ``prompt`` column): its last user message. What
    the prompt would leave out without a word is refused: turns before it (a conversation, few-shot examples), and,
    when ``system`` (the system text the prompts carry) is given, a system message that differs from it."""
    roles = [m.get("role") for m in messages]
    if "user" not in roles:
        raise ValueError(f"{where}: field {field_name!r} holds chat messages without a user message (roles: "
                         f"{', '.join(map(str, roles))}): the problem is the last user message")
    last = len(roles) - 1 - roles[::-1].index("user")
    earlier = [r for i, r in enumerate(roles[:last]) if not (i == 0 and r == "system")]
    if earlier:  # (turns after it, an SFT row's assistant answer, are no part of the prompt)
        raise ValueError(f"{where}: field {field_name!r} holds a conversation (roles: {', '.join(map(str, roles))}): "
                         f"the prompt is built from its last user message alone, and the {len(earlier)} turn(s) "
                         f"before it would be left out without a word; give one user message per row")
    problem = messages[last]["content"]
    if roles[0] == "system" and system is not _UNCHECKED:
        own = messages[0]["content"]
        if not isinstance(own, str) or own.strip() != (system or "").strip():
            ours = f"the prompt's system message {system!r}" if system else "no system message of the run's"
            raise ValueError(f"{where}: field {field_name!r} opens with the system message {str(own)[:80]!r}, which "
                             f"the prompt would replace ({ours}, {system_setting}); set {system_setting} to the "
                             f"row's text, or give rows without a system message")
    return problem


def states_its_answer(problem: str, answer: str) -> bool:
    """Whether ``problem`` states ``answer`` as a final answer, ``\\boxed{answer}`` or ``#### answer`` (white space
    aside): a worked solution given as the problem (``data.problem_key=solution``), which hands the model its answer."""
    if "boxed" not in problem and "####" not in problem:
        return False
    text, gold = " ".join(problem.split()), " ".join(answer.split())
    if not gold:
        return False
    return f"\\boxed{{{gold}}}" in text or re.search(r"####\s*" + re.escape(gold) + r"(?!\S)", text) is not None


def _not_utf8(value) -> bool:
    """Whether ``value`` (a field as read: text, or a list / object of them) holds a lone surrogate."""
    try:
        json.dumps(value, ensure_ascii=False, default=str).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def load_dataset(path: str | Path, *, problem_field: str = "problem", answer_field: str = "answer",
                 id_field: str | None = None, source_field: str = "source",
                 limit: int | None = None, field_settings: str = "problem_field= / answer_field= / id_field=",
                 fields: tuple[str, ...] | list[str] = (), fields_setting: str = "fields=",
                 check_answer=None, check_setting: str = "", system=_UNCHECKED,
                 system_setting: str = "system=") -> list[Problem]:
    """Loads math problems from a file, a folder or glob of shards, or a shipped dataset by name.

    Args:
        path: a ``.jsonl`` / ``.jsonl.gz`` / ``.json`` (a list of objects, or one per line) / ``.parquet`` /
            ``.arrow`` file; a folder of such shards (a hub download, ``Dataset.save_to_disk``'s folder) or a
            glob (``dir/data/train-*.parquet``): :func:`pacs_fast.config.dataset_files.dataset_files`, which
            refuses a folder holding several splits or subsets; ``~`` expanded; or a shipped name (see
            :func:`available_datasets`).
        problem_field, answer_field: the fields holding the question and the gold answer (numbers
            are turned into text: ``27.0`` -> ``"27"``; a list or an object, such as test cases for a
            ``reward.fn``, into its JSON text); a dotted name reads a nested field
            (``reward_model.ground_truth``), and a problem given as chat messages (verl's ``prompt``
            column) is its last user message.
        id_field: the field holding a unique id; by default ``"id"`` when present, else the row
            index (0, 1, ...). Given explicitly, every row must have it.
        source_field: optional field copied into :attr:`Problem.source`.
        limit: keep the first N rows.
        field_settings: how the caller's user names the fields, quoted by the missing-field error
            (the trainer passes ``data.problem_key= / data.answer_key=``).
        fields: more fields every row must have, kept as the file holds them in :attr:`Problem.fields`
            (a dotted name reads a nested field; a null value is kept as None): what a ``reward.fn`` is
            handed (``reward.fn_fields``). ``fields_setting``: how the user names them, for the error.
        check_answer: called with each row's answer text (a reward function's ``check_answer``: the code
            reward's tests); a ValueError it raises names the row, the field and ``check_setting``.
        system: the system message the prompts will carry (None: none); when given, a problem given as chat
            messages that opens with another system message is refused (the prompt would replace it without a
            word), naming ``system_setting``. A conversation (turns before the last user message) is always refused.
    Raises:
        FileNotFoundError: no such file (or nothing in the folder / glob). ValueError: the problem and the
        answer read from one field; a folder of several splits, subsets or formats; bad JSON or a missing / empty
        field, naming the file and line (row), the field and the fields the row has.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if problem_field == answer_field:  # (every prompt held its gold answer, without a word)
        raise ValueError(f"the problem and its gold answer are both read from field {problem_field!r} "
                         f"({field_settings}): every prompt would hold its answer; choose the field holding the "
                         f"question")
    if isinstance(path, str) and path in {**BENCHMARKS, **TRAIN_SETS}:
        path = shipped_path(path)
    out: list[Problem] = []
    long_numbers = _long_numbers[0]
    for where, row in itertools.chain.from_iterable(_read_rows(f) for f in dataset_files(path)):
        if limit is not None and len(out) >= limit:
            break
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
        values = {}
        for name in (problem_field, answer_field) + ((id_field,) if id_field else ()):
            values[name] = _field(row, name)
            if values[name] is _MISSING:
                raise ValueError(f"{where}: missing field {name!r} (the row has: {', '.join(map(str, row))}); "
                                 f"choose the field with {field_settings} (a dotted name reads a nested one: "
                                 f"reward_model.ground_truth)")
        problem = values[problem_field]
        if isinstance(problem, list) and problem and all(isinstance(m, dict) and "content" in m for m in problem):
            # chat messages (verl's "prompt" column): the last user message is the problem
            problem = _chat_problem(problem, where, problem_field, system, system_setting)
        if not isinstance(problem, str) or not problem.strip():
            got = "" if isinstance(problem, str) else f", got {type(problem).__name__}"  # (a columns-oriented .json)
            raise ValueError(f"{where}: field {problem_field!r} must be a non-empty string{got}")
        answer = values[answer_field]
        if _long_numbers[0] != long_numbers:  # (one read since the file's first: a .json list is parsed whole)
            answer = answer if isinstance(answer, _LongNumber) else _as_floats(answer)  # (its digits as a number)
            row = _as_floats(row)
        answer = _answer_text(answer, where, answer_field)
        if check_answer is not None:
            try:
                check_answer(answer)
            except ValueError as e:
                raise ValueError(f"{where}: field {answer_field!r}: {e}"
                                 + (f" ({check_setting})" if check_setting else "")) from None
        if id_field:
            pid = str(values[id_field])
        else:
            pid = str(row["id"]) if "id" in row and row["id"] is not None else str(len(out))
        extra = {}
        for name in fields:
            extra[name] = _field(row, name)
            if extra[name] is _MISSING:
                raise ValueError(f"{where}: missing field {name!r} that {fields_setting} asks for (the row has: "
                                 f"{', '.join(map(str, row))}; a dotted name reads a nested one)")
        for name, value in ((problem_field, problem), (answer_field, answer), (id_field or "id", pid), *extra.items()):
            if _not_utf8(value):  # (a JSON escape "\ud800": the samples file's write failed after the sampling)
                raise ValueError(f"{where}: field {name!r} holds a lone surrogate (a JSON escape such as \\ud800 "
                                 f"without its pair), which is no text UTF-8 can write; fix the row")
        used = {problem_field, answer_field, id_field or "id", source_field}
        meta = {k: v for k, v in row.items() if k not in used}
        out.append(Problem(id=pid, problem=problem, answer=answer,
                           source=str(row.get(source_field) or ""), meta=meta, fields=extra))
    return out
