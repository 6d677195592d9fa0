"""Process (step-level) rewards in the trainer: PURE's min-form credit assignment, or the summation form.

Set ``reward.step_rewards = "module:function"`` (with ``algo.name=rloo``). Every training step the
trainer cuts each response into steps and calls the function once per process, on the responses
that process trains on (its data-parallel group's share; the ranks of a tensor-parallel group
each call it on the same share)::

    function(prompts: list[str], steps: list[list[str]], answers: list[str]) -> list[list[float]]

``prompts[b]``: the text the model was prompted with (chat template included), ``steps[b]``:
response ``b``'s steps in order, ``answers[b]``: the problem's reference answer; one entry per
response (``G`` consecutive entries share a prompt). It returns one finite reward per step (a
process reward model's scores, or any rule).

Steps: a step ends with the token that completes an occurrence of ``reward.step_split`` (default
``"\\n\\n"``); what follows the last delimiter is the last step. A step's text is the decode of its
tokens, so a multi-byte character split across tokens is never cut.

Advantages (``[B, T]`` per token, :func:`pacs_fast.algorithms.process_rewards.process_advantages`):
a token of step ``k`` of response ``b`` gets

    (G_k + w R_b)  -  mean over the group's other responses b' of (G'_0 + w R_b')

with ``G_k = min_{j >= k} r_j`` (``algo.credit=min``, PURE) or ``sum_{j >= k} gamma^(j-k) r_j``
(``algo.credit=sum``, ``algo.gamma``), ``R`` the verifier's reward and ``w =
reward.outcome_weight`` (PURE's "PRM + VR"; 0 = process rewards only). They replace RLOO's outcome
advantage in the clipped policy loss (:func:`pacs_fast.learner.objective.objective`). With every step
reward 0 the advantages are ``w`` times RLOO's (exactly RLOO's at the default ``w = 1``).
"""
from __future__ import annotations

import bisect
import itertools
import math

import torch

from pacs_fast.algorithms.process_rewards import process_advantages, token_advantages
from pacs_fast.learner.base import RolloutBatch
from pacs_fast.trainer.user_functions import load_callable
from pacs_fast.trainer.user_functions import UserFunctionError, as_list, call_with_time_limit, checked_numbers

KEY = "reward.step_rewards"
# Step rewards are scores, not magnitudes: beyond this the float32 advantages, loss and gradients of
# the update overflow (1e30 passed the finite check and stopped the run blaming learner.lr).
MAX_STEP_REWARD = 1e6


def step_ends(pieces: list[str], delimiter: str) -> list[int]:
    """Token index one past the end of each step of a response whose tokens decode to ``pieces``
    (one string per token): a step ends with the token holding the last character of an
    occurrence of ``delimiter``; the tokens after the last such token are the last step. A
    response without tokens is one empty step (``[0]``)."""
    n = len(pieces)
    text = "".join(pieces)
    ends_chars = list(itertools.accumulate(len(p) for p in pieces))  # token i's text ends at ends_chars[i]
    out: list[int] = []
    at = text.find(delimiter)
    while at >= 0:
        last_char = at + len(delimiter) - 1
        end = bisect.bisect_right(ends_chars, last_char) + 1  # the token holding last_char, + 1
        if not out or end > out[-1]:
            out.append(end)
        at = text.find(delimiter, at + len(delimiter))
    if not out or out[-1] < n:
        out.append(n)
    return out


class StepCredit:
    """Token advantages from the user's step rewards (see the module docstring)."""

    @classmethod
    def from_config(cls, cfg, tokenizer) -> "StepCredit | None":
        rc = cfg.reward
        if not rc.step_rewards:
            return None
        return cls(load_callable(rc.step_rewards, "reward.step_rewards"), tokenizer, split=rc.step_split,
                   form=cfg.algo.credit, gamma=cfg.algo.gamma, outcome_weight=rc.outcome_weight,
                   timeout_s=rc.user_fn_timeout_s)

    def __init__(self, fn, tokenizer, *, split: str = "\n\n", form: str = "min", gamma: float = 1.0,
                 outcome_weight: float = 1.0, timeout_s: float = 600.0):
        self.fn, self.tokenizer, self.timeout_s = fn, tokenizer, float(timeout_s)
        self.split, self.form, self.gamma, self.outcome_weight = split, form, float(gamma), float(outcome_weight)
        self._piece: dict[int, str] = {}  # token id -> its text alone (a vocabulary-sized cache at most)
        self.last: dict[str, float] = {}

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def pieces(self, ids: list[int]) -> list[str]:
        for t in ids:
            if t not in self._piece:
                self._piece[t] = self._decode([t])
        return [self._piece[t] for t in ids]

    def text_pieces(self, ids: list[int]) -> list[str]:
        """Each token's share of the response's text, joining to it: its own decode (:meth:`pieces`), except the
        tokens of a character byte-level BPE splits over several (a CJK character, a symbol), which decode alone to
        replacement characters: those give ``""`` and the token completing the character the decode of them all.
        A ``reward.step_split`` holding such a character (``"。"``, ``"∴"``) had never matched: one step."""
        pieces, out, start = self.pieces(ids), [], None
        for i, p in enumerate(pieces):
            if start is None and "\ufffd" not in p:
                out.append(p)
                continue
            start = i if start is None else start
            text = self._decode(ids[start:i + 1])
            if text.endswith("\ufffd") and i + 1 < len(ids):  # (the character goes on in the next token)
                out.append("")
                continue
            out.append(text)
            start = None
        return out

    def split_steps(self, ids: list[int]) -> tuple[list[int], list[str]]:
        """``(ends, texts)``: each step's end (token index, exclusive) and text."""
        ends = step_ends(self.text_pieces(ids), self.split)
        return ends, [self._decode(ids[a:b]) for a, b in zip([0] + ends[:-1], ends)]

    def advantages(self, prompt_ids: list[list[int]], responses: list[list[list[int]]], answers: list[str],
                   batch: RolloutBatch) -> torch.Tensor:
        """``[B, T]`` float32 token advantages for ``batch`` (built by
        :func:`pacs_fast.trainer.batch.build_batch` from the same ``prompt_ids`` / ``responses``);
        ``answers``: one per prompt."""
        G = batch.group_size
        rows = [(i, r) for i, group in enumerate(responses) for r in group]
        split = [self.split_steps(list(r)) for _, r in rows]
        prompts = [self.tokenizer.decode(list(p)) for p in prompt_ids]  # special tokens kept: the chat template
        got = call_with_time_limit(self.fn, ([prompts[i] for i, _ in rows], [texts for _, texts in split],
                                             [answers[i] for i, _ in rows]), key=KEY, timeout_s=self.timeout_s)
        got = as_list(got, f"{len(rows)} responses", KEY)
        if len(got) != len(rows):
            raise UserFunctionError(f"reward.step_rewards returned {len(got)} lists for {len(rows)} responses")
        K = max(len(ends) for ends, _ in split)
        rewards = torch.zeros(len(rows), K, dtype=torch.float64)
        mask = torch.zeros(len(rows), K, dtype=torch.bool)
        end_cols = torch.zeros(len(rows), K, dtype=torch.long)
        for b, ((i, _), (ends, _), r) in enumerate(zip(rows, split, got)):
            r = checked_numbers(r, key=KEY, what=f"response {b}")
            big = [x for x in r if abs(x) > MAX_STEP_REWARD]
            if big:
                raise UserFunctionError(f"{KEY} returned a step reward of {big[0]:g} for response {b}: step rewards "
                                        f"must lie within +-{MAX_STEP_REWARD:g} (the update computes in float32; "
                                        f"rescale the scores)")
            if len(r) != len(ends):
                raise UserFunctionError(f"reward.step_rewards returned {len(r)} rewards for response {b}, which has "
                                 f"{len(ends)} steps")
            rewards[b, :len(r)] = torch.tensor(r, dtype=torch.float64)
            mask[b, :len(r)] = True
            end_cols[b, :len(r)] = len(prompt_ids[i]) + torch.tensor(ends)
        adv = process_advantages(rewards, mask, G, form=self.form, gamma=self.gamma,
                                 outcome=batch.rewards.double() if self.outcome_weight else None,
                                 outcome_weight=self.outcome_weight)
        self.last = {"process/steps_mean": float(mask.sum(1).double().mean()), "process/steps": float(mask.sum()),
                     "process/step_reward_mean": float(rewards[mask].mean()),
                     "process/min_step_reward_mean": float(torch.where(mask, rewards, math.inf).min(1).values.mean())}
        return token_advantages(adv, end_cols, mask, batch.response_mask).float()
