"""A model folder's own code (``auto_map`` in its ``config.json`` or ``tokenizer_config.json``: a configuration, model
or tokenizer class in a Python file of the folder, e.g. ``modeling_internlm3.py``), which transformers runs only when
told to (``trust_remote_code=True``; left unsaid it asks on the terminal, then refuses), and whether this process
runs it: ``model.trust_remote_code`` (train) / ``--trust-remote-code`` (eval), set once by the command before anything
loads (:func:`trust`) and read by every loader (:func:`trusted`), the engines' and vLLM's included.
"""
from __future__ import annotations

import json
from pathlib import Path

_TRUSTED = False


def trust(on: bool) -> None:
    """Sets whether this process runs a model folder's own code (the command's setting)."""
    global _TRUSTED
    _TRUSTED = bool(on)


def trusted() -> bool:
    """Whether this process runs a model folder's own code: what every ``from_pretrained`` here is given as
    ``trust_remote_code`` (never None: transformers would ask on the terminal)."""
    return _TRUSTED


def custom_code(folder) -> list[str]:
    """The classes ``folder``'s ``config.json`` and ``tokenizer_config.json`` map to code of the folder (their
    ``auto_map`` values, ``module.Class``; a hub reference ``org/repo--module.Class`` as given), in order, each once;
    empty for the many models transformers implements."""
    out: list[str] = []
    for name in ("config.json", "tokenizer_config.json"):
        try:
            data = json.loads((Path(folder) / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        auto_map = data.get("auto_map") if isinstance(data, dict) else None
        if not isinstance(auto_map, dict):
            continue
        for value in auto_map.values():
            for ref in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(ref, str) and ref and ref not in out:
                    out.append(ref)
    return out


def remote_code_problem(folder, key: str) -> str | None:
    """``"runs code of its own (...): give <key> ..."`` when ``folder`` holds its own code (:func:`custom_code`) and
    this process does not run it (:func:`trusted`), else None."""
    refs = custom_code(folder)
    if not refs or trusted():
        return None
    files = sorted({ref.split("--")[-1].rsplit(".", 1)[0] + ".py" for ref in refs})
    return (f"runs code of its own ({', '.join(files)}: auto_map {', '.join(refs[:3])}"
            f"{', ...' if len(refs) > 3 else ''}), which transformers runs only when trusted: read those files, then "
            f"give {key} to run them")
