"""The mbarrier protocol of the Gluon kernels (kernels/linear_logprobs_gluon.py), checked on a model.

The interpreter cannot run Gluon and a wrong barrier phase deadlocks or reads a slot early only on a GPU,
so the protocol is model-checked here: the loader partition (``_loader``) and one or two consumer
partitions (``_mma_stats`` / ``_mma_dlogits`` through ``_tile_logits``, ``PINGPONG``) are written as
generators that perform, in the same order, the same barrier operations with the same slot-use indices and
parities as the kernel, and a scheduler interleaves them at random, with the TMA copies landing and the
async wgmma retiring at random later points. A PTX mbarrier is modelled by its count of completed phases:
``try_wait.parity(P)`` passes when the phase of parity P has completed, i.e. when the completed count's
parity differs from P (a fresh barrier passes parity 1). Checked on every run:

- a wgmma reads a slot only after the copy of exactly its slot use has landed there;
- a copy overwrites a slot only after every wgmma reading the slot's previous use has retired;
- every tile is computed once, by the consumer the kernel assigns it to; with two consumers their
  mainloops take turns (tile order);
- the run ends (no deadlock).

The model is sensitive to the bug the ping-pong's turn barriers prevent: without them, a consumer's parity
wait passes on a slot whose earlier use has not landed yet, and the check finds it.
"""
import random

import pytest


class Barrier:
    def __init__(self, count=1):
        self.count, self.pending, self.completed = count, 0, 0

    def arrive(self):
        self.pending += 1
        if self.pending == self.count:
            self.pending, self.completed = 0, self.completed + 1

    def passes(self, parity):
        return (self.completed & 1) != parity


class ProtocolError(AssertionError):
    pass


class Model:
    """One persistent program: ``n_tiles`` tiles of ``n_k`` slot uses each, a ``stages``-slot ring."""

    def __init__(self, n_tiles, n_k, stages, consumers, turns=True):
        self.n_tiles, self.n_k, self.stages, self.consumers, self.turns = n_tiles, n_k, stages, consumers, turns
        self.ready = [Barrier() for _ in range(stages)]
        self.empty = [Barrier() for _ in range(stages)]
        self.turn = [Barrier() for _ in range(consumers)]
        self.slot_use = [None] * stages  # the slot use whose copy has landed in each slot
        self.copies = []  # copies in flight: (slot, use)
        self.readers = [set() for _ in range(stages)]  # unretired wgmma reading each slot: (consumer, use)
        self.done = {}  # tile -> consumer
        self.mainloop_order = []  # (consumer, tile) at each mainloop start

    # ---- the partitions, in the kernel's order of operations ----
    def loader(self):  # _loader
        i = 0
        for _t in range(self.n_tiles):
            for _k in range(self.n_k):
                slot = i % self.stages
                yield ("wait", self.empty[slot], ((i // self.stages) & 1) ^ 1)
                if self.readers[slot]:
                    raise ProtocolError(f"copy of use {i} into slot {slot} while wgmma {self.readers[slot]} read it")
                self.copies.append((slot, i))  # expect + the two TMA loads; lands later
                i += 1

    def consumer(self, c):  # _mma_stats / _mma_dlogits, with _tile_logits inlined
        i, q, n_k, stages = c * self.n_k, 0, self.n_k, self.stages
        in_flight = []  # this consumer's unretired wgmma: (slot, use)
        for t in range(c, self.n_tiles, self.consumers):
            if self.consumers > 1 and self.turns:
                yield ("wait", self.turn[c], (q & 1) ^ (1 - c))
            self.mainloop_order.append((c, t))
            for k in range(n_k):
                slot = i % stages
                yield ("wait", self.ready[slot], (i // stages) & 1)
                if self.slot_use[slot] != i:
                    raise ProtocolError(f"consumer {c} read slot {slot} for use {i}; it holds {self.slot_use[slot]}")
                self.readers[slot].add((c, i))
                in_flight.append((slot, i))
                yield ("step", )
                self._retire(c, in_flight, keep=1)  # warpgroup_mma_wait(1)
                if k > 0:
                    self.empty[(i + stages - 1) % stages].arrive()
                i += 1
            if self.consumers > 1 and self.turns:
                self.turn[1 - c].arrive()
            yield ("step", )
            self._retire(c, in_flight, keep=0)  # warpgroup_mma_wait(0)
            self.empty[(i + stages - 1) % stages].arrive()
            if t in self.done:
                raise ProtocolError(f"tile {t} computed twice")
            self.done[t] = c
            i += (self.consumers - 1) * n_k
            q += 1
            yield ("step", )  # the epilogue

    def _retire(self, c, in_flight, keep):
        while len(in_flight) > keep:
            slot, use = in_flight.pop(0)
            self.readers[slot].discard((c, use))

    # ---- the scheduler ----
    def run(self, rng, max_steps=200_000):
        procs = {"loader": self.loader(), **{f"c{c}": self.consumer(c) for c in range(self.consumers)}}
        blocked = {name: None for name in procs}  # the wait each process is blocked on
        for _ in range(max_steps):
            runnable = [n for n, w in blocked.items() if w is None or w[1].passes(w[2])]
            if not runnable and not self.copies:
                if blocked:
                    raise ProtocolError(f"deadlock: {sorted(blocked)} blocked")
                break
            choice = rng.randrange(len(runnable) + (1 if self.copies else 0))
            if choice == len(runnable):  # a copy lands (in any order: copies to different slots race)
                slot, use = self.copies.pop(rng.randrange(len(self.copies)))
                self.slot_use[slot] = use
                self.ready[slot].arrive()
                continue
            name = runnable[choice]
            try:
                blocked[name] = next(procs[name])
                if blocked[name][0] == "step":
                    blocked[name] = None
            except StopIteration:
                del blocked[name]
        else:
            raise ProtocolError("did not finish")
        want = {t: t % self.consumers for t in range(self.n_tiles)}
        if self.done != want:
            raise ProtocolError(f"tiles computed {self.done}, want {want}")
        if self.consumers > 1 and self.turns and [t for _, t in self.mainloop_order] != list(range(self.n_tiles)):
            raise ProtocolError(f"mainloops out of turn: {self.mainloop_order}")


CASES = [(n_tiles, n_k, stages, consumers) for consumers in (1, 2) for stages in (2, 3, 4, 6)
         for n_k in (1, 2, 3, 5, 14) for n_tiles in (1, 2, 5)]


@pytest.mark.parametrize("consumers", [1, 2])
def test_the_ring_protocol_holds_under_random_interleavings(seed, consumers):
    """Every case (1-5 tiles, 1-14 slot uses per tile, 2-6 stages) under 20 random schedules each."""
    rng = random.Random(seed)
    runs = 0
    for n_tiles, n_k, stages, c in CASES:
        if c != consumers:
            continue
        for _ in range(20):
            Model(n_tiles, n_k, stages, consumers).run(rng)
            runs += 1
    assert runs == 20 * len(CASES) // 2


def test_the_model_catches_ping_pong_without_turns(seed):
    """Without the turn barriers a consumer's parity wait can pass on a slot whose earlier use has not
    landed (or overlap the other's mainloop): the model finds it within a few schedules."""
    rng = random.Random(seed)
    found = 0
    for n_tiles, n_k, stages in ((2, 5, 2), (2, 14, 4), (5, 3, 2)):
        for _ in range(50):
            try:
                Model(n_tiles, n_k, stages, 2, turns=False).run(rng)
            except ProtocolError:
                found += 1
                break
    assert found == 3
