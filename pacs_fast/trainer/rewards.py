"""Verifier rewards for the trainer: the batch scorer (or the user's ``reward.fn``), memoised; for
experiments with an imperfect verifier, label flips at given rates and an online false-negative-rate
estimate from an "appeal".

A user reward (``reward.fn = "module:function"``, called as ``function(problems, responses, answers)
-> [float]``, one reward in [0, 1] per response) takes the math verifier's place for every reward of
the run, training and held-out alike: another task's checker (unit tests, a format check, a judge).
``problems[i]``: the problem text of response i as the data gives it (before the chat template),
``answers[i]``: its gold answer field (text). It is called once per distinct (problem, response,
answer) of a call, with ``reward.user_fn_timeout_s``, and must be a pure function of them (results are
memoised). A return that is not one number in [0, 1] per response stops the run with the key named.
``reward.fn_fields`` hands it dataset fields too (test cases, a language): ``function(problems, responses,
answers, **fields)``, each field one keyword argument, a list with each response's row value
(:mod:`pacs_fast.config.reward_fields`); the values join the memo's key, and each call gets its own copy
of each row's values (a function that edits them edits nothing of the run's). A comma-separated list
(``reward.fn=verifier,my_checks:format_score``) is a weighted mix (:mod:`pacs_fast.trainer.reward_mix`), scored
as one function; the scorer keeps each component's rewards for ``reward/<name>/mean``.

Label noise (``reward.noise_fp`` / ``reward.noise_fn``): training rewards (calls with a ``step``)
are flipped 0 -> 1 with probability ``noise_fp`` and 1 -> 0 with ``noise_fn``, independently per
response, by a generator seeded with ``(train.seed, step)`` and drawn by the response's index in
the whole step (``first``: the index of a data-parallel group's first response): the same step
flips the same responses whatever the process layout, and a resumed run sees the same labels.
Evaluation (``step=None``) is always clean.

Appeal (``reward.appeal = "module:function"``, called as ``function(texts, answers) -> [bool]``):
a second, more lenient check of the responses labelled 0. With a verifier that has (next to) no
false positives, the false-negative rate is ``rho1 = P(R~=0 | R=1) = n_overturned / (n_pos +
n_overturned)``, counted over all training steps so far and over every data-parallel group's
share (``gather``, so that every group uses the same rate) (:attr:`Scorer.fn_rate`). With
``reward.fn_rate=appeal`` it is written into ``algo.noise_rho1`` after every training call, so the
learner's correction (``algo.noise_correction``) uses it on that step's batch. The appeal only
estimates the rate; the labels the learner sees stay the verifier's.
"""
from __future__ import annotations

import numpy as np

from pacs_fast.config.reward_fields import field_keywords, memo_key
from pacs_fast.config.reward_specs import is_mix, user_specs
from pacs_fast.reward.verifier import DEFAULT_TIME_LIMIT
from pacs_fast.trainer.reward_mix import RewardMix, make_reward_mix
from pacs_fast.trainer.user_functions import (  # noqa: F401 (load_callable, user_rewards: imported from here too)
    UserFunctionError, call_with_time_limit, check_reward_signature, checked_flags, load_callable, user_rewards)

# The memo is cleared (at the start of a call) once it holds more keys, or more characters of text in its keys, than
# these. A count alone had let it grow to 200,000 keys whatever their length: with 4k-token responses (~16 KB of text
# each) about 3 GB in the trainer's process before the first clear, a run's memory climbing for hundreds of steps.
# 2**25 characters: 32-128 MiB of text (1-4 bytes a character), thousands of such responses; a repeat across steps is
# rare for responses that long, while short ones (the tiny task's) still fill the count first.
MEMO_MAX_KEYS = 200_000
MEMO_MAX_CHARS = 1 << 25


def _key_chars(key: tuple) -> int:
    """The characters a memo key's text holds (its str parts)."""
    return sum(len(x) for x in key if isinstance(x, str))


def check_callables(cfg) -> None:
    """Imports the user functions the config names (before any model is loaded); ``reward.fn`` must take
    ``(problems, responses, answers)`` and the keyword arguments of ``reward.fn_fields``."""
    rc = getattr(cfg, "reward", None)
    if rc is not None and rc.fn:
        user_reward_fn(rc, verifier_factory=lambda: None)
    for key in ("appeal", "step_rewards"):
        if rc is not None and getattr(rc, key, ""):
            load_callable(getattr(rc, key), f"reward.{key}")


def user_reward_fn(rc, *, verifier_factory):
    """What scores in the math verifier's place under ``reward.fn`` (``rc``: the ``reward`` section): its
    function, or the :class:`~pacs_fast.trainer.reward_mix.RewardMix` of a list (``verifier_factory()``: the
    verifier's batch scorer, made at the mix's first call when ``verifier`` is a component); None for the
    verifier alone. Each function is imported and its signature checked against ``reward.fn_fields`` (a
    ValueError naming the key)."""
    keywords = list(field_keywords(rc.fn_fields, "reward.fn_fields").values())
    if is_mix(rc.fn, rc.fn_weights):
        return make_reward_mix(rc.fn, rc.fn_weights, keywords=keywords, verifier_factory=verifier_factory)
    specs = user_specs(rc.fn)
    if not specs:
        return None
    fn = load_callable(specs[0], "reward.fn")
    check_reward_signature(fn, keywords, f"reward.fn={rc.fn!r}", "reward.fn_fields")
    return fn


def flip_labels(rewards: list[float], *, fp: float, fn: float, seed: int, step: int, first: int = 0) -> list[float]:
    """``rewards`` (0/1) with each 0 turned into 1 with probability ``fp`` and each 1 into 0 with
    probability ``fn``; deterministic in ``(seed, step)`` and the rewards' indices in the step
    (``first``: the index of ``rewards[0]``), so a step split into shares flips as the whole would."""
    if not fp and not fn:
        return list(rewards)
    u = np.random.default_rng([int(seed) % 2**63, int(step), 0xF11B]).random(first + len(rewards))[first:]
    out = []
    for r, x in zip(rewards, u):
        pos = r > 0.5
        flip = x < (fn if pos else fp)
        out.append(float(pos != flip))
    return out


class Scorer:
    """Verifier rewards, memoised (the verifier is a pure function; G samples often repeat)."""

    @classmethod
    def from_config(cls, cfg, gather=None, think_open: bool = False) -> "Scorer":
        """The scorer a run's config asks for (``train.reward_workers``, the ``reward`` section);
        ``gather``: :meth:`World.gather_dp` of a multi-process run; ``think_open``: the prompts open a ``<think>``
        the responses continue (pacs_fast/reward/batch.py)."""
        from pacs_fast.reward import BatchScorer

        rc = getattr(cfg, "reward", None)
        if rc is None:
            return cls(cfg.train.reward_workers)
        return cls(cfg.train.reward_workers, noise_fp=rc.noise_fp, noise_fn=rc.noise_fn, seed=cfg.train.seed,
                   appeal=load_callable(rc.appeal, "reward.appeal") if rc.appeal else None,
                   algo=cfg.algo if rc.fn_rate == "appeal" else None, timeout_s=rc.user_fn_timeout_s,
                   gather=gather, extraction=rc.extraction, time_limit=rc.time_limit_s, think_open=think_open,
                   user_fn=user_reward_fn(rc, verifier_factory=lambda: BatchScorer(
                       num_workers=cfg.train.reward_workers, extraction=rc.extraction, time_limit=rc.time_limit_s,
                       think_open=think_open)))

    def __init__(self, workers: int, *, noise_fp: float = 0.0, noise_fn: float = 0.0, seed: int = 0,
                 appeal=None, algo=None, timeout_s: float = 600.0, gather=None, extraction: str = "reference",
                 time_limit: float = DEFAULT_TIME_LIMIT, user_fn=None, think_open: bool = False):
        from pacs_fast.reward import BatchScorer
        self.user_fn = user_fn  # reward.fn, in the math verifier's place (no verifier workers then)
        self.batch = None if user_fn else BatchScorer(num_workers=workers, extraction=extraction, time_limit=time_limit,
                                                      think_open=think_open)
        self.memo: dict[tuple, float] = {}
        self.memo_chars = 0  # the characters of text in the memo's keys (bounded: MEMO_MAX_CHARS)
        # a mix of rewards (reward.fn=a,b): each memo key's component rewards, for reward/<name>/mean
        self.parts: dict[tuple, tuple[float, ...]] = {}
        self.noise_fp, self.noise_fn, self.seed = float(noise_fp), float(noise_fn), int(seed)
        self.appeal, self.timeout_s = appeal, float(timeout_s)
        self.algo = algo  # written to (noise_rho1) when the false-negative rate is estimated online
        # [the object of every data-parallel group] from each group's (collective: every group scores
        # each training step); None = one group
        self.gather = gather
        self.counts = {"positives": 0, "overturned": 0, "appealed": 0}
        self.last: dict[str, float] = {}

    def clean(self, texts: list[str], answers: list[str], problems: list[str] | None = None,
              fields: list[dict] | None = None) -> list[float]:
        """The verifier's rewards (no noise), or ``reward.fn``'s (``problems``: each response's problem
        text, ``fields``: each response's ``reward.fn_fields`` values, which only ``reward.fn`` reads)."""
        rows: dict[str, dict] = {}  # a fields digest -> the values (this call's)
        keys = self._keys(texts, answers, problems, fields, rows)
        todo = sorted({k for k in keys if k not in self.memo})
        if todo:
            self._make_room(keys)
            if self.user_fn is not None:
                scores = self._user_rewards(todo, rows if fields is not None else None)
            else:
                scores = [float(x) for x in self.batch.score([t for t, _ in todo], [a for _, a in todo]).scores]
            self.memo.update(zip(todo, scores))
            self.memo_chars += sum(map(_key_chars, todo))
        return [self.memo[k] for k in keys]

    def _make_room(self, keys: list[tuple]) -> None:
        """Before new keys go in: a memo over :data:`MEMO_MAX_KEYS` keys or :data:`MEMO_MAX_CHARS` characters keeps
        only this call's ``keys`` it holds (a call with nothing new clears nothing: the repeat of a call, as
        ``__call__``'s second ``clean`` and :meth:`component_rewards` make, reads the memo and ``parts``)."""
        if len(self.memo) <= MEMO_MAX_KEYS and self.memo_chars <= MEMO_MAX_CHARS:
            return
        kept = {k: self.memo[k] for k in keys if k in self.memo}
        parts = {k: self.parts[k] for k in kept if k in self.parts}
        self.memo, self.parts = kept, parts
        self.memo_chars = sum(map(_key_chars, kept))

    def _keys(self, texts, answers, problems, fields, rows: dict[str, dict]) -> list[tuple]:
        """Each response's memo key: ``(text, answer)`` for the verifier, ``(problem, text, answer, fields
        digest)`` for ``reward.fn`` (``rows`` filled with digest -> values)."""
        if self.user_fn is None:
            return list(zip(texts, answers))
        if problems is None or len(problems) != len(texts):
            raise ValueError("Scorer with reward.fn: give each response's problem text (problems=)")
        if fields is not None and len(fields) != len(texts):
            raise ValueError(f"Scorer: {len(fields)} rows of fields for {len(texts)} responses")
        digests = [""] * len(texts) if fields is None else self._digests(fields, rows)
        return list(zip(problems, texts, answers, digests))

    @staticmethod
    def _digests(fields: list[dict], rows: dict[str, dict]) -> list[str]:
        """Each response's fields as their :func:`~pacs_fast.config.reward_fields.memo_key` (of fixed size,
        whatever the test cases weigh; a row's :class:`~pacs_fast.config.reward_fields.RowFields` keeps its own),
        computed once per distinct row object of the call; ``rows`` filled with key -> values."""
        by_object: dict[int, str] = {}
        out = []
        for f in fields:
            key = by_object.get(id(f))
            if key is None:
                key = by_object[id(f)] = memo_key(f)
                rows.setdefault(key, f)
            out.append(key)
        return out

    def _user_rewards(self, todo: list[tuple[str, str, str, str]], rows: dict[str, dict] | None) -> list[float]:
        """``reward.fn`` on the distinct ``(problem, response, answer, fields digest)`` keys."""
        problems, texts, answers, digests = (list(x) for x in zip(*todo))
        fields = None if rows is None else [rows[d] for d in digests]
        try:
            scores = user_rewards(self.user_fn, problems, texts, answers, key="reward.fn", timeout_s=self.timeout_s,
                                  fields=fields)
        except UserFunctionError as e:
            running = getattr(self.user_fn, "running", None)
            if running is not None and "did not return within" in str(e):  # (a mix: which of its functions hung)
                raise UserFunctionError(f"{e}; its component {running} was running") from e
            raise
        if isinstance(self.user_fn, RewardMix):
            self.parts.update(zip(todo, zip(*self.user_fn.last_parts.values())))
        return scores

    def component_rewards(self, texts: list[str], answers: list[str], problems: list[str],
                          fields: list[dict] | None = None) -> dict[str, list[float]]:
        """With a mix of rewards (``reward.fn=a,b``), ``{name: each response's reward from that component}`` (scored
        already: read from the memo; scored again where the memo was cleared since). Empty otherwise."""
        if not isinstance(self.user_fn, RewardMix):
            return {}
        self.clean(texts, answers, problems, fields)  # (memo hits: no call)
        rows = [self.parts[k] for k in self._keys(texts, answers, problems, fields, {})]
        return {name: [r[i] for r in rows] for i, name in enumerate(self.user_fn.names)}

    def component_metrics(self, texts: list[str], answers: list[str], problems: list[str],
                          fields: list[dict] | None = None) -> dict[str, float]:
        """``reward/<name>/mean`` of :meth:`component_rewards` (empty without a mix, or without responses)."""
        parts = self.component_rewards(texts, answers, problems, fields) if texts else {}
        return {f"reward/{name}/mean": float(np.mean(values)) for name, values in parts.items()}

    def __call__(self, texts: list[str], answers: list[str], *, step: int | None = None,
                 first: int = 0, problems: list[str] | None = None, fields: list[dict] | None = None) -> list[float]:
        """Rewards of ``texts`` against ``answers``; ``step``: the training step (None at evaluation,
        which is never noisy and never appealed); ``first``: the index of ``texts[0]`` among the
        step's responses (a data-parallel group's share starts there); ``problems``: each response's
        problem text, ``fields``: each response's ``reward.fn_fields`` values (both read by ``reward.fn``
        only). A training call with an appeal is collective over the data-parallel groups."""
        rewards = self.clean(texts, answers, problems, fields)
        if step is None:
            return rewards
        if self.noise_fp or self.noise_fn:
            soft = [i for i, r in enumerate(rewards) if r not in (0.0, 1.0)]
            if soft:  # (only reward.fn can give one: the verifier's are 0 / 1)
                raise UserFunctionError(f"reward.noise_fp / reward.noise_fn flip 0 / 1 labels, but reward.fn returned "
                                        f"{rewards[soft[0]]!r} for response {soft[0]} ({len(soft)} of {len(rewards)} "
                                        f"soft): use 0 / 1 rewards, or no label noise")
        rewards = flip_labels(rewards, fp=self.noise_fp, fn=self.noise_fn, seed=self.seed, step=step, first=first)
        self.last = {"reward/flipped_frac": float(np.mean([a != b for a, b in
                                                           zip(rewards, self.clean(texts, answers, problems,
                                                                                   fields))]))
                     if rewards else 0.0}
        if self.appeal is not None:
            self._appeal(texts, answers, rewards)
        return rewards

    def _appeal(self, texts, answers, rewards) -> None:
        neg = [i for i, r in enumerate(rewards) if r <= 0.5]
        verdicts = []
        if neg:
            got = call_with_time_limit(self.appeal, ([texts[i] for i in neg], [answers[i] for i in neg]),
                                       key="reward.appeal", timeout_s=self.timeout_s)
            verdicts = checked_flags(got, len(neg), key="reward.appeal")
        mine = {"positives": sum(r > 0.5 for r in rewards), "overturned": sum(bool(v) for v in verdicts),
                "appealed": len(neg)}
        for part in (self.gather(mine) if self.gather else [mine]):  # every group's share of the step
            for key, value in part.items():
                self.counts[key] += int(value)
        rate = self.fn_rate
        self.last["reward/fn_rate_estimate"] = rate if rate is not None else float("nan")
        if self.algo is not None and rate is not None:
            self.algo.noise_rho1 = min(rate, 0.95 - self.algo.noise_rho0)  # keep 1 - rho0 - rho1 >= 0.05

    @property
    def fn_rate(self) -> float | None:
        """Online estimate of ``P(R~=0 | R=1)`` from the appeals so far (None before any evidence)."""
        n = self.counts["positives"] + self.counts["overturned"]
        return self.counts["overturned"] / n if n else None

    def state_dict(self) -> dict:
        """The appeal counts (for an exact resume of the online estimate)."""
        return {"counts": dict(self.counts)}

    def load_state_dict(self, state: dict) -> None:
        self.counts = {k: int(v) for k, v in state["counts"].items()}

    def close(self):
        if self.batch is not None:
            self.batch.close()
        if isinstance(self.user_fn, RewardMix):
            self.user_fn.close()
