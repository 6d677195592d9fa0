"""The megatron learner's ``close()`` leaves no process group behind (pacs_fast/learner/megatron/setup.py:
``release_parallel``). megatron-core's ``destroy_model_parallel`` drops its references to the groups
``initialize_model_parallel`` made but destroys only its gloo ones: each learner made and closed in one process left
its ~25 groups in torch's map with their transport threads (a test launch that made several reached ~1,500 threads a
rank, half a core busy while idle; the bench scripts make several learners in one process too)."""
import pytest
import torch

from one_process import run_python, write_learner_spec

SCRIPT = r"""
import sys, torch
from torch.distributed import distributed_c10d as c10d
from pacs_fast.config import AlgoConfig, LearnerConfig
from pacs_fast.learner.base import RolloutBatch
from pacs_fast.learner.megatron.learner import MegatronLearner
spec = torch.load(sys.argv[1] + "/spec.pt")
counts = []
for _ in range(3):
    learner = MegatronLearner(spec["model"], algo=AlgoConfig(name="grpo"), device="cpu", horizon=12,
                              learner=LearnerConfig(lr=1e-2, mini_batch_prompts=4, micro_batch_prompts=2,
                                                    logprob_backend="torch", backend="megatron", tp_size=1))
    made = len(c10d._world.pg_map)
    batch = RolloutBatch(**spec["batch"])
    batch.old_logp = batch.ref_logp = learner.compute_logprobs(batch)
    learner.update(batch, seed=1)  # (the groups in use: a close after real work)
    learner.close()
    counts.append((made, len(c10d._world.pg_map)))
torch.save(counts, sys.argv[1] + "/groups.pt")
"""


@pytest.mark.megatron
@pytest.mark.timeout(300)
def test_closing_a_megatron_learner_destroys_the_groups_it_made(seed, tmp_path):
    pytest.importorskip("megatron.core", reason="megatron-core is not installed")
    write_learner_spec(tmp_path, seed)
    run_python(["-c", SCRIPT, tmp_path])
    counts = torch.load(tmp_path / "groups.pt")
    made, left = counts[0]
    assert made > 2, counts  # (megatron's groups exist while the learner lives: the check below can fail)
    # each learner finds the same groups as the first did and leaves only the default one (and nothing it made)
    assert all(m == made for m, _ in counts) and all(n == left for _, n in counts) and left == 1, counts
