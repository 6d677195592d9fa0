"""The check of a list of stop strings (``rollout.stop``, ``pacs_fast.eval --stop``, ``SamplingParams.stop``), in the
config layer so that the config's validation and the rollout engines share it (:mod:`pacs_fast.rollout.stop_strings`
matches them)."""
from __future__ import annotations

import re


def check_stop_strings(stop, name: str = "stop") -> tuple[str, ...]:
    """``stop`` (a list or tuple of non-empty strings, each once) as a tuple; a ValueError naming ``name``
    otherwise (a lone string is refused: it would be read as a list of its characters)."""
    if isinstance(stop, str):
        raise ValueError(f"{name} must be a list of strings, got the string {stop!r} (write [{stop!r}])")
    if not isinstance(stop, (list, tuple)):
        raise ValueError(f"{name} must be a list of strings, got {type(stop).__name__}")
    out: list[str] = []
    for i, s in enumerate(stop):
        if isinstance(s, (int, float)) and not isinstance(s, bool):
            raise ValueError(f"{name}[{i}] must be a string, got the number {s!r}: YAML reads an unquoted number as a "
                             f"number (040 as 32, 1e3 as 1000.0); quote the string as you mean it")
        if not isinstance(s, str) or not s:
            raise ValueError(f"{name}[{i}] must be a non-empty string, got {s!r}")
        if s in out:
            raise ValueError(f"{name}[{i}] repeats {s!r}")
        out.append(s)
    return tuple(out)


def escape_warning(stop, name: str) -> str | None:
    """A warning line for a stop string holding a backslash and ``n`` / ``t`` / ``r`` (two characters: YAML reads
    an escape only inside double quotes, a shell never), which never matches the line break it was meant to be;
    None otherwise."""
    # (a LaTeX command, \\nabla or \\text, is a backslash and lowercase letters: not a typed escape)
    typed = [s for s in stop if isinstance(s, str) and re.search(r"\\[ntr](?![a-z])", s)]
    if not typed:
        return None
    return (f"{name}: {typed[0]!r} holds a backslash and a letter (two characters), not a line break or tab: in a "
            f"config or override write it in double quotes (rollout.stop='[\"\\n\\n\"]'), in a shell as $'\\n'")

