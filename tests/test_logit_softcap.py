"""Models whose logits are not their LM head's train on their own log-probs: ``linear_logprobs(..., softcap=c)``
(Gemma 2's ``final_logit_softcapping``: ``x = c * tanh(z / c) / T``) against float64 references, and the torch
learner on Gemma 2 (a cap), Cohere (``logit_scale``) and Granite (``logits_scaling``) against the models' own
``log_softmax(model(ids).logits / T)``. These models were refused before (the learner and the command line).

Tolerances: the op computes in fp32 from the inputs' values (bf16 inputs are exact in fp32), so its log-probs and
entropies are those of fp32 logits: an error of a few ulp of the largest logit (here <= c / T ~ 43), 2e-6 of it.
Gradients: fp32 GEMMs over H (and N / V for the weight), plus the cap's slope ``1 / cosh(z / c)^2``, whose relative
error is ~2 |dz| / c for a GEMM error dz ~ ulp(z): 6e-5 / 30 * 2 = 4e-6 at |z| ~ 1e3; bounds 1e-5 of the largest
entry (3e-5 at |z| ~ 1e3). bf16 gradients are returned rounded to bf16: 2^-8 of the largest entry."""
import json

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pacs_fast.config import AlgoConfig, LearnerConfig
from pacs_fast.learner.torch_learner import TorchLearner
from pacs_fast.ops.linear_logprobs import linear_logprobs
from test_packing import uneven_batch

pytestmark = pytest.mark.usefixtures("dynamo_on")  # (torch.compile tests: tests/conftest.py)

N, H, V = 37, 24, 1001


def _inputs(seed, z_scale=1.0, bias=True, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, H, generator=g, dtype=torch.float64) * z_scale
    w = torch.randn(V, H, generator=g, dtype=torch.float64) / H ** 0.5 * 3
    b = torch.randn(V, generator=g, dtype=torch.float64) if bias else None
    labels = torch.randint(0, V, (N,), generator=g)
    labels[[3, 17, 36]] = -100  # masked rows: 0, no gradient
    gl, ge = torch.randn(N, generator=g, dtype=torch.float64), torch.randn(N, generator=g, dtype=torch.float64)
    cast = (lambda t: None if t is None else t.to(dtype))
    return cast(h), cast(w), cast(b), labels, gl, ge


def _reference(h, w, b, labels, cap, T, gl, ge):
    """float64 values and gradients from the explicit logits ``log_softmax(cap * tanh((h @ W.T + b) / cap) / T)``."""
    h, w = h.double().requires_grad_(), w.double().requires_grad_()
    b = b.double().requires_grad_() if b is not None else None
    z = h @ w.T + (b if b is not None else 0)
    lp = torch.log_softmax((cap * torch.tanh(z / cap) if cap else z) / T, -1)
    keep = labels != -100
    logp = torch.where(keep, lp.gather(1, labels.clamp(min=0)[:, None])[:, 0], 0.0)
    ent = torch.where(keep, -(lp.exp() * lp).sum(-1), 0.0)
    (logp * gl + ent * ge).sum().backward()
    return [logp, ent, h.grad, w.grad] + ([b.grad] if b is not None else [])


def _op(h, w, b, labels, gl, ge, **kw):
    h, w = h.clone().requires_grad_(), w.clone().requires_grad_()
    b = b.clone().requires_grad_() if b is not None else None
    logp, ent = linear_logprobs(h, w, labels, bias=b, return_entropy=True, **kw)
    (logp.double() * gl + ent.double() * ge).sum().backward()
    return [logp, ent, h.grad, w.grad] + ([b.grad] if b is not None else [])


# (cap, T, |z| scale, bias, dtype, chunk_bytes, value bound, gradient bound): bounds relative to the largest entry
CASES = {"plain": (5.0, 1.0, 1.0, True, torch.float32, None, 2e-6, 1e-5),
         "T0.7_no_bias_tiles": (5.0, 0.7, 1.0, False, torch.float32, (8, 128), 2e-6, 1e-5),
         "saturated_1e3": (30.0, 0.7, 300.0, True, torch.float32, (16, 300), 2e-6, 3e-5),
         "bf16": (2.0, 1.3, 1.0, True, torch.bfloat16, (8, 256), 2e-6, 2 ** -8)}


@pytest.mark.parametrize("case", CASES)
def test_the_capped_op_is_the_float64_reference(case):
    cap, T, z_scale, bias, dtype, chunk, vb, gb = CASES[case]
    h, w, b, labels, gl, ge = _inputs(7, z_scale, bias, dtype)
    want = _reference(h, w, b, labels, cap, T, gl, ge)
    got = _op(h, w, b, labels, gl, ge, softcap=cap, temperature=T, chunk_bytes=chunk)
    if z_scale > 1:  # the tanh saturates: |z| ~ 1e3 and most logits sit at +-cap / T
        z = h.double() @ w.double().T
        assert z.abs().max() > 1e3 and (z.abs() > 10 * cap).float().mean() > 0.5
    assert got[2].dtype == got[3].dtype == dtype
    for name, g, r in zip(("logp", "entropy", "dhidden", "dweight", "dbias"), got, want):
        bound = (vb if name in ("logp", "entropy") else gb) * max(r.abs().max().item(), 1.0)
        err = (g.double() - r).abs().max().item()
        assert err <= bound, (case, name, err, bound)
    assert (got[0][labels == -100] == 0).all() and (got[2][labels == -100] == 0).all()
    # the cap matters here: the uncapped log-probs are far off
    assert (_reference(h, w, b, labels, None, T, gl, ge)[0] - want[0]).abs().max() > 0.1


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(5, 3, generator=g, dtype=torch.float64) * 3).requires_grad_()
    w = torch.randn(7, 3, generator=g, dtype=torch.float64).requires_grad_()
    b = torch.randn(7, generator=g, dtype=torch.float64).requires_grad_()
    labels = torch.tensor([0, 6, -100, 3, 2])

    def f(h, w, b):
        return linear_logprobs(h, w, labels, bias=b, temperature=0.8, softcap=2.0, return_entropy=True,
                               chunk_bytes=(2, 3))
    assert torch.autograd.gradcheck(f, (h, w, b), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_no_cap_is_bitwise_the_old_computation():
    h, w, b, labels, gl, ge = _inputs(3, 2.0)
    old = _op(h, w, b, labels, gl, ge, temperature=0.7, chunk_bytes=(8, 128))
    for off in (None, 0, 0.0):
        new = _op(h, w, b, labels, gl, ge, temperature=0.7, chunk_bytes=(8, 128), softcap=off)
        assert all(torch.equal(x, y) for x, y in zip(old, new)), off


@pytest.mark.parametrize("bad", [True, -1.0, float("nan"), float("inf"), "30", [30.0]])
def test_a_bad_softcap_is_a_value_error_naming_it(bad):
    h, w, b, labels, _, _ = _inputs(0)
    with pytest.raises(ValueError, match="softcap"):
        linear_logprobs(h, w, labels, softcap=bad)


# The tiled Triton kernels with a cap, under the interpreter (small blocks: ragged row / vocab tiles; the split
# forward; both backwards; V_TILES > 1, whose masked columns must be -inf after the cap, not -cap): the same float64
# reference and bounds as the torch path (fp32 GEMMs; the kernels' tanh from one ex2 errs by ~1e-7 of the cap).
TRITON_CASES = {"tiles_chunked": dict(FWD="tiles", backward="chunked", cap=5.0, T=1.0, z=1.0, bias=True),
                "tiles_vtiles_atomic": dict(FWD="tiles", V_TILES=2, backward="atomic", cap=5.0, T=0.7, z=1.0,
                                            bias=False),
                "split_saturated": dict(FWD="split", backward="chunked", cap=30.0, T=0.7, z=300.0, bias=True),
                "tiles_bf16": dict(FWD="tiles", backward="chunked", cap=2.0, T=1.3, z=1.0, bias=True,
                                   dtype=torch.bfloat16)}


@pytest.mark.interpret
@pytest.mark.filterwarnings("error::pacs_fast.kernels.dispatch.KernelFallbackWarning")  # (no fallback: the kernels ran)
@pytest.mark.parametrize("case", TRITON_CASES)
def test_the_triton_kernels_cap_as_the_float64_reference(case, monkeypatch):
    from pacs_fast.kernels import linear_logprobs as K

    c = dict(TRITON_CASES[case])
    cap, T, z_scale, bias, backward = (c.pop(k) for k in ("cap", "T", "z", "bias", "backward"))
    dtype = c.pop("dtype", torch.float32)
    cfg = dict(BLOCK_N=16, BLOCK_V=16, BLOCK_H=16, GROUP_N=2, V_TILES=1, PERSISTENT=0, num_warps=1, num_stages=1,
               SPLITS=3, BWD_CHUNK_BYTES=16 * 512 * 4)
    for k, v in {**cfg, **c}.items():
        monkeypatch.setitem(K.CONFIG, k, v)
    h, w, b, labels, gl, ge = _inputs(11, z_scale, bias, dtype)
    h, w, labels = h[:21], w[:203], labels[:21].clamp(max=202)  # (interpreter: small; 203 = 12 ragged tiles of 16)
    b = b[:203] if b is not None else None
    gl, ge = gl[:21], ge[:21]
    want = _reference(h, w, b, labels, cap, T, gl, ge)
    got = _op(h, w, b, labels, gl, ge, softcap=cap, temperature=T, backend="triton", triton_backward=backward)
    _, vb, gb = CASES["saturated_1e3" if z_scale > 1 else ("bf16" if dtype == torch.bfloat16 else "plain")][5:]
    bf16 = {}
    if dtype == torch.bfloat16:  # besides the bf16 gradients' own rounding (2^-8 of the largest entry, as the torch
        # path's), the kernels round dz to bf16 (2^-9 relative) before the backward's bf16 GEMMs: dh, dW and db err
        # by up to 2^-8 of sum_j |dz_ij| |W_j| (resp. of sum_i |dz_ij| |h_i|, sum_i |dz_ij|) more
        z = (h.double() @ w.double().T + b.double()).requires_grad_()
        lp = torch.log_softmax(cap * torch.tanh(z / cap) / T, -1)
        keep = labels != -100
        lpt = torch.where(keep, lp.gather(1, labels.clamp(min=0)[:, None])[:, 0], 0.0)
        ent = torch.where(keep, -(lp.exp() * lp).sum(-1), 0.0)
        dz = torch.autograd.grad((lpt * gl + ent * ge).sum(), z)[0].abs()
        bf16 = {"dhidden": (dz @ w.double().abs()).max(), "dweight": (dz.T @ h.double().abs()).max(),
                "dbias": dz.sum(0).max()}
    for name, g, r in zip(("logp", "entropy", "dhidden", "dweight", "dbias"), got, want):
        bound = (vb if name in ("logp", "entropy") else gb) * max(r.abs().max().item(), 1.0)
        bound += 2 ** -8 * float(bf16.get(name, 0.0))
        err = (g.double() - r).abs().max().item()
        assert err <= bound, (case, name, err, bound)
    assert (_reference(h, w, b, labels, None, T, gl, ge)[0] - want[0]).abs().max() > 0.1  # (the cap matters)


@pytest.mark.interpret
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_a_capped_call_makes_no_host_sync_and_a_failing_kernel_falls_back(backend, monkeypatch):
    """A capped call keeps the op's promises: no device-to-host sync in forward + backward (CUDA-graph capturable),
    and a failing tiled kernel hands the call to the torch path with one warning, same values."""
    import warnings

    from test_kernel_dispatch import NoHostSync, _spy

    from pacs_fast.kernels import dispatch, linear_logprobs as K, linear_logprobs_fwd as KF
    for k, v in dict(BLOCK_N=16, BLOCK_V=16, BLOCK_H=16, GROUP_N=2, num_warps=1, num_stages=1).items():
        monkeypatch.setitem(K.CONFIG, k, v)
    dispatch.reset()
    h, w, b, labels, gl, ge = _inputs(4)
    h, w, b, labels, gl, ge = h[:19], w[:150], b[:150], labels[:19].clamp(max=149), gl[:19], ge[:19]
    want = _reference(h, w, b, labels, 5.0, 0.8, gl, ge)
    with NoHostSync():
        got = _op(h, w, b, labels, gl, ge, softcap=5.0, temperature=0.8, backend=backend)
    for g, r in zip(got, want):
        assert (g.double() - r).abs().max() <= 1e-5 * max(r.abs().max().item(), 1.0)
    if backend == "torch":
        return
    calls = _spy(monkeypatch, KF, "stats_tiles", RuntimeError("simulated capped forward failure"))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        again = _op(h, w, b, labels, gl, ge, softcap=5.0, temperature=0.8, backend=backend)
    warned = [str(x.message) for x in seen if issubclass(x.category, dispatch.KernelFallbackWarning)]
    dispatch.reset()
    assert len(calls) == 1 and len(warned) == 1 and "simulated capped forward failure" in warned[0], warned
    for g, r in zip(again, want):
        assert (g.double() - r).abs().max() <= 1e-5 * max(r.abs().max().item(), 1.0)


@pytest.mark.gpu
@pytest.mark.filterwarnings("error::pacs_fast.kernels.dispatch.KernelFallbackWarning")  # (the capped kernels ran)
@pytest.mark.parametrize("backward", ["chunked", "atomic"])
def test_the_capped_kernels_on_the_gpu_equal_the_float64_reference(backward):
    """On a GPU (bf16, the launches a Gemma 2 run gets: capped_config's 64-wide vocabulary blocks), a Gemma 2-sized
    cap over many tiles: values within the fp32 bounds above; gradients within the bf16 ones (dz rounded to bf16
    before the backward's GEMMs: 2^-8 of sum_j |dz_ij| |W_j| more), as under the interpreter."""
    g = torch.Generator().manual_seed(5)
    n, hd, v, cap = 300, 256, 5000, 30.0
    h = (torch.randn(n, hd, generator=g) * 4).to("cuda", torch.bfloat16)
    w = (torch.randn(v, hd, generator=g) / hd ** 0.5).to("cuda", torch.bfloat16)
    labels = torch.randint(0, v, (n,), generator=g).cuda()
    gl, ge = torch.randn(n, generator=g, dtype=torch.float64).cuda(), torch.randn(n, generator=g).double().cuda()
    want = _reference(h, w, None, labels, cap, 0.9, gl, ge)
    got = _op(h, w, None, labels, gl, ge, softcap=cap, temperature=0.9, backend="triton", triton_backward=backward)
    z = (h.double() @ w.double().T).requires_grad_()
    lp = torch.log_softmax(cap * torch.tanh(z / cap) / 0.9, -1)
    dz = torch.autograd.grad((lp.gather(1, labels[:, None])[:, 0] * gl - (lp.exp() * lp).sum(-1) * ge).sum(), z)[0]
    extra = {"dhidden": (dz.abs() @ w.double().abs()).max(), "dweight": (dz.abs().T @ h.double().abs()).max()}
    for name, x, r in zip(("logp", "entropy", "dhidden", "dweight"), got, want):
        bound = (2e-6 if name in ("logp", "entropy") else 2 ** -8) * max(r.abs().max().item(), 1.0)
        bound += 2 ** -8 * float(extra.get(name, 0.0))
        assert (x.double() - r).abs().max().item() <= bound, (backward, name)


def test_the_capped_op_compiles_whole():
    """Under ``torch.compile(fullgraph=True)`` the tile loops run as the op's custom ops, which take the cap: values
    and gradients equal eager's exactly (the same ops in the same order)."""
    h, w, b, labels, gl, ge = _inputs(2, 3.0)
    eager = _op(h, w, b, labels, gl, ge, softcap=5.0, temperature=0.7, chunk_bytes=(8, 128), backend="torch")

    def loss(h, w, b):
        logp, ent = linear_logprobs(h, w, labels, bias=b, softcap=5.0, temperature=0.7, chunk_bytes=(8, 128),
                                    backend="torch", return_entropy=True)
        return (logp.double() * gl + ent.double() * ge).sum(), logp, ent
    try:
        x = [t.clone().requires_grad_() for t in (h, w, b)]
        val, logp, ent = torch.compile(loss, fullgraph=True, backend="aot_eager")(*x)
        val.backward()
    finally:
        torch._dynamo.reset()
    assert all(torch.equal(a, c) for a, c in zip(eager, [logp, ent] + [t.grad for t in x]))


def _tp_worker(rank, init_file, out):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    h, w, b, labels, gl, ge = _inputs(5, 30.0)
    shard = slice(0, 420) if rank == 0 else slice(420, V)  # unequal shards
    hh, ww, bb = h.clone().requires_grad_(), w[shard].clone().requires_grad_(), b[shard].clone().requires_grad_()
    logp, ent = linear_logprobs(hh, ww, labels, bias=bb, temperature=0.7, softcap=5.0, return_entropy=True,
                                tp_group=dist.group.WORLD, chunk_bytes=(8, 128))
    (logp.double() * gl + ent.double() * ge).sum().backward()
    torch.save([logp, ent, hh.grad, ww.grad, bb.grad], f"{out}/{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.distributed
def test_vocab_parallel_two_ranks_equal_the_unsharded_reference(tmp_path):
    mp.spawn(_tp_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    h, w, b, labels, gl, ge = _inputs(5, 30.0)
    want = _reference(h, w, b, labels, 5.0, 0.7, gl, ge)
    r0, r1 = (torch.load(tmp_path / f"{r}.pt") for r in (0, 1))
    got = r0[:3] + [torch.cat([r0[3], r1[3]]), torch.cat([r0[4], r1[4]])]
    assert all(torch.equal(x, y) for x, y in zip(r0[:3], r1[:3]))  # every rank: the same values and dhidden
    for name, g, r in zip(("logp", "entropy", "dhidden", "dweight", "dbias"), got, want):
        bound = (2e-6 if name in ("logp", "entropy") else 1e-5) * max(r.abs().max().item(), 1.0)
        assert (g.double() - r).abs().max().item() <= bound, name


# ------------------------------------------------------------------------------------------------ the learner

SMALL = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)


def _model(family):
    import transformers as T

    config, model, extra = {
        "gemma2": (T.Gemma2Config, T.Gemma2ForCausalLM, dict(head_dim=16, final_logit_softcapping=5.0)),
        "cohere": (T.CohereConfig, T.CohereForCausalLM, dict(logit_scale=0.25)),
        "granite": (T.GraniteConfig, T.GraniteForCausalLM, dict(logits_scaling=4.0)),
        # (MiniCPM3's logits_scaling, hidden_size / dim_model_base = 4, is a property: not in to_dict())
        "minicpm3": (T.MiniCPM3Config, T.MiniCPM3ForCausalLM, dict(num_key_value_heads=4, dim_model_base=16,
                                                                   q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16,
                                                                   qk_rope_head_dim=8, v_head_dim=16))}[family]
    torch.manual_seed(0)
    m = model(config(**{**SMALL, **extra}, attn_implementation="eager")).float()
    with torch.no_grad():  # weights large enough that the cap / the scale change the log-probs a lot
        for p in m.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.2)
    return m.eval()


@pytest.mark.parametrize("family", ["gemma2", "cohere", "granite", "minicpm3"])
def test_the_learners_log_probs_are_the_models_own(family):
    """(Refused before: ``TorchLearner`` raised a ValueError naming the config key. MiniCPM3's scale, a config
    property, was missed: the learner trained on the head's own log-probs, 3 nats per token off in a run.)"""
    model = _model(family)
    batch = uneven_batch(torch.Generator().manual_seed(0), 2, 2, 300, [20, 9, 16, 24])
    learner = TorchLearner(model, algo=AlgoConfig(), learner=LearnerConfig(packing="off", shared_prefix=False))
    m = batch.response_mask[:, 1:] > 0
    for T in (1.0, 0.7):
        learner.temperature = T  # (as trainer/step.py swaps in 1 for its temperature-1 passes)
        got = learner.compute_logprobs(batch)[:, 1:]
        worst, plain = 0.0, 0.0
        with torch.no_grad():
            for i in range(batch.num_rows):
                n = int(batch.attention_mask[i].sum())
                ids = batch.input_ids[i:i + 1, :n]
                logits = model(ids).logits[0, :-1].double()
                want = (logits / T).log_softmax(-1).gather(1, ids[0, 1:, None])[:, 0]
                worst = max(worst, (got[i, :n - 1][m[i, :n - 1]] - want[m[i, :n - 1]]).abs().max().item())
                head = model.lm_head(model.model(ids).last_hidden_state)[0, :-1].double()
                plain = max(plain, ((head / T).log_softmax(-1).gather(1, ids[0, 1:, None])[:, 0]
                                    - want)[m[i, :n - 1]].abs().max().item())
        assert worst <= 1e-5, (family, T, worst)  # fp32 both sides
        assert plain > 0.1, (family, T, plain)  # the head's own log-probs are far from the model's


def test_a_two_step_run_on_gemma2_has_the_engines_log_probs(tmp_path, capsys):
    """``rollout/logprob_diff_mean``: the HF engine's log-probs (the model's capped logits) against the learner's."""
    from pacs_fast.data.tiny import build_char_tokenizer
    from pacs_fast.trainer.metrics import read_jsonl
    from test_run_safety import cli

    tok = build_char_tokenizer()
    import transformers as T
    torch.manual_seed(0)
    vocab = -(-len(tok) // 64) * 64
    config = T.Gemma2Config(**{**SMALL, "vocab_size": vocab}, head_dim=16, final_logit_softcapping=5.0,
                            pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                            eos_token_id=tok.eos_token_id)
    model = T.Gemma2ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 0.5)  # (tied: logits of ~10, which the cap of 5 bends)
    folder = tmp_path / "gemma2"
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    args = ["data.arith_ops=+", "data.arith_max_digits=1", "data.eval_size=4", "rollout.n=4", "rollout.eval_n=1",
            "rollout.max_new_tokens=6", "train.prompts_per_step=2", "learner.mini_batch_prompts=2",
            "learner.micro_batch_prompts=2", "train.progress=false", "train.steps=2", "rollout.engine=hf",
            "rollout.temperature=0.7", f"model.path={folder}", f"train.out_dir={tmp_path}", "train.run_name=g"]
    code, out, err = cli(args, capsys)
    assert code == 0, err
    recs = [r for r in read_jsonl(tmp_path / "g" / "metrics.jsonl") if r["kind"] == "train"]
    assert len(recs) == 2 and all(r["rollout/logprob_diff_mean"] < 1e-4 for r in recs), recs
    assert json.loads((folder / "config.json").read_text())["final_logit_softcapping"] == 5.0


def test_minicpm3s_scale_a_config_property_is_read():
    """MiniCPM3's ``logits_scaling`` (``hidden_size / dim_model_base``, 10 for MiniCPM3-4B) is a property of its config
    class: neither ``to_dict()`` nor its config.json has it, so ``logits_transform`` said None and the learner
    trained on the head's own log-probs (the engines divide the hidden states by it)."""
    import transformers as T

    from pacs_fast.causal_lm import logits_map, logits_transform

    config = T.MiniCPM3Config(hidden_size=2560, dim_model_base=256, num_attention_heads=40, num_key_value_heads=40)
    assert logits_transform(config) == "logits_scaling=10.0" and logits_map(config) == (None, 0.1)
    assert logits_map(config.to_dict()) == (None, 0.1)  # (a config.json's dict: derived from dim_model_base)
    plain = T.MiniCPM3Config(hidden_size=256, dim_model_base=256, num_attention_heads=4, num_key_value_heads=4)
    assert logits_transform(plain) is None and logits_map(plain.to_dict()) == (None, 1.0)
