"""Verifier rewards for the trainer: the batch scorer, memoised."""
from __future__ import annotations


class Scorer:
    """Verifier rewards, memoised (the verifier is a pure function; G samples often repeat)."""

    @classmethod
    def from_config(cls, cfg) -> "Scorer":
        """The scorer a run's config asks for (``train.reward_workers``)."""
        return cls(cfg.train.reward_workers)

    def __init__(self, workers: int):
        from pacs_fast.reward import BatchScorer
        self.batch = BatchScorer(num_workers=workers)
        self.memo: dict[tuple[str, str], float] = {}

    def __call__(self, texts: list[str], answers: list[str], *, step: int | None = None) -> list[float]:
        """Rewards of ``texts`` against ``answers``; ``step``: the training step (None at evaluation)."""
        if len(self.memo) > 200_000:
            self.memo.clear()
        todo = sorted({(t, a) for t, a in zip(texts, answers) if (t, a) not in self.memo})
        if todo:
            res = self.batch.score([t for t, _ in todo], [a for _, a in todo])
            self.memo.update(zip(todo, (float(x) for x in res.scores)))
        return [self.memo[(t, a)] for t, a in zip(texts, answers)]

    def close(self):
        self.batch.close()
