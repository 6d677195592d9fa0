"""A model folder's tokenizer as ``AutoTokenizer`` loads it, or one line naming the folder (and the file) that stops
it. A partial or damaged download of the tokenizer's files had given a line without a file (a truncated
``tokenizer.json``: "Expecting value: line 388 column 16 (char 6571)") or transformers' traceback (a
``tokenizer.json`` of the wrong shape: ``KeyError: 'added_tokens'``). The trainer and eval check a model folder's
JSON files before this (:func:`pacs_fast.config.model_files.model_folder_problem`); a library caller's folder is
checked here when the load fails."""
from __future__ import annotations

from pacs_fast.config.model_files import json_file_problem
from pacs_fast.config.remote_code import trusted


def load_tokenizer(path, *, key: str):
    """``AutoTokenizer.from_pretrained(path)``; a ValueError naming ``key`` (``model.path``, ``--model``), the folder
    and, where one of its tokenizer files is not valid JSON, that file, when it cannot be loaded."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trusted())
    except Exception as e:  # noqa: BLE001 - any failure of the files: one line naming them
        why = json_file_problem(path) or " ".join(f"{type(e).__name__}: {e}".split())[:300]
        raise ValueError(f"{key} {str(path)!r}: its tokenizer cannot be loaded ({why}); a partial or damaged "
                         f"download? Fetch the model's files again") from e
