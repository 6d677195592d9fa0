"""Vocab parallelism: 2 processes on gloo (CPU), each holding a contiguous vocab shard of unequal
size, give the single-process values and gradients (both ops, torch backend and the Triton
kernels under the interpreter)."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pacs_fast.ops import vocab_parallel as vp

pytestmark = [pytest.mark.distributed,
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

N, H, V, SPLIT = 13, 24, 101, 55  # rank 0 holds ids [0, 55), rank 1 [55, 101)
BACKENDS = ("torch", "triton")


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=g)
    weight = torch.randn(V, H, generator=g) * 0.5
    bias = torch.randn(V, generator=g)
    labels = torch.randint(0, V, (N,), generator=g)
    labels[3] = -100
    labels[4] = 60    # on rank 1
    labels[5] = 2     # on rank 0
    gl, gh = torch.randn(N, generator=g), torch.randn(N, generator=g)
    logits = torch.randn(N, V, generator=g) * 3
    return hidden, weight, bias, labels, gl, gh, logits


def _small_blocks(setitem=None):
    """Small launch blocks; ``setitem`` (the test's ``monkeypatch.setitem``) undoes them after the test,
    the spawned ranks set them for good."""
    from pacs_fast.kernels import linear_logprobs as KL, token_logprobs as KT
    setitem = setitem or (lambda d, k, v: d.__setitem__(k, v))
    for k, v in dict(BLOCK_V=16, BLOCK_V_BWD=16, SPLITS=2, num_warps=1).items():
        setitem(KT.CONFIG, k, v)
    for k, v in dict(BLOCK_N=16, BLOCK_V=16, BLOCK_H=16, SPLITS=2, num_warps=1, num_stages=1).items():
        setitem(KL.CONFIG, k, v)


def _run(hidden, weight, bias, labels, gl, gh, logits, backend, group=None):
    """Both ops, forward + backward; returns values and gradients."""
    from pacs_fast.ops.linear_logprobs import linear_logprobs
    from pacs_fast.ops.token_logprobs import token_logprobs
    out = {}
    x = logits.clone().requires_grad_()
    lp, en = token_logprobs(x, labels, temperature=0.9, return_entropy=True, tp_group=group, backend=backend)
    (lp * gl + en * gh).sum().backward()
    out.update(tok_logp=lp.detach(), tok_ent=en.detach(), tok_grad=x.grad)
    h, w, b = (t.clone().requires_grad_() for t in (hidden, weight, bias))
    lp, en = linear_logprobs(h, w, labels, bias=b, temperature=1.1, return_entropy=True, tp_group=group,
                             backend=backend)
    (lp * gl + en * gh).sum().backward()
    out.update(lin_logp=lp.detach(), lin_ent=en.detach(), dh=h.grad, dw=w.grad, db=b.grad)
    return out


def _worker(rank, world, init_file, seed, result_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    _small_blocks()
    hidden, weight, bias, labels, gl, gh, logits = _inputs(seed)
    sl = slice(0, SPLIT) if rank == 0 else slice(SPLIT, V)
    assert vp.shard_offset(sl.stop - sl.start, dist.group.WORLD) == (sl.start, V)
    res = {be: _run(hidden, weight[sl], bias[sl], labels, gl, gh, logits[:, sl].contiguous(), be,
                    group=dist.group.WORLD) for be in BACKENDS}
    torch.save(res, os.path.join(result_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_two_ranks_equal_single_process(seed, tmp_path, monkeypatch):
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), seed, str(tmp_path)), nprocs=2, join=True)
    _small_blocks(monkeypatch.setitem)
    hidden, weight, bias, labels, gl, gh, logits = _inputs(seed)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for be in BACKENDS:
        full = _run(hidden, weight, bias, labels, gl, gh, logits, be)
        for r, sl in enumerate((slice(0, SPLIT), slice(SPLIT, V))):
            got = ranks[r][be]
            for k in ("tok_logp", "tok_ent", "lin_logp", "lin_ent", "dh"):  # replicated
                torch.testing.assert_close(got[k], full[k], rtol=1e-5, atol=1e-5, msg=f"{be} {k} rank {r}")
            for k, ref in (("tok_grad", full["tok_grad"][:, sl]), ("dw", full["dw"][sl]), ("db", full["db"][sl])):
                torch.testing.assert_close(got[k], ref, rtol=1e-5, atol=1e-6, msg=f"{be} {k} rank {r}")
        assert (full["tok_logp"][3] == 0) and (full["dh"][3] == 0).all()


def test_merge_is_exact_and_handles_empty_partials(seed):
    """Splitting a row anywhere and merging the partial statistics gives the full-row ones,
    also when one part is entirely -inf (an empty shard for that row)."""
    x = torch.randn(5, 40, dtype=torch.float64) * 5
    x[2, :17] = float("-inf")

    def stats(t):
        m = t.amax(1)
        ref = torch.where(m == float("-inf"), torch.zeros_like(m), m)
        e = torch.exp(t - ref[:, None])
        a = torch.where(e > 0, e * (t - ref[:, None]), torch.zeros_like(e)).sum(1)
        return m, e.sum(1), a

    full = stats(x)
    m, s, a = vp.merge(*stats(x[:, :17]), *stats(x[:, 17:]))
    torch.testing.assert_close(m, full[0])
    torch.testing.assert_close(s, full[1])
    torch.testing.assert_close(a, full[2])
    mm, ss, aa = vp.merge_splits(*(torch.stack(t) for t in zip(stats(x[:, :9]), stats(x[:, 9:30]), stats(x[:, 30:]))))
    torch.testing.assert_close(ss * torch.exp(mm - full[0]), full[1])
    lse, _, ent = vp.finalize(mm, ss, aa, torch.zeros(5, dtype=torch.float64), torch.ones(5, dtype=torch.bool))
    torch.testing.assert_close(lse, torch.logsumexp(x, 1))
    p = torch.softmax(x, 1)
    torch.testing.assert_close(ent, -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(1))


def test_the_shard_offsets_are_cached_without_keeping_the_group_alive(tmp_path):
    """shard_offset all-gathers once per (group, shard size), and its cache holds the group weakly: a
    destroyed group is freed then, not at interpreter exit (a gloo group torn down at exit can abort the
    process: one xdist run's spawned rank died with SIGABRT, "terminate called without an active
    exception", while the cache held its group). In a subprocess: the process group is global state."""
    import subprocess
    import sys
    code = f"""
import gc, weakref, torch.distributed as dist
from pacs_fast.ops import vocab_parallel as vp
dist.init_process_group("gloo", init_method="file://{tmp_path / 'init'}", rank=0, world_size=1)
calls = []
real = dist.all_gather
dist.all_gather = lambda *a, **k: calls.append(1) or real(*a, **k)
group = dist.new_group([0])
assert vp.shard_offset(10, group) == (0, 10) and vp.shard_offset(10, group) == (0, 10) and len(calls) == 1
assert vp.shard_offset(12, group) == (0, 12) and len(calls) == 2
ref = weakref.ref(group)
dist.destroy_process_group(group)
del group
gc.collect()
assert ref() is None, "the cache keeps a destroyed group alive"
dist.destroy_process_group()
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
