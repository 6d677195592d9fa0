"""A resume of a learner off the CPU reads ``learner.pt`` memory-mapped (pacs_fast/learner/base.py ``load_state``).

``torch.load(map_location="cpu")`` read the whole file into host memory before the optimiser copied each tensor to
its device: AdamW's moments of a 7.6B-parameter policy (61 GB; 91 GB with a bf16 model's fp32 masters) at once, on
top of the model (review of 2026-12-03). Memory-mapped, a tensor's pages are read as it is copied into place. A
parameter on the meta device stands in for a GPU one (these tests run on CPU machines): the optimiser moves its
moments to it, as it would to the GPU, without reading them.
"""
import gc
import types

import torch

from pacs_fast.learner.base import Learner


def _mapped(path) -> bool:
    with open("/proc/self/maps") as f:
        return any(str(path) in line for line in f)


def _saved_optimizer(tmp_path, numel: int):
    """A learner.pt with AdamW's state of one ``numel``-element parameter, and a stand-in learner whose parameter
    is on the meta device (the torch learner's ``load_state``, unbound)."""
    param = torch.nn.Parameter(torch.zeros(numel, device="meta"))
    optimizer = torch.optim.AdamW([param])
    saved = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(numel), "exp_avg_sq": torch.ones(numel)}},
             "param_groups": optimizer.state_dict()["param_groups"]}
    torch.save({"optimizer": saved}, tmp_path / "learner.pt")
    del saved
    learner = types.SimpleNamespace(optimizer=optimizer, device=param.device)
    learner.load_state_dict = lambda state: optimizer.load_state_dict(state["optimizer"])
    return learner, param


# A fresh process loads it (its peak so far is its imports'; this test's process may have peaked anywhere before)
LOAD_PROBE = r"""
import sys, types, torch
from pacs_fast.learner.base import Learner

def kib(key):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key + ":"))

numel, folder = int(sys.argv[1]), sys.argv[2]
param = torch.nn.Parameter(torch.zeros(numel, device="meta"))
optimizer = torch.optim.AdamW([param])
learner = types.SimpleNamespace(optimizer=optimizer, device=param.device,
                                load_state_dict=lambda state: optimizer.load_state_dict(state["optimizer"]))
before = kib("VmHWM")
Learner.load_state(learner, folder)
print((kib("VmHWM") - before) * 1024, float(optimizer.state[param]["step"]))
"""


def test_loading_a_learner_state_does_not_read_it_into_host_memory(tmp_path):
    """The peak resident memory over the load stays far below the file (read whole: the file above the process's
    peak so far)."""
    import subprocess
    import sys

    numel = 25_000_000  # 200 MB of moments
    _saved_optimizer(tmp_path, numel)
    size = (tmp_path / "learner.pt").stat().st_size
    out = subprocess.run([sys.executable, "-c", LOAD_PROBE, str(numel), str(tmp_path)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    grown, step = out.stdout.split()
    assert size > 150e6 and int(grown) < 0.3 * size, (grown, size)
    assert float(step) == 3.0  # (the state loaded)


def test_a_loaded_state_does_not_keep_the_file_mapped(tmp_path):
    """torch keeps a state tensor as loaded where it has the parameter's device already: AdamW's ``step`` (a CPU
    tensor) for a parameter on a GPU, every moment of a CPU parameter. In the file's mapping they held the whole
    ``learner.pt`` open for the rest of the run: once the checkpoint was pruned its disk space (the moments and
    masters) stayed taken until the run ended. A parameter off the CPU, and a real torch learner on the CPU (which
    reads the file whole: mapped, then copied out of the mapping, its moments would be resident twice over)."""
    import transformers

    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.data.tiny import tiny_qwen2_config
    from pacs_fast.learner.torch_learner import TorchLearner

    (tmp_path / "meta").mkdir()
    learner, param = _saved_optimizer(tmp_path / "meta", 1 << 16)
    Learner.load_state(learner, tmp_path / "meta")
    gc.collect()
    assert float(learner.optimizer.state[param]["step"]) == 3.0
    assert not _mapped(tmp_path / "meta" / "learner.pt")  # (before: mapped through the step tensor)

    def cpu_learner():
        model = transformers.Qwen2ForCausalLM(tiny_qwen2_config(64, hidden_size=32, num_layers=1, intermediate_size=64))
        return TorchLearner(model, algo=AlgoConfig(name="pacs"), learner=LearnerConfig(), temperature=1.0, horizon=4)

    saved = cpu_learner()
    for p in saved.optimizer.param_groups[0]["params"]:  # the moments of a learner that has stepped
        saved.optimizer.state[p].update(step=torch.tensor(1.0), exp_avg=torch.randn_like(p),
                                        exp_avg_sq=torch.rand_like(p))
    saved.save_state(tmp_path / "cpu", is_writer=True)
    want = [saved.optimizer.state[p]["exp_avg"].clone() for p in saved.optimizer.param_groups[0]["params"]]
    fresh = cpu_learner()
    fresh.load_state(tmp_path / "cpu")
    gc.collect()
    assert not _mapped(tmp_path / "cpu" / "learner.pt")
    got = [fresh.optimizer.state[p]["exp_avg"] for p in fresh.optimizer.param_groups[0]["params"]]
    assert all(torch.equal(a, b) for a, b in zip(got, want))
