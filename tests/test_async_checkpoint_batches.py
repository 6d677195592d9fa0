"""The batches in flight of an asynchronous run across a checkpoint (``RemoteRounds`` of
pacs_fast/trainer/async_loop.py), one process, the engines replaced by a recorder: a checkpoint collects each
batch in flight once and keeps it, the step that trains it does not collect it again, a resume trains the kept
batches without asking the engines and numbers its new requests after them, and a checkpoint that kept none (one
written before they were saved) regenerates from the sampler's position; a resume on two data-parallel groups
gives each its share; the completions are stored packed (a few tensors, no pickled objects) and come back equal.
The whole runs: tests/test_async_rollouts.py.
"""
from types import SimpleNamespace

import torch

from pacs_fast.config import load_config
from pacs_fast.rollout.base import Completion, pack_completions, unpack_completions
from pacs_fast.trainer.async_loop import RemoteRounds
from pacs_fast.trainer.sampler import PromptSampler


class Engines:
    def __init__(self):
        self.asked, self.collected = [], []

    def generate(self, index, prompt_ids, params):
        self.asked.append((index, [p[0] for p in prompt_ids]))

    def collect(self, index):
        self.collected.append(index)
        return [[Completion([index, j], f"{index}.{j}", "stop")] for j in range(2)], index - 1


class World:
    def __init__(self, rank=0, groups=1):
        self.rank, self.groups = rank, groups

    def broadcast(self, obj):
        return obj

    def share(self, problems):  # this data-parallel group's share, as pacs_fast.collective does
        k = len(problems) // self.groups
        return problems[self.rank * k:(self.rank + 1) * k], self.rank * k


def _session(batches=0, world=None):
    cfg = load_config(None, ["rollout.ranks=1", "rollout.max_staleness=1", "train.prompts_per_step=2"])
    problems = [{"prompt_ids": [i], "answer": str(i)} for i in range(10)]
    sampler = PromptSampler(len(problems), seed=0, shuffle=False)
    return SimpleNamespace(cfg=cfg, train_problems=problems, sampler=sampler, world=world or World(), batches=batches)


def test_a_checkpoint_keeps_the_batches_in_flight_and_a_resume_trains_them():
    s, engines = _session(), Engines()
    rounds = RemoteRounds(s, engines)
    rounds.begin_step()  # step 1: batches 1 and 2 asked
    assert [i for i, _ in engines.asked] == [1, 2]
    assert rounds.next().index == 1 and engines.collected == [1]
    kept = rounds.checkpoint_batches()  # after step 1: batch 2 in flight, collected now, once
    assert [b["index"] for b in kept] == [2] and engines.collected == [1, 2]
    assert kept[0]["version"] == 1 and [c[0].text for c in unpack_completions(kept[0]["comps"])] == ["2.0", "2.1"]
    assert [p["prompt_ids"] for p in kept[0]["problems"]] == [[2], [3]]
    position = s.sampler.state_dict()  # what the checkpoint stores: after batch 2's prompts
    rounds.begin_step()  # step 2 asks batch 3; batch 2 is trained from what the checkpoint collected
    r = rounds.next()
    assert (r.index, r.version, engines.collected) == (2, 1, [1, 2])

    # the resume from that checkpoint: batch 2 trains from the checkpoint, batch 3 is asked anew
    s2, engines2 = _session(batches=1), Engines()
    s2.sampler.load_state_dict(position)
    resumed = RemoteRounds(s2, engines2, saved=kept)
    resumed.begin_step()
    assert engines2.asked == [(3, [4, 5])] == engines.asked[2:]  # the uninterrupted run's batch 3, same prompts
    r2 = resumed.next()
    assert (r2.index, r2.version, [c[0].text for c in r2.comps]) == (2, 1, ["2.0", "2.1"])
    assert engines2.collected == [] and s2.batches == 2
    resumed.drain()  # batch 3 collected at the end; none twice
    assert engines2.collected == [3]

    # a resume on two data-parallel groups: each trains its share of the kept batch, the second group its prompt
    s3 = _session(batches=1, world=World(rank=1, groups=2))
    s3.sampler.load_state_dict(position)
    r3 = RemoteRounds(s3, None, saved=kept).next()
    assert (r3.offset, [p["prompt_ids"] for p in r3.problems], [c[0].text for c in r3.comps]) == (1, [[3]], ["2.1"])


def test_a_kept_batch_left_at_the_end_is_not_collected_again():
    s, engines = _session(), Engines()
    rounds = RemoteRounds(s, engines)
    rounds.begin_step()
    rounds.checkpoint_batches()  # (dynamic sampling: the run may end with batches in flight, kept by its last save)
    rounds.drain()
    assert engines.collected == [1, 2]


def test_packed_completions_come_back_equal():
    """Float for float: float32 log-probs (every engine's) in 4 bytes, others (a float64 one, -inf) kept exactly."""
    f32 = [float(x) for x in torch.randn(5, dtype=torch.float32)]
    comps = [[Completion([5, 6, 151935], "a", "stop", f32[:3]), Completion([], "", "length", [])],
             [Completion([9], "b\ud7ff", "length", None), Completion([1, 2], "c", "stop", f32[3:])], []]
    packed = pack_completions(comps)
    assert packed["token_ids"].dtype == torch.int32 and packed["logprobs"].dtype == torch.float32
    assert unpack_completions(packed) == comps
    comps[0][0].logprobs[1] = -0.1  # not a float32 value
    comps[1][1].logprobs[0] = float("-inf")
    packed = pack_completions(comps)
    assert packed["logprobs"].dtype == torch.float64 and unpack_completions(packed) == comps
    assert unpack_completions(pack_completions([])) == [] and unpack_completions(pack_completions([[]])) == [[]]


def test_a_checkpoint_that_kept_none_regenerates_from_the_sampler_position():
    s, engines = _session(batches=1), Engines()
    s.sampler.take(2)  # (an old checkpoint stored the position after the trained step's prompts)
    rounds = RemoteRounds(s, engines, saved=None)
    rounds.begin_step()
    assert engines.asked == [(2, [2, 3]), (3, [4, 5])]  # batch 2 again, generated by the checkpoint's policy
    rounds.next()
    rounds.begin_step()  # K + 1 in flight again (also past train.steps: kept by the last checkpoint)
    assert engines.asked[2:] == [(4, [6, 7])]
