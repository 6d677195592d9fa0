"""A model folder's tokenizer as ``AutoTokenizer`` loads it, or one line naming the folder (and the file) that stops
it. A partial or damaged download of the tokenizer's files had given a line without a file (a truncated
``tokenizer.json``: "Expecting value: line 388 column 16 (char 6571)") or transformers' traceback (a
``tokenizer.json`` of the wrong shape: ``KeyError: 'added_tokens'``)."""
from __future__ import annotations

import json
from pathlib import Path

# the JSON files transformers reads for a tokenizer (those a folder has are checked one by one when the load fails)
TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                  "vocab.json", "config.json")


def load_tokenizer(path, *, key: str):
    """``AutoTokenizer.from_pretrained(path)``; a ValueError naming ``key`` (``model.path``, ``--model``), the folder
    and, where one of its tokenizer files is not valid JSON, that file, when it cannot be loaded."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - any failure of the files: one line naming them
        why = _broken_file(path) or " ".join(f"{type(e).__name__}: {e}".split())[:300]
        raise ValueError(f"{key} {str(path)!r}: its tokenizer cannot be loaded ({why}); a partial or damaged "
                         f"download? Fetch the model's files again") from e


def _broken_file(path) -> str | None:
    """``"<file>: not valid JSON (...)"`` for the first tokenizer file of folder ``path`` that does not parse; None
    when each parses (or ``path`` is no folder)."""
    folder = Path(path).expanduser()
    for name in TOKENIZER_JSON:
        file = folder / name
        if not file.is_file():
            continue
        try:
            json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            return f"{file}: not valid JSON ({type(e).__name__}: {e})"
    return None
