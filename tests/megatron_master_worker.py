"""The megatron learner with a bf16 model and fp32 master weights, one process on gloo (tests/test_master_weights.py
runs it: megatron's global state stays out of the test process). argv: model folder, tests folder, seed.
Prints ``RESULT <json>``."""
import copy
import json
import sys
import tempfile

import torch

sys.path.insert(0, sys.argv[2])
from test_learner import random_batch  # noqa: E402

from pacs_fast.config import AlgoConfig, LearnerConfig
from pacs_fast.data.tiny import make_tiny_model
from pacs_fast.learner.megatron.learner import MegatronLearner
path = make_tiny_model(sys.argv[1], seed=0, hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                       intermediate_size=96, tie_word_embeddings=False)


def make(lr=1e-6, master=True):
    return MegatronLearner(path, algo=AlgoConfig(name="grpo"), dtype="bfloat16", device="cpu", horizon=8,
                           learner=LearnerConfig(lr=lr, mini_batch_prompts=4, micro_batch_prompts=2, weight_decay=0.0,
                                                 master_weights=master))


def step(learner, batch, seed):
    batch = copy.deepcopy(batch)
    batch.old_logp = learner.compute_logprobs(batch)
    return learner.update(batch, seed=seed)


def same(xs, ys):
    return all(torch.equal(x, y) for x, y in zip(xs, ys))


res = {}
a = make()
pairs = [(p, m) for p, m in zip(a.params, a.master.masters) if m is not p]  # bf16 parameters and their masters
res["separate"], res["params"] = len(pairs), len(a.params)
res["fp32_masters"] = all(m.dtype == torch.float32 and p.dtype == torch.bfloat16 for p, m in pairs)
# megatron's tensor-parallel attributes, which the TP gradient norm reads from the optimiser's parameters
res["attrs"] = all(getattr(m, k, None) == getattr(p, k, None) for p, m in pairs
                   for k in ("tensor_model_parallel", "partition_dim", "partition_stride"))
res["tp_attrs"] = sum(bool(getattr(m, "tensor_model_parallel", False)) for _, m in pairs)
before = [p.detach().clone() for p, _ in pairs]
# the transformer layers (every entry gets a gradient; a vocabulary row of a token not in the batch does not)
names = [n for n, p in a.model.named_parameters() if p.requires_grad]
layer = [n.startswith("decoder.") for n, p, m in zip(names, a.params, a.master.masters) if m is not p]
seed = int(sys.argv[3])
b1, b2 = random_batch(seed), random_batch(seed + 1)
res["grad_norm"] = step(a, b1, 1)["grad_norm"]
res["layers"] = sum(layer)
res["moved_master"] = float(torch.stack([(m != b.float()).float().mean() for (_, m), b, keep in
                                         zip(pairs, before, layer) if keep]).mean())
res["rounded"] = all(torch.equal(p.detach(), m.detach().to(p.dtype)) for p, m in pairs)
pure = make(master=False)
step(pure, b1, 1)
pure_bf16 = [p for p in pure.params if p.dtype == torch.bfloat16]
res["moved_pure"] = float(torch.stack([(p.detach() != b).float().mean() for p, b, keep in
                                       zip(pure_bf16, before, layer) if keep]).mean())
# resume: two updates in a row against one, a checkpoint (per-rank shards as the trainer writes them, or the full
# HF-named state), a fresh learner restored from it and the second update
straight = make(lr=1e-4)
step(straight, b1, 1)
step(straight, b2, 2)
first = make(lr=1e-4)
step(first, b1, 1)
folder = tempfile.mkdtemp()
first.save_state(folder, is_writer=True)
weights = dict(first.export_hf_weights())
full = first.state_dict()
res["full_has_masters"] = full.get("master_weights") is not None
for how in ("shards", "full"):
    r = make(lr=1e-4)
    r.load_hf_weights(weights.items())
    r.load_state(folder) if how == "shards" else r.load_state_dict(full)
    step(r, b2, 2)
    res[f"resume_{how}"] = same(r.master.masters, straight.master.masters) and same(r.params, straight.params)
# a checkpoint of the layout before the norms were built in the model's dtype (fp32 norms, no master for them):
# the norms' fp32 values in the weights, the shard's masters without theirs; it resumes bit for bit
import os  # noqa: E402
import shutil  # noqa: E402

from pacs_fast.learner.megatron.state import shard_file  # noqa: E402
res["norms_bf16"] = all(m.weight.dtype == torch.bfloat16 for m in first.model.modules()
                        if isinstance(m, torch.nn.RMSNorm))
names = [n for n, q in first.model.named_parameters() if q.requires_grad]
old_weights = {k: (full["master_weights"][k] if "norm" in k else v) for k, v in weights.items()}
res["old_fp32_norms"] = sum(v.dtype == torch.float32 for v in old_weights.values())
old = tempfile.mkdtemp()
for f in os.listdir(folder):
    shutil.copy(os.path.join(folder, f), old)
shard = torch.load(os.path.join(old, shard_file(0)), weights_only=False)
shard["master_weights"] = [m for n, m in zip(names, shard["master_weights"]) if "layernorm" not in n]
torch.save(shard, os.path.join(old, shard_file(0)))
r = make(lr=1e-4)
r.load_hf_weights(old_weights.items())
r.load_state(old)
step(r, b2, 2)
res["resume_old_layout"] = same(r.master.masters, straight.master.masters) and same(r.params, straight.params)
# the exported folder is labelled with the dtype of the weights it holds (it carried the input model's: float32)
from safetensors import safe_open  # noqa: E402
out = tempfile.mkdtemp()
first.save_hf(out)
with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
    res["export_dtypes"] = sorted({str(f.get_tensor(k).dtype) for k in f.keys()})
res["export_label"] = json.load(open(os.path.join(out, "config.json"))).get("dtype")
for made in (folder, old, out):  # (each CI run had left these three folders in /tmp)
    shutil.rmtree(made, ignore_errors=True)
print("RESULT", json.dumps(res))
