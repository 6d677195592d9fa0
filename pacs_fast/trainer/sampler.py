"""Deterministic, resumable order over the training problems (epochs of seeded permutations)."""
from __future__ import annotations

import torch


class PromptSampler:
    """Yields indices ``0..n-1`` in a fresh seeded permutation each epoch.

    The whole state is ``(epoch, position)``: :meth:`state_dict` / :meth:`load_state_dict` resume
    the exact order.
    """

    def __init__(self, n: int, *, seed: int, shuffle: bool = True):
        if n < 1:
            raise ValueError(f"PromptSampler: the dataset is empty (n={n})")
        self.n, self.seed, self.shuffle = n, int(seed), shuffle
        self.epoch, self.position = 0, 0
        self._order = self._make_order()

    def _make_order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.n, generator=gen).tolist()

    def take(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.position == self.n:
                self.epoch += 1
                self.position = 0
                self._order = self._make_order()
            take = min(k - len(out), self.n - self.position)
            out.extend(self._order[self.position:self.position + take])
            self.position += take
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "n": self.n, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state["n"] != self.n:
            raise ValueError(f"the checkpoint's data position is for {state['n']} problems, this dataset has {self.n}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._make_order()
