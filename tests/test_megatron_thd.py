"""The megatron learner's packed rows in THD layout (issue 38) and its fused off-policy correction,
on CPU / gloo on two ranks (tests/megatron_thd_worker.py, in the session's one megatron launch:
tests/megatron_launch.py).

- THD (one row, ``PackedSeqParams`` with ``cu_seqlens``, megatron's per-sequence RoPE, the varlen
  core attention of :mod:`pacs_fast.learner.megatron.core_attention`) vs the dense block-diagonal
  mask vs padded rows (a causal kernel without a mask, and megatron's own attention with the causal mask), at TP = 1
  and TP = 2, a GQA model (4 / 2 heads, 2 / 1 per rank at TP = 2),
  rows of 1 to 300 tokens with left padding and (TP = 2) rows up to ~1.4k tokens: log-probs,
  entropies, the loss and every parameter's gradient agree per sequence to 1e-5 (fp32); no attention
  call of the THD or padded forward takes megatron's dense ``[S, S]`` path; in every layout only the response tokens'
  hidden states reach the LM head.
- ``learner.fused_layers`` (the MLPs' SwiGLU through Liger's fused gate-up op): the wiring, driven with the op's
  exact torch twin, gives megatron's own values bit for bit, padded and THD, TP = 1 and 2, with full and selective
  recompute (``model.recompute_granularity``), which themselves give the values without recompute bit for bit.
- Fused correction, TP = 2 and TP = 1 x DP = 2 (full batches: the first mini-batch's values gathered
  over the data-parallel ranks): the update's own first forward gives the separate pass's old
  log-probs, entropies and importance weights, and the same update, forwarding the first mini-batch's
  rows once instead of twice.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import draw_seed, requires_megatron
from megatron_launch import megatron_folder
from rollout_rows import rollout_rows as _rows

pytest.importorskip("transformers")

pytestmark = [requires_megatron, pytest.mark.megatron, pytest.mark.distributed]

VOCAB = 250  # odd for TP = 2: the padded vocabulary row must not count


def _forward_batch(gen, lengths, *, tp, modes):
    ids, am, rm = _rows(gen, lengths, VOCAB, left_pad=True)
    B = len(lengths)
    return {"input_ids": ids, "attention_mask": am, "response_mask": rm, "group_size": 4,
            "rewards": (torch.rand(B, generator=gen) < 0.5).float(),
            "logp_ref": -3 * torch.rand(B, ids.shape[1], generator=gen) * rm, "tp": tp, "modes": modes}


def prepare_megatron_inputs(wd: Path) -> None:
    """The worker's models and ``inputs.pt`` in ``wd`` (tests/megatron_launch.py: once per session)."""
    from transformers import Qwen2ForCausalLM

    from pacs_fast.data.tiny import make_tiny_model, tiny_qwen2_config

    seed = draw_seed()
    (wd / "seed.txt").write_text(str(seed))
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        Qwen2ForCausalLM(tiny_qwen2_config(VOCAB, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                                           intermediate_size=256, max_positions=2048)).save_pretrained(wd / "qwen")
    batches = {"uneven": _forward_batch(gen, [1, 300, 7, 45, 2, 180, 33, 120], tp=(1, 2),
                                        modes=("padded", "padded_megatron", "dense", "thd")),
               "long": _forward_batch(gen, [1400, 5, 230, 64], tp=(2,), modes=("dense", "thd"))}
    lengths = [int(x) for x in torch.randint(14, 48, (16,), generator=gen)]  # >= 2 response tokens each
    lids, lam, lrm = _rows(gen, lengths, 128, left_pad=False)
    noise = 0.4 * torch.randn(lrm.shape, generator=gen)
    noise[0] = -noise[0].abs() - 0.2  # row 0's weights exceed the cap: some are truncated
    learner = {
        "model": str(make_tiny_model(wd / "tiny", seed=seed % 1000, tie_word_embeddings=False)),
        "horizon": lids.shape[1], "seed": seed % 1000, "noise": noise,
        "algo": {"name": "pacs", "beta": 1.0, "score": "rloo", "weight": "question", "entropy_coef": 0.01},
        # two mini-batches x two epochs: the first mini-batch's weights from its forwards, the rest from
        # the no-grad pass, both kept for the second epoch; eps 1e-3 as tests/test_megatron_tp.py
        "learner": {"lr": 1e-3, "eps": 1e-3, "grad_clip": 1.0, "mini_batch_prompts": 2, "micro_batch_prompts": 1,
                    "epochs": 2, "logprob_backend": "torch", "packing": "on"},
        "batch": {"input_ids": lids, "attention_mask": lam, "response_mask": lrm,
                  "rewards": (torch.rand(16, generator=gen) < 0.5).float(), "group_size": 4},
    }
    inputs = {"model": str(wd / "qwen"), "batches": batches, "learner": learner}
    torch.save(inputs, wd / "inputs.pt")


@pytest.fixture(scope="module")
def run(request, tmp_path_factory):
    """(inputs, results) of tests/megatron_thd_worker.py, from the session's megatron launch."""
    wd = megatron_folder(request, tmp_path_factory, "test_megatron_thd.py")
    return torch.load(wd / "inputs.pt"), torch.load(wd / "results.pt")


def _close(a, b, rel):
    """``a`` within ``rel`` of ``b``'s largest magnitude (entries near 0 carry the absolute part)."""
    return float((a - b).abs().max()) <= rel * max(float(b.abs().max()), 1e-12)


def _per_sequence_close(a, b, mask, rel):
    """Every row's response values within ``rel`` of that row's largest magnitude."""
    return all(_close(a[i][mask[i]], b[i][mask[i]], rel) for i in range(mask.shape[0]) if mask[i].any())


CASES = [(tp, "uneven", mode, ref) for tp in (1, 2) for mode in ("thd", "padded")
         for ref in ("padded_megatron", "dense")] + [(2, "long", "thd", "dense")]


@pytest.mark.parametrize("tp, batch, mode, ref", CASES)
def test_thd_and_padded_equal_megatrons_attention(run, tp, batch, mode, ref):
    """THD rows (varlen kernel) and padded rows (a causal kernel without a mask) against megatron's own attention
    (DotProductAttention: the padded rows' causal mask, the dense block-diagonal mask)."""
    inputs, res = run
    thd, base = res[f"forward/tp{tp}/{batch}/{mode}"], res[f"forward/tp{tp}/{batch}/{ref}"]
    m = inputs["batches"][batch]["response_mask"] > 0
    assert bool((base["ent"][m] > 0).all())  # a live entropy on every response token
    assert not thd["logp"][~m].any() and not thd["ent"][~m].any()  # nothing computed outside the response
    assert _per_sequence_close(thd["logp"], base["logp"], m, 1e-5)
    assert _per_sequence_close(thd["ent"], base["ent"], m, 1e-5)
    assert abs(float(thd["loss"] - base["loss"])) <= 1e-5 * abs(float(base["loss"]))
    assert thd["grads"].keys() == base["grads"].keys() and len(base["grads"]) > 10
    for name, g in base["grads"].items():
        assert g.abs().max() > 0, name
        assert _close(thd["grads"][name], g, 1e-5), name
    # THD and the padded rows never take megatron's [S, S] path; the references do, once per layer
    assert thd["dense_calls"] == 0 and base["dense_calls"] == 2
    # padded or packed, only the response tokens reach the LM head (each has a prompt token before it)
    assert thd["head_rows"] == base["head_rows"] == int(m.sum())


@pytest.mark.parametrize("key", ["tp1/padded", "tp1/thd", "tp2/padded", "tp2/thd", "tp2/recompute/padded",
                                 "tp2/recompute/thd", "tp2/selective/padded", "tp2/selective/thd"])
def test_fused_swiglu_wiring_equals_megatrons_own_bit_for_bit(run, key):
    """learner.fused_layers on the megatron learner's model (pacs_fast/learner/fused_layers.py), driven with the
    fused op's exact torch twin (Liger's kernels need a GPU): every MLP is replaced (none missed, none twice), the
    op gets linear_fc1's whole [gate | up] shard of this rank, and log-probs, entropies, the loss and every
    gradient equal megatron's own MLP bit for bit, with recompute too; unfuse_layers gives its own MLP back."""
    _, res = run
    out = res[f"fused/{key}"]
    tp, layers, ffn = int(key[2]), 2, 256
    assert out["done"] == {"rms_norm": 0, "swiglu": layers}  # the norms stay torch.nn.RMSNorm
    recompute = "recompute" in key or "selective" in key
    granularity = "selective" if "selective" in key else ("full" if recompute else None)
    assert out["recompute"][0] == granularity and out["recompute"][2] == [granularity == "selective"] * layers
    if granularity == "selective":  # megatron recomputes each layer's MLP, nothing else (recompute_overrides)
        assert out["recompute"][1] == ["mlp"]
    assert out["calls"] == layers * (2 if recompute else 1)  # (recompute runs each layer's MLP again)
    assert out["widths"] == [2 * ffn // tp]
    for got in (out["fused"], out["after"]):
        assert torch.equal(got["logp"], out["plain"]["logp"]) and torch.equal(got["ent"], out["plain"]["ent"])
        assert torch.equal(got["loss"], out["plain"]["loss"])
        assert got["grads"].keys() == out["plain"]["grads"].keys()
        for name, g in out["plain"]["grads"].items():
            assert g.abs().max() > 0, name
            assert torch.equal(got["grads"][name], g), name
    assert out["unfused"] == layers and out["calls_after"] == 0
    if recompute:  # model.recompute_granularity (full / selective): megatron's recompute changes no value
        base = res[f"fused/tp2/{key.rsplit('/', 1)[1]}"]["plain"]
        assert torch.equal(out["plain"]["logp"], base["logp"]) and torch.equal(out["plain"]["loss"], base["loss"])
        for name, g in base["grads"].items():
            assert torch.equal(out["plain"]["grads"][name], g), name


def test_learner_fused_layers_auto_is_off_on_the_cpu(run):
    _, res = run
    for key in ("learner/tp2/fused", "learner/tp1/fused"):
        line = res[key]["fused_layers"]
        assert line.startswith("fused layers: off (") and "CUDA" in line, line


def test_thd_refuses_attention_dropout(run):
    _, res = run
    assert "attention dropout" in res["dropout_error"] and "packed_attention=dense" in res["dropout_error"]


def test_packed_attention_setting_is_checked():
    from pacs_fast.learner.megatron.forward import token_logprobs

    ids = torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="packed_attention must be one of"):
        token_logprobs(None, ids, torch.ones_like(ids), vocab_size=8, packing="on", packed_attention="flash")


@pytest.mark.parametrize("tp", [2, 1])
def test_fused_correction_equals_a_separate_pass(run, tp):
    """update(correct=...) with old_logp None: the weights come from the update's own first forward
    (and the no-grad pass for the later mini-batch) and match those of a separate pass before it; so
    do the old log-probs, the entropies, the metrics and the updated weights (the two forwards differ
    at most by float32 summation order)."""
    _, res = run
    sep, fus = res[f"learner/tp{tp}/separate"], res[f"learner/tp{tp}/fused"]
    assert fus["flags"] == (True, True) and fus["ref_is_old"]
    resp = sep["kept_mask"] > 0
    w = sep["is_weights"][resp]
    assert float(w.std()) > 0.01 and bool((w == 1.2).any())  # spread, some truncated: non-trivial
    assert torch.allclose(fus["is_weights"], sep["is_weights"], atol=1e-5)
    assert torch.equal(fus["kept_mask"], sep["kept_mask"])
    assert torch.allclose(fus["old_logp"], sep["old_logp"], atol=1e-5)
    assert torch.allclose(fus["old_entropy"], sep["old_entropy"], atol=1e-5)
    assert fus["metrics"].keys() == sep["metrics"].keys()
    for k, v in sep["metrics"].items():
        if k.startswith("forward/"):  # how many forwards ran: the fused update runs its no-grad pass inside
            continue
        assert fus["metrics"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    # two Adam steps per epoch on gradients equal up to rounding: 1e-3 of lr plus 2 ulp of the weight (Adam
    # amplifies the rounding of near-zero gradient entries up to lr/eps; a real gradient difference moves a
    # weight by ~1e-2 x lr or more: see tests/test_megatron_packing.py, where 1e-4 x lr failed one draw)
    lr, ulp = run[0]["learner"]["learner"]["lr"], torch.finfo(torch.float32).eps
    for name, t in sep["weights"].items():
        assert float((fus["weights"][name] - t).abs().max()) <= 1e-3 * lr + 2 * ulp * float(t.abs().max()), name
    # no wasted forward: the fused update skips exactly the first mini-batch's rows (this rank's share)
    spec = run[0]["learner"]
    first = spec["learner"]["mini_batch_prompts"] * spec["batch"]["group_size"] // fus["dp"]
    assert fus["rows_run"] == sep["rows_run"] - first
