"""``extraction="answer_tag"`` (``reward.extraction``, ``eval --extraction``): the answer of an R1-Zero-style response.

DeepSeek-R1's "Zero" template asks for "<think> reasoning process here </think> <answer> answer here </answer>" and
the recipes that train on it (Dr. GRPO's oat, Open-Reasoner-Zero, TRL's R1 examples) pay the answer in the tag. Here:

- the answer is the content of the **last complete** ``<answer>...</answer>`` pair of the response's answer part,
  the text after its last ``</think>`` (:func:`~pacs_fast.reward.boxes.answer_part`, as ``"boxed"`` reads it: a tag
  inside the thinking is a draft and is not read; where the prompt opened the ``<think>`` -- R1's template ends with
  "Assistant: <think>" -- a response that never closed it has no answer part, so no answer);
- white space around the content is dropped (``<answer>\\n 5 \\n</answer>`` is 5); an empty tag is no answer;
- several tags: the last complete one is read (a restated or corrected answer); an ``<answer>`` left open after it
  (a response cut by the token limit) is skipped, as an open box is, and one left open with none complete before it
  states no answer (0);
- the content is read as a boxed answer is, ``\\boxed{<content>}``, by the same verifier (math-verify after
  :func:`~pacs_fast.reward.verifier.normalize_math_text`, or the exact integer fast path: ``<answer>42</answer>``
  never imports sympy), so ``$\\frac{1}{2}$``, ``x = 5`` and ``3, 5`` read as they do in a box, and prose ("The
  answer is 5") is no answer of the tag's; content whose braces do not balance is no answer;
- a ``\\boxed{}`` (or ``\\fbox{}``) inside the tag is read as its box: the content's complete boxes, under
  ``"boxed"``'s rules (several: a box that alone is the gold pays only if every box does; an empty or open box is
  no box);
- no complete tag: no answer, score 0 (``no_answer``), however right the text around it (an unformatted response
  earns nothing, as an unboxed one under ``"boxed"``). The tags are matched as written, lower case.

:func:`tag_as_box` turns a response's answer part into the text the ``"boxed"`` reading then reads
(:func:`~pacs_fast.reward.verifier.read_part`); pure text functions, linear time, no math-verify import.
"""
from __future__ import annotations

from pacs_fast.reward.boxes import box_list

ANSWER_TAG = "answer_tag"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"


def tag_content(text: str) -> str | None:
    """The stripped content of the last complete ``<answer>...</answer>`` of ``text``, or None where it has none
    (module docstring). ``"<answer>4</answer> <answer> 5 </answer><answer>6"`` -> ``"5"``."""
    end = text.rfind(ANSWER_CLOSE)
    start = text.rfind(ANSWER_OPEN, 0, max(end, 0))
    if end < 0 or start < 0:
        return None
    return text[start + len(ANSWER_OPEN):end].strip()


def tag_as_box(part: str) -> str:
    """What ``"boxed"`` reads for the answer part ``part``: the tag's content as ``\\boxed{<content>}``, the content
    itself where it holds a box of its own, ``""`` (no answer) without a complete, non-empty tag or where the
    content's braces do not balance."""
    content = tag_content(part)
    if not content:
        return ""
    if "\\boxed" in content or "\\fbox" in content:
        return content
    box = "\\boxed{" + content + "}"
    return box if box_list(box) == [box] else ""

