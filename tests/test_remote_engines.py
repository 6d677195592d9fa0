"""The driver's and an engine's send buffers in an asynchronous run (pacs_fast/rollout/remote.py) stay bounded
over many steps. A gloo send reports itself complete only once ``wait()`` was called on it, so polling
``is_completed()`` freed nothing: the driver kept one CPU copy of the weights per step (the tiny model's learner
went from 0.5 to 3.3 GB of RSS over 1,837 steps; a sweep of long runs) and an engine every reply it sent.
Two gloo processes, a stub engine: the driver requests each batch two steps ahead of collecting it (staleness
2) and pushes weights after every request, as the asynchronous loop does."""
import json

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pacs_fast.rollout.base import Completion, SamplingParams
from pacs_fast.rollout.remote import RemoteEngines, serve

STEPS, AHEAD = 40, 2


class _Stub:
    """An engine that answers every prompt with its own first token (whatever the weights)."""

    def __init__(self):
        self.versions = 0

    def generate(self, prompts, params):
        return [[Completion(token_ids=[p[0]], text=str(p[0]), finish_reason="length")] * params.n for p in prompts]

    def sync_weights(self, named):
        assert named[0][1].numel() == 4096
        self.versions += 1

    def close(self):
        pass


def _worker(rank, init_file, out):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    result = {}
    if rank == 1:
        stub = _Stub()
        result = {"served": serve(lambda info: stub, dist.group.WORLD, 0), "versions": stub.versions}
    else:
        engines = RemoteEngines(dist.group.WORLD, [[1]])
        engines.setup({"replies_ahead": AHEAD})
        kept, answers = [], []
        for step in range(1, STEPS + 1):
            engines.generate(step, [[step, 0], [step + 100, 0]], SamplingParams(n=2, max_new_tokens=1, seed=step))
            engines.push_weights([("w", torch.full((4096,), float(step)))], step)
            if step > 2:
                comps, _ = engines.collect(step - 2)
                answers.append([c[0].token_ids[0] for c in comps])
            kept.append(engines.pending_sends())
        for step in (STEPS - 1, STEPS):
            comps, _ = engines.collect(step)
            answers.append([c[0].token_ids[0] for c in comps])
        engines.close()
        result = {"kept": kept, "answers": answers, "after_close": engines.pending_sends()}
    dist.destroy_process_group()
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(result, f)


def test_sends_are_freed_once_the_engine_took_them(tmp_path):
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    driver = json.loads((tmp_path / "rank0.json").read_text())
    engine = json.loads((tmp_path / "rank1.json").read_text())
    assert engine == {"served": STEPS, "versions": STEPS}
    assert driver["answers"] == [[s, s + 100] for s in range(1, STEPS + 1)]  # every batch, in order
    # the sends of at most the three requests (and pushes) not yet answered: 4 each (request and weights,
    # header and body) + 1 weights bucket; 5 per step were kept before, 200 after 40 steps
    assert max(driver["kept"]) <= 3 * 5, driver["kept"]
    assert driver["kept"][-1] <= driver["kept"][5], driver["kept"]  # flat, not growing with the steps
    assert driver["after_close"] == 0


def test_engines_answering_one_step_at_different_versions_are_one_warning(capsys):
    """Every engine gets the pushes and requests in one order, so they answer a step at one policy version. Two that
    did not (a bug that never happened) were recorded as the oldest without a word (noticed 2026-12-06): now one
    warning line naming each engine's version, once a run; the oldest is still what the step records."""
    engines = RemoteEngines(None, [[1], [2]])
    engines._asked = {5: [(1, 1), (2, 1)], 6: [(1, 1), (2, 1)], 7: [(1, 1), (2, 1)]}
    versions = {(1, 5): 3, (2, 5): 3, (1, 6): 4, (2, 6): 3, (1, 7): 5, (2, 7): 4}
    one = [[{"token_ids": [1], "text": "1", "finish_reason": "length"}]]
    engines._reply = lambda r, step: {"step": step, "completions": one, "version": versions[(r, step)]}
    assert engines.collect(5)[1] == 3 and capsys.readouterr().err == ""  # (one version: no word)
    assert engines.collect(6)[1] == 3
    assert capsys.readouterr().err == ("warning: the engines answered step 6 at different policy versions (rank 1: 4, "
                                       "rank 2: 3), which they never should: the oldest is recorded (please report "
                                       "this)\n")
    assert engines.collect(7)[1] == 4 and capsys.readouterr().err == ""  # (once a run)
