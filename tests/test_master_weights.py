"""fp32 master weights for a bf16 model in the torch learner (pacs_fast/learner/master_weights.py).

Without them AdamW stepped bf16 weights: at lr 1e-6 an update under 2^-9 of its weight rounded away (98% of
weights unchanged after 10 steps), and micro-batch gradients added up in bf16 (a bf16 audit, 2026-11-29)."""
import copy

import pytest
import torch

from pacs_fast.config import AlgoConfig, LearnerConfig
from pacs_fast.learner import TorchLearner
from pacs_fast.learner.master_weights import MasterWeights
from test_learner_memory_flops import QWEN05


def test_gradients_accumulate_in_fp32_and_leave_no_bf16_gradient(seed):
    """Three micro-batches' bf16 gradients land in the master's fp32 gradient as their exact fp32 sum (each bf16
    value is exact in fp32); in bf16 the same sum rounds at every addition."""
    torch.manual_seed(seed)
    lin = torch.nn.Linear(64, 32).to(torch.bfloat16)
    masters = MasterWeights(list(lin.parameters()))
    assert masters.active and all(m.dtype == torch.float32 for m in masters.masters)
    ref = copy.deepcopy(lin)  # no hooks: its gradients add up in bf16
    parts, want = [], None
    for _ in range(3):
        x = torch.randn(5, 64).to(torch.bfloat16)
        lin(x).float().square().sum().backward()
        assert lin.weight.grad is None and lin.bias.grad is None  # moved into the masters, freed
        g = torch.autograd.grad(ref(x).float().square().sum(), ref.weight)[0]
        parts.append(g)
        ref(x).float().square().sum().backward()
        want = g.float() if want is None else want + g.float()
    assert torch.equal(masters.masters[0].grad, want)
    assert ref.weight.grad.dtype == torch.bfloat16 and not torch.equal(ref.weight.grad.float(), want)
    masters.remove()


@pytest.fixture(scope="module")
def tiny_bf16(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from pacs_fast.data.tiny import make_tiny_model
    path = make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0, hidden_size=64, num_layers=1, num_heads=2,
                           num_kv_heads=1, intermediate_size=96)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)


def _batch(seed):
    from test_learner import random_batch
    return random_batch(seed)


def _learner(model, master, lr=1e-6):
    return TorchLearner(model, algo=AlgoConfig(name="grpo"), temperature=1.0, horizon=8,
                        learner=LearnerConfig(lr=lr, mini_batch_prompts=4, micro_batch_prompts=2, weight_decay=0.0,
                                              master_weights=master))


def _weights(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_small_updates_are_kept_in_the_masters_and_the_model_holds_them_rounded(tiny_bf16, seed):
    """lr 1e-6, one update: with masters every trained weight's master moved (AdamW's first step is ~lr for
    every entry with a gradient) and the model holds each master rounded to bf16; without, most bf16 weights
    did not move at all."""
    moved = {}
    for master in (True, False):
        model = copy.deepcopy(tiny_bf16)
        before = _weights(model)
        learner = _learner(model, master)
        assert (learner.master is not None) == master
        batch = _batch(seed)
        batch.old_logp = learner.compute_logprobs(batch)
        learner.update(batch, seed=seed)
        # the transformer layers' weights (every entry gets a gradient; an unused token's embedding row does not)
        now = dict(zip([n for n, _ in model.named_parameters()], learner.master.masters)) if master else \
            {n: p.detach() for n, p in model.named_parameters()}
        if master:
            for (n, p), m in zip(model.named_parameters(), learner.master.masters):
                assert m.dtype == torch.float32 and torch.equal(p.detach(), m.detach().to(torch.bfloat16)), n
        moved[master] = float(torch.stack([(now[n] != before[n].to(now[n].dtype)).float().mean()
                                           for n in now if ".layers." in n]).mean())
    assert moved[True] > 0.9 and moved[False] < 0.5, moved  # (measured 1.00 and 0.23)


def test_a_checkpoint_restores_the_masters_exactly(tiny_bf16, seed):
    """Two updates in a row equal one update, a checkpoint (the model's bf16 weights and the learner state, as
    pacs_fast/trainer/checkpoint.py writes them), a fresh learner restored from it and the second update:
    masters, AdamW moments and the model's weights bit for bit. A checkpoint without masters (written before
    them) starts them from the model's weights."""
    b1, b2 = _batch(seed), _batch(seed + 1)

    def step(learner, batch):
        batch = copy.deepcopy(batch)
        batch.old_logp = learner.compute_logprobs(batch)
        learner.update(batch, seed=seed)

    straight = _learner(copy.deepcopy(tiny_bf16), True, lr=1e-4)
    step(straight, b1)
    step(straight, b2)

    first = _learner(copy.deepcopy(tiny_bf16), True, lr=1e-4)
    step(first, b1)
    weights = {n: t.clone() for n, t in first.export_hf_weights()}
    state = copy.deepcopy(first.state_dict())
    assert state["master_weights"] is not None and all(t.dtype == torch.float32 for t in state["master_weights"])

    resumed = _learner(copy.deepcopy(tiny_bf16), True, lr=1e-4)
    resumed.load_hf_weights(weights.items())
    resumed.load_state_dict(state)
    step(resumed, b2)
    for a, b in zip(resumed.master.masters, straight.master.masters):
        assert torch.equal(a, b)
    assert all(torch.equal(a, b) for a, b in zip(resumed.model.parameters(), straight.model.parameters()))

    old = _learner(copy.deepcopy(tiny_bf16), True, lr=1e-4)
    old.load_hf_weights(weights.items())
    old.load_state_dict({**state, "master_weights": None})
    assert all(torch.equal(m, p.detach().float()) for m, p in zip(old.master.masters, old.model.parameters()))


def test_an_fp32_model_has_no_separate_masters(tiny_bf16):
    learner = _learner(copy.deepcopy(tiny_bf16).float(), True)
    assert learner.master is None and learner.state_dict()["master_weights"] is None


def test_the_memory_model_counts_the_masters(tmp_path):
    """bf16 learner: 2 (weights) + 4 (masters) + 4 (fp32 gradients) + 8 (fp32 moments) = 18 bytes per parameter,
    both learners; without masters 2 + 2 + 4 = 8; fp32: 16 (no separate masters)."""
    import json

    from pacs_fast.config import load_config
    from pacs_fast.trainer.memory_model import learner_bytes, learner_memory, model_params, model_shape
    (tmp_path / "config.json").write_text(json.dumps({**QWEN05, "tie_word_embeddings": True}))  # Qwen2.5-0.5B

    def cfg(*extra):
        c = load_config(None, [f"model.path={tmp_path}", *extra])
        return c, model_shape(c)

    c, shape = cfg("model.dtype=bfloat16")
    P = model_params(shape)
    assert P > 4e8 and learner_bytes(c, shape) == 18 * P
    mem = learner_memory(c, shape)
    assert mem["weights"] + mem["gradients"] + mem["optimizer"] == 18 * P
    assert learner_bytes(*cfg("model.dtype=bfloat16", "learner.backend=megatron")) == 18 * P
    assert learner_bytes(*cfg("model.dtype=bfloat16", "learner.master_weights=false")) == 8 * P
    assert learner_bytes(*cfg()) == 16 * P


def test_the_setting_is_named_where_it_has_no_effect():
    from pacs_fast.config import load_config, unused_settings
    lines = unused_settings(load_config(None, ["learner.master_weights=false"]))
    assert any(x.startswith("learner.master_weights=false has no effect with model.dtype=float32") for x in lines)
    assert not any("master_weights" in x for x in
                   unused_settings(load_config(None, ["learner.master_weights=false", "model.dtype=bfloat16"])))


@pytest.mark.megatron
def test_the_megatron_learner_trains_a_bf16_model_through_fp32_masters(tmp_path, seed):
    """The megatron learner (one process on gloo, tests/megatron_master_worker.py): every bf16 parameter has an fp32
    master carrying megatron's tensor-parallel attributes (the TP gradient norm reads them), one update at lr 1e-6
    moves the masters where pure bf16 leaves most weights, the model holds the masters rounded, and both checkpoint
    forms (per-rank shards, full HF-named state) resume bit for bit, as does a checkpoint from before the norms were
    bf16."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("megatron.core", reason="megatron-core is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT")}
    here = os.path.dirname(__file__)
    proc = subprocess.run([sys.executable, os.path.join(here, "megatron_master_worker.py"), str(tmp_path / "m"), here,
                           str(seed % 10**6)], env={**env, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert res["separate"] > 0 and res["fp32_masters"] and res["attrs"] and res["tp_attrs"] > 0, res
    assert res["grad_norm"] > 0 and res["rounded"], res
    assert res["moved_master"] > 0.9 and res["moved_pure"] < 0.5, res  # layers (measured 0.999 and 0.22)
    assert res["full_has_masters"] and res["resume_shards"] and res["resume_full"], res
    # the norms are bf16 like every other parameter (megatron built them fp32), and a checkpoint of that older
    # layout (fp32 norms without masters: 3 of them in this 1-layer model) still resumes bit for bit
    assert res["norms_bf16"] and res["old_fp32_norms"] == 3 and res["resume_old_layout"], res
    # its export holds bf16 weights only and says so (its config.json said the input model's float32)
    assert res["export_dtypes"] == ["torch.bfloat16"] and res["export_label"] == "bfloat16", res


def test_a_second_learner_on_the_same_model_takes_over_its_gradients(tiny_bf16, seed):
    """A second TorchLearner on one bf16 model (bench/gpu/learner.py builds one per row): the first learner's hooks
    are removed, so the second's masters get the gradients (the first one's took them and left None: an
    AttributeError in the second's hook, review of 2026-11-29), and a deep copy of the model is not touched."""
    model = copy.deepcopy(tiny_bf16)
    first = _learner(model, True)
    batch = _batch(seed)
    batch.old_logp = first.compute_logprobs(batch)
    first.update(copy.deepcopy(batch), seed=0)
    twin = copy.deepcopy(model)
    second = _learner(model, True, lr=1e-4)
    before = [m.detach().clone() for m in first.master.masters]
    second.update(copy.deepcopy(batch), seed=0)
    assert all(torch.equal(m, b) for m, b in zip(first.master.masters, before))  # no longer fed
    assert all(torch.equal(p.detach(), m.detach().to(p.dtype))
               for p, m in zip(model.parameters(), second.master.masters))
    third = _learner(twin, True)  # the copy's parameters have hooks of their own; the model's stay
    third.update(copy.deepcopy(batch), seed=0)
    moved = [m.detach().clone() for m in second.master.masters]
    second.update(copy.deepcopy(batch), seed=1)
    assert any(not torch.equal(m, b) for m, b in zip(second.master.masters, moved))
    second.master.remove()
    assert second.master.active and second.master.state_dict() is not None  # still holds its masters


def test_fp32_checkpoint_weights_load_into_the_masters_at_full_precision(tiny_bf16, seed):
    """load_hf_weights (a checkpoint's weights, both learners) writes them into the fp32 masters, so an fp32 tensor
    keeps the digits bf16 cannot hold (they were rounded into the model, then copied back); the model holds them
    rounded (review of 2026-11-29; megatron: tests/megatron_master_worker.py's old-layout resume)."""
    learner = _learner(copy.deepcopy(tiny_bf16), True)
    gen = torch.Generator().manual_seed(seed)
    fp32 = {n: p.detach().float() + 1e-4 * torch.randn(p.shape, generator=gen)
            for n, p in learner.model.named_parameters()}
    learner.load_hf_weights(fp32.items())
    names = [n for n, _ in learner.model.named_parameters()]
    for name, p, m in zip(names, learner.master.params, learner.master.masters):
        assert torch.equal(m.detach(), fp32[name]), name  # every digit
        assert torch.equal(p.detach(), fp32[name].to(torch.bfloat16)), name  # the model: rounded once
    assert any(not torch.equal(t, t.to(torch.bfloat16).float()) for t in fp32.values())  # (bf16 cannot hold them)


def test_an_optimiser_step_that_cannot_fit_names_the_masters(tmp_path):
    """Between the floor (18 bytes a parameter) and the step's peak: refused, naming learner.master_weights=false
    among the ways out; with it the same device fits."""
    import json

    from pacs_fast.config import load_config
    from pacs_fast.trainer.memory_model import model_params, model_shape
    from pacs_fast.trainer.preflight import check_memory
    (tmp_path / "config.json").write_text(json.dumps({**QWEN05, "tie_word_embeddings": True}))  # Qwen2.5-0.5B
    args = [f"model.path={tmp_path}", "model.dtype=bfloat16", "rollout.n=2", "train.prompts_per_step=1",
            "rollout.max_new_tokens=16", "data.max_prompt_tokens=16", "learner.mini_batch_prompts=1",
            "data.dataset=math500", "model.device=cpu"]
    cfg = load_config(None, args)
    available = int(19.5 * model_params(model_shape(cfg)))
    with pytest.raises(ValueError, match=r"^the optimiser step cannot fit in the learner: .*learner.master_weights="
                                         r"false \(pure bf16"):
        check_memory(cfg, available=available)
    check_memory(load_config(None, [*args, "learner.master_weights=false"]), available=available)
