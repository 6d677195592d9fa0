"""The learners' gradient norm (pacs_fast/learner/grad_norm.py) against float64, and the torch learner's record
of it. On this CPU torch's ``clip_grad_norm_`` read 3.6e-4 below float64 for 1e7 standard normals (its
``vector_norm`` kernel), and the torch learner's ``grad_norm`` 4.6e-5 below the megatron learner's on a
Qwen2.5-0.5B-shaped model (a real-shape sweep of 2026-11-30), whose gradients were equal to 1e-6."""
import math

import torch

from pacs_fast.config import AlgoConfig, LearnerConfig
from pacs_fast.learner.base import RolloutBatch
from pacs_fast.learner.grad_norm import clip_grad_norm


def _params(seed):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(10_000_000,), (1000, 30), (7,)]
    params = [torch.zeros(s, requires_grad=True) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    params.append(torch.zeros(3, requires_grad=True))  # no gradient: left out
    return params


def _exact(params) -> float:
    return math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in params if p.grad is not None))


def test_the_norm_is_float64_s_to_fp32_rounding(seed):
    """Bound 1e-6 relative: a cascade sum of 1e7 fp32 squares is good to ~1e-7; the fault seen was 3.6e-4."""
    params = _params(seed)
    exact = _exact(params)
    norm = clip_grad_norm(params, math.inf)
    assert norm.dtype == torch.float32 and abs(float(norm) - exact) <= 1e-6 * exact
    assert abs(_exact(params) - exact) <= 1e-9 * exact  # max_norm=inf: untouched
    norm = clip_grad_norm(params, 10.0)  # clipped to 10 (1e-6: torch's own scale, 10 / (norm + 1e-6))
    assert abs(float(norm) - exact) <= 1e-6 * exact and abs(_exact(params) - 10.0) <= 1e-5
    params[1].grad[3, 4] = float("nan")
    assert not math.isfinite(float(clip_grad_norm(params, 1.0)))


def test_half_gradients_get_an_fp32_norm(seed):
    """torch's clip_grad_norm_ returns bf16 gradients' norm in bf16 (1.3e-3 off for 4,007 normals), where the
    megatron learner's is fp32 (bf16 models without master weights)."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.zeros(4007, dtype=torch.bfloat16, requires_grad=True)
    p.grad = torch.randn(4007, generator=gen).bfloat16()
    exact = _exact([p])
    norm = clip_grad_norm([p], math.inf)
    assert norm.dtype == torch.float32 and abs(float(norm) - exact) <= 1e-6 * exact


def test_the_torch_learner_records_and_clips_by_it(monkeypatch, seed):
    """The update's ``grad_norm`` is the exact norm of the gradients it stepped with (a 150,000-row vocabulary:
    the embedding's gradient is where torch's CPU norm went wrong)."""
    import transformers

    import pacs_fast.learner.torch_learner as tl
    from pacs_fast.data.tiny import tiny_qwen2_config

    model = transformers.Qwen2ForCausalLM(tiny_qwen2_config(150_000, hidden_size=64, num_layers=1,
                                                            intermediate_size=128))
    seen = []

    def spy(params, max_norm):
        params = list(params)
        exact = _exact(params)
        norm = clip_grad_norm(params, max_norm)
        seen.append((exact, float(norm)))
        return norm

    monkeypatch.setattr(tl, "clip_grad_norm", spy)
    learner = tl.TorchLearner(model, algo=AlgoConfig(name="pacs", ref="fixed"),
                              learner=LearnerConfig(lr=1e-3, grad_clip=1e9, mini_batch_prompts=2,
                                                    micro_batch_prompts=2), temperature=1.0, horizon=12)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 150_000, (8, 24), generator=gen)
    rm = torch.zeros(8, 24)
    rm[:, 12:] = 1
    batch = RolloutBatch(input_ids=ids, attention_mask=torch.ones(8, 24, dtype=torch.long), response_mask=rm,
                         rewards=torch.tensor([1.0, 0, 0, 1, 0, 1, 1, 0]), group_size=4)
    batch.old_logp = learner.compute_logprobs(batch)
    batch.ref_logp = batch.old_logp - 0.1 * rm  # a reference apart from the policy: psi != 0, gradients flow
    metrics = learner.update(batch, seed=seed)
    assert len(seen) == 1
    exact, norm = seen[0]
    assert exact > 0 and abs(norm - exact) <= 1e-6 * exact and metrics["grad_norm"] == norm
