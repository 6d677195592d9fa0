"""The scale-out methods' one-process defaults in ``Learner`` (what ``TorchLearner`` inherits):
``save_state`` / ``load_state``, ``hf_weight_manifest``, ``iter_hf_weight_buckets``; and the
engine-layout helpers that need no vLLM."""
from __future__ import annotations

import pytest
import torch

from pacs_fast.config import AlgoConfig, LearnerConfig
from pacs_fast.data.tiny import make_tiny_model
from pacs_fast.learner.torch_learner import TorchLearner
from pacs_fast.rollout.parallel_engines import EngineLayout, dp_share, engine_layout
from pacs_fast.rollout.weight_sync import unit_of


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = make_tiny_model(tmp_path_factory.mktemp("defaults"), seed=int(torch.randint(0, 1000, ())))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return TorchLearner(model, algo=AlgoConfig(), learner=LearnerConfig(lr=1e-2))


def test_buckets_cover_every_weight_in_whole_layers(learner):
    full = dict(learner.export_hf_weights())
    unit_bytes = {}
    for n, t in full.items():
        unit_bytes[unit_of(n)] = unit_bytes.get(unit_of(n), 0) + t.numel() * 2
    limit = max(unit_bytes.values())
    buckets = list(learner.iter_hf_weight_buckets(limit, dtype=torch.bfloat16))
    assert len(buckets) > 1
    seen = [n for b in buckets for n, _ in b]
    assert seen == list(full)                                   # every weight once, in order
    for b in buckets:
        assert all(t.dtype == torch.bfloat16 for _, t in b)
        units = [unit_of(n) for n, _ in b]
        assert sum(unit_bytes[u] for u in dict.fromkeys(units)) < 2 * limit + 1
    for b in buckets:                                           # a unit never spans two buckets
        for other in buckets:
            if other is not b:
                assert not {unit_of(n) for n, _ in b} & {unit_of(n) for n, _ in other}
    assert learner.hf_weight_manifest() == [(n, tuple(t.shape)) for n, t in full.items()]


def test_save_state_round_trip(learner, tmp_path):
    # make optimiser state: one AdamW step on a dummy loss
    loss = sum(p.float().pow(2).sum() for p in learner.model.parameters())
    loss.backward()
    learner.optimizer.step()
    learner.optimizer.zero_grad()
    learner.save_state(tmp_path / "not_writer", is_writer=False)
    assert not (tmp_path / "not_writer").exists()
    learner.save_state(tmp_path / "s", is_writer=True)
    before = {k: v.clone() for k, v in learner.optimizer.state_dict()["state"][0].items()}
    for st in learner.optimizer.state.values():
        st["exp_avg"].add_(1.0)
    learner.load_state(tmp_path / "s")
    after = learner.optimizer.state_dict()["state"][0]
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert [p.name for p in (tmp_path / "s").iterdir()] == ["learner.pt"]   # no temp file left


def test_layout_helpers():
    assert engine_layout(1) == EngineLayout(0, 1, 0, 1, 0, 1)   # no process group: one process
    lay = EngineLayout(rank=5, world=8, tp_rank=1, tp_size=2, dp_rank=2, dp_size=4)
    assert lay.tp_group_ranks() == [4, 5] and lay.dp_group_ranks() == [1, 3, 5, 7]
    items = list(range(8))
    assert dp_share(items, 1, 4) == ([2, 3], 2)
    assert [x for d in range(4) for x in dp_share(items, d, 4)[0]] == items
    with pytest.raises(ValueError, match="evenly"):
        dp_share(items, 0, 3)
    with pytest.raises(ValueError, match="must divide"):
        engine_layout(0)
