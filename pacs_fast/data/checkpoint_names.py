"""Names in Hugging Face causal-LM checkpoints: which unit (transformer block or module) a tensor
belongs to. Shared by the learners (export buckets) and the rollout engines (weight sync), which
may not import each other."""
from __future__ import annotations

import re

_BLOCK = re.compile(r"^(.*?\.(?:layers|layer|blocks|h)\.\d+)\.")


def unit_of(name: str) -> str:
    """The unit a parameter belongs to: its transformer block, else its module path."""
    m = _BLOCK.match(name)
    if m:
        return m.group(1)
    return name.rpartition(".")[0] or name
