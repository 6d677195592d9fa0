"""Learner metrics truth sweep: every ``learner/*`` and ``correction/*`` value a run logs, recomputed independently.

Short runs of the built-in tiny model train in this process with the rollout engine's ``generate`` recorded (as
tests/test_metrics_truth_sweep.py, whose ``score`` reward gives groups of every kind) and every optimiser step
observed through torch's global step pre-hook: the weights it starts from and the (clipped) gradients it applies.
From the recorded completions, the documented formulas (/work/shared/DESIGN.md, the docstrings of
pacs_fast/algorithms/*.py) written out here again, and a plain float64 transformers forward of those weights, each
test recomputes each mini-batch's loss, gradient and metrics, and checks what the run logged:

- ``learner/loss``: the mean over the step's optimiser steps (epochs x mini-batches) of each mini-batch's whole
  objective (PACS's BCE; a baseline's surrogate + kl_coef x KL - entropy_coef x entropy; PPO's + vf_coef x value
  loss), as :meth:`Learner.update` documents ("averaged over the mini-batches");
- ``learner/grad_norm``: the mean over the optimiser steps of the total gradient norm before clipping (the
  gradient each step applied is the float64 one clipped to learner.grad_norm: checked too), every AdamW step
  recomputed from those gradients gives the next step's weights and the checkpoints;
- the means over the mini-batches of ``pg_loss``, ``clip_frac`` (``_high``, ``_low``), ``dual_clip_frac``,
  ``ppo_kl``, ``approx_kl``, ``kl``, ``adv_mean`` / ``adv_abs_mean``, ``vf_loss``, ``vf_clip_frac``,
  ``seq_ratio_mean`` (each a mean over the mini-batch's tokens / rows / sequences);
- ``correction/*`` from the engine's (perturbed) log-probs and the float64 proximal ones;
- ``entropy_threshold`` / ``entropy_kept_frac`` (algo.entropy_top_frac), ``split_groups`` (a token budget under one
  group: the mean over the optimiser steps of the groups trained by rows), learner.mask_truncated, a rollout
  temperature of 0.7;
- the same metrics with micro-batches of 1 or 2 groups, packed or not, groups split; the megatron learner's record of
  the same steps.

Found: no learner bug; every value above holds to 1e-5 relative (float32 learner against float64).
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from test_metrics_truth_sweep import G, P, TINY, recorded_generate, true_reward

pytestmark = pytest.mark.timeout(300)

BASE = TINY + ["train.steps=2", "train.eval_every=0", "data.arith_train_size=12", "data.eval_size=4",
               "rollout.eval_n=1", "reward.fn=test_metrics_truth_sweep:score"]
EPS_GRPO = 1e-6


# ------------------------------------------------------------------------------------------- running, traced

def perturb(k: int, tok: int) -> float:
    """A deterministic offset of the engine's log-prob of token ``tok`` at response position ``k``: the engine's
    log-probs then differ from the learner's (ratios from e^-0.9 to e^0.9), as a stale or other-numerics engine's."""
    return 0.9 * math.sin(1.7 * k + 0.37 * tok + 0.5)


class Traced:
    """A run: its config and folder, every ``generate`` call ``(prompts, params, completions)``, and every optimiser
    step of the learner's optimiser ``{"params": [...], "grads": [...], "lrs": [...]}`` (before the step)."""

    def __init__(self, cfg, run: Path, calls: list, steps: list):
        self.cfg, self.run, self.calls, self.opt_steps = cfg, run, calls, steps

    def records(self):
        from pacs_fast.trainer.metrics import read_jsonl
        return [r for r in read_jsonl(self.run / "metrics.jsonl") if r["kind"] == "train"]

    def train_calls(self):
        return [c for c in self.calls if c[1].return_logprobs]


def run_traced(tmp: Path, overrides, *, perturbed: bool = False) -> Traced:
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from pacs_fast.config import load_config
    from pacs_fast.trainer import train

    seen = []

    def perturb_logprobs(params, out):
        if not (perturbed and params.return_logprobs):
            return out
        return [[dataclasses.replace(c, logprobs=[lp + perturb(k, t) for k, (lp, t) in
                                                  enumerate(zip(c.logprobs, c.token_ids))]) for c in cs]
                for cs in out]

    def pre_step(opt, args, kwargs):
        seen.append({"opt": opt, "params": [p.detach().clone() for g in opt.param_groups for p in g["params"]],
                     "grads": [None if p.grad is None else p.grad.detach().clone()
                               for g in opt.param_groups for p in g["params"]],
                     "lrs": [g["lr"] for g in opt.param_groups],
                     "sizes": [len(g["params"]) for g in opt.param_groups]})

    handle = register_optimizer_step_pre_hook(pre_step)
    try:
        with recorded_generate(perturb_logprobs) as calls:
            cfg = load_config(None, list(overrides))
            train(cfg, tmp / "run")
    finally:
        handle.remove()
    last = seen[-1]["opt"] if seen else None  # the learner's (a warm-up's optimiser steps come first)
    steps = [s for s in seen if s["opt"] is last]
    for s in steps:
        del s["opt"]
    return Traced(cfg, tmp / "run", calls, steps)


#: the runs (overrides on BASE, and whether the engine's log-probs are perturbed), each trained once per module
CASES = {
    # PACS, 2 mini-batches x 2 epochs a step (4 optimiser steps), micro-batches of 1 group
    "pacs": (["learner.epochs=2"], False),
    "pacs_micro2": (["learner.epochs=2", "learner.micro_batch_prompts=2"], False),
    "pacs_packed": (["learner.epochs=2", "learner.packing=on", "learner.shared_prefix=false"], False),
    # GRPO with a k3 KL penalty to the initial policy (a held reference model), an entropy bonus, a narrow clip
    # range and the dual clip (so that every clip counter counts), 2 epochs, a higher rate
    "grpo_kl": (["algo.name=grpo", "algo.kl_coef=0.5", "algo.entropy_coef=0.01", "algo.clip_low=0.05",
                 "algo.clip_high=0.08", "algo.clip_c=1.1", "learner.epochs=2", "learner.lr=1e-2"], False),
    # PPO: GAE on a value head (a critic rate and value clip at which the clip acts), 2 epochs
    "ppo": (["algo.name=ppo", "learner.epochs=2", "learner.critic_lr=0.05", "algo.value_clip=0.05"], False),
    "dr_grpo": (["algo.name=dr_grpo"], False),
    "gspo": (["algo.name=gspo", "learner.epochs=2"], False),
    "cispo": (["algo.name=cispo"], False),
    # the policy gradient on the top half of each micro-batch's tokens by entropy
    "grpo_top_entropy": (["algo.name=grpo", "algo.entropy_top_frac=0.5", "learner.epochs=2"], False),
    # a token budget under one group: every group trains a few rows at a time
    "pacs_split": (["learner.epochs=2", "learner.max_tokens_per_micro_batch=20"], False),
    "grpo_split": (["algo.name=grpo", "learner.max_tokens_per_micro_batch=20", "algo.kl_coef=0.1"], False),
    # off-policy correction against an engine whose log-probs are off by up to 0.9
    "corr_grpo": (["algo.name=grpo", "correction.is_level=token", "correction.is_cap=1.5",
                   "correction.rs_level=token", "learner.epochs=2"], True),
    "corr_pacs": (["correction.is_level=sequence", "correction.is_cap=1.5", "learner.epochs=2"], True),
    # responses cut at rollout.max_new_tokens out of the loss (PACS: out of their groups)
    "pacs_mask_truncated": (["learner.mask_truncated=true", "learner.epochs=2"], False),
    "grpo_mask_truncated": (["algo.name=grpo", "learner.mask_truncated=true", "learner.epochs=2"], False),
    # log-probs, entropies, KL at the rollout temperature
    "grpo_temperature": (["algo.name=grpo", "rollout.temperature=0.7", "algo.kl_coef=0.2", "algo.entropy_coef=0.01",
                          "learner.epochs=2"], False),
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("warm")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cache):
    """``runs(name)`` (``runs(name, megatron=True)``: with learner.backend=megatron): the case's run, trained on first
    use."""
    done = {}

    def get(name, megatron=False):
        if (name, megatron) not in done:
            extra, perturbed = CASES[name]
            extra = extra + (["learner.backend=megatron"] if megatron else [])
            done[name, megatron] = run_traced(tmp_path_factory.mktemp(name + "_mega" * megatron),
                                              BASE + [f"warmup.cache_dir={cache}"] + extra, perturbed=perturbed)
        return done[name, megatron]
    return get


# ------------------------------------------------------------------------------------------- the float64 reference

class Ref:
    """A float64 transformers copy of the run's model, loaded with any observed weights."""

    def __init__(self, traced: Traced, cache: Path):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from pacs_fast.trainer.warmup import warmup_key

        folder = Path(cache) / "warmup" / warmup_key(traced.cfg)
        self.initial = folder
        self.tok = AutoTokenizer.from_pretrained(folder)
        self.vocab = len(self.tok)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
        self.named = list(self.model.named_parameters())
        self.initial_params = [p.detach().clone() for _, p in self.named]
        self.traced = traced
        self.H = self.model.config.hidden_size

    def load(self, params):
        """Policy weights (the optimiser's first group, in ``model.parameters()`` order) into the model; returns the
        value head's ``(w, b)`` float64 leaves (PPO's second group) or None."""
        assert len(params) >= len(self.named)
        with torch.no_grad():
            for (name, p), q in zip(self.named, params):
                assert p.shape == q.shape, name
                p.copy_(q.double())
        rest = params[len(self.named):]
        if not rest:
            return None
        w, b = (t.detach().double().clone().requires_grad_(True) for t in rest)
        return w, b

    def rows(self, prompts, comps, groups, *, values=None, grad=True):
        """Per row of ``groups`` (prompt-major, G rows a group): dict of float64 1-D tensors over its response
        tokens: ``lp`` (log-probs of the sampled tokens), ``ent`` (entropy), ``v`` (value head on the hidden state
        that predicts the token, PPO)."""
        out = []
        ctx = torch.enable_grad() if grad else torch.no_grad()
        with ctx:
            for g in groups:
                for c in comps[g]:
                    p = prompts[g]
                    ids = torch.tensor([list(p) + list(c.token_ids)])
                    o = self.model(ids, output_hidden_states=True)
                    logits = o.logits[0, len(p) - 1:-1, :self.vocab] / self.traced.cfg.rollout.temperature
                    logq = torch.log_softmax(logits, -1)
                    row = {"lp": logq.gather(1, torch.tensor(c.token_ids)[:, None])[:, 0],
                           "ent": -(logq.exp() * logq).sum(-1)}
                    if values is not None:
                        h = o.hidden_states[-1][0, len(p) - 1:-1]
                        row["v"] = (h @ values[0].T)[:, 0] + values[1]
                    out.append(row)
        return out

    def grads(self, values):
        """The gradients of the policy's parameters (0 where none reached them) and the value head's."""
        gs = [torch.zeros_like(p) if p.grad is None else p.grad for _, p in self.named]
        return gs + ([v.grad for v in values] if values is not None else [])

    def zero(self, values):
        for _, p in self.named:
            p.grad = None
        if values is not None:
            for v in values:
                v.grad = None


def step_seed(cfg, step: int) -> int:
    """The documented seed of a step's update (``Learner.update(seed=)`` orders the mini-batches with it)."""
    return (cfg.train.seed * 1_000_003 + step) % 2**62


def soft_question_weights(R: torch.Tensor) -> torch.Tensor:
    """DESIGN.md / class_balanced_weights' docstring: w_i = R_i G/(2 n1) + (1 - R_i) G/(2 n0) where 0 < n1 < G."""
    g = R.view(-1, G)
    n1 = g.sum(1, keepdim=True)
    n0 = G - n1
    both = (n1 > 0) & (n1 < G)
    w = torch.where(both, g * G / (2 * n1.clamp(min=1e-300)) + (1 - g) * G / (2 * n0.clamp(min=1e-300)),
                    torch.ones_like(g))
    return w.reshape(-1)


def group_adv(R: torch.Tensor, mode: str) -> torch.Tensor:
    g = R.view(-1, G)
    c = g - g.mean(1, keepdim=True)
    if mode == "grpo":
        return (c / (g.std(1, keepdim=True, unbiased=True) + EPS_GRPO)).reshape(-1)
    if mode == "rloo":
        return (c * G / (G - 1)).reshape(-1)
    return c.reshape(-1)


def tmean(xs, mask_list=None):
    """Token mean of a list of per-row 1-D tensors (over the tokens where ``mask`` is set)."""
    if mask_list is None:
        return torch.cat(xs).sum() / sum(len(x) for x in xs)
    num = sum((x * m).sum() for x, m in zip(xs, mask_list))
    return num / sum(m.sum() for m in mask_list)


def k3(d):
    return torch.exp(d) - 1 - d


def minibatch_objective(cfg, rows, old, ref, R, adv_tok=None, returns=None, old_v=None, is_w=None, kept=None,
                        seq_w=None, trunc=None):
    """``(loss, metrics)`` of one mini-batch (whole groups, rows in group order), written from the docstrings.

    rows: this mini-batch's forward (``lp``, ``ent``, ``v``); old / ref: per-row float64 log-probs; R: rewards;
    adv_tok: PPO's per-token advantages; is_w / kept: the correction's per-token weights and kept mask; seq_w: PACS's
    sequence weights; trunc: the rows learner.mask_truncated takes out of the loss."""
    a = cfg.algo
    lp = [r["lp"] for r in rows]
    n = len(rows)
    masks = kept if kept is not None else [torch.ones_like(x) for x in lp]
    trunc = [False] * n if trunc is None else trunc
    masks = [mk * (not t) for mk, t in zip(masks, trunc)]
    if a.name == "pacs":  # each group over the members left (>= 2 for the RLOO score), the mean over those rows
        proxy = torch.stack([a.beta * (x - o).sum() for x, o in zip(lp, ref)])
        total, count = torch.cat(lp).sum() * 0.0, 0  # (no group left: a 0 connected to the graph)
        for g0 in range(0, n, G):
            mem = [i for i in range(g0, g0 + G) if not trunc[i]]
            k = len(mem)
            if k < 2:
                continue
            pr, Rm = proxy[mem], R[mem]
            psi = pr - (pr.sum() - pr) / (k - 1)
            n1 = float(Rm.sum())
            w = Rm * k / (2 * n1) + (1 - Rm) * k / (2 * (k - n1)) if 0 < n1 < k else torch.ones_like(Rm)
            if seq_w is not None:
                w = w * seq_w[mem]
            total = total + (w * (F.softplus(psi) - Rm * psi)).sum()
            count += k
        return total / max(count, 1), {}
    mode = {"grpo": "grpo", "dr_grpo": "dr_grpo", "rloo": "rloo", "gspo": "grpo", "cispo": "grpo"}.get(a.name)
    m = {}
    if a.name == "ppo":
        advs = adv_tok
        rows_adv = torch.stack([x.mean() for x in advs])
    else:
        A = group_adv(R, mode)
        advs = [A[i].expand_as(lp[i]) for i in range(n)]
        rows_adv = A
    m["adv_mean"], m["adv_abs_mean"] = rows_adv.mean(), rows_adv.abs().mean()
    lr = [x - o for x, o in zip(lp, old)]
    H = float(cfg.rollout.max_new_tokens)

    def agg(per_tok, mode_):
        if mode_ == "token-mean":
            return tmean(per_tok, masks)
        seqs = [(t * mk).sum() for t, mk in zip(per_tok, masks) if mk.sum() > 0]
        if mode_ == "seq-mean-token-mean":
            seqs = [(t * mk).sum() / mk.sum() for t, mk in zip(per_tok, masks) if mk.sum() > 0]
        out = sum(seqs) / len(seqs)
        return out / H if mode_ == "seq-mean-token-sum-norm" else out

    agg_mode = {"dr_grpo": "seq-mean-token-sum-norm", "gspo": "seq-mean-token-mean"}.get(a.name, "token-mean")
    if a.loss_agg != "auto":
        agg_mode = a.loss_agg
    with torch.no_grad():
        m["ppo_kl"] = tmean([-x.detach() for x in lr], masks)
        m["approx_kl"] = tmean([k3(x.detach()) for x in lr], masks)
    if a.name == "gspo":
        lo, hi = a.clip_low, a.clip_high
        per, cf, cfh, cfl, sr = [], [], [], [], []
        for x, xr, A_, mk in zip(lp, lr, advs, masks):
            seq_lr = (xr.detach() * mk).sum() / mk.sum().clamp(min=1)
            s = torch.exp((x - x.detach() + seq_lr).clamp(max=10.0))
            un, cl = -A_ * s, -A_ * s.clamp(1 - lo, 1 + hi)
            per.append(torch.maximum(un, cl))
            cf.append((cl > un).double()), cfh.append(((s > 1 + hi) & (A_ > 0)).double())
            cfl.append(((s < 1 - lo) & (A_ < 0)).double())
            if mk.sum() > 0:
                sr.append(torch.exp(seq_lr.clamp(max=10.0)))
        m["seq_ratio_mean"] = torch.stack(sr).mean()
    elif a.name == "cispo":
        lo, hi = a.clip_low, a.clip_high
        per, cf, cfh, cfl = [], [], [], []
        for x, xr, A_ in zip(lp, lr, advs):
            r = torch.exp(xr.detach())
            wgt = r.clamp(1 - lo, 1 + hi)
            per.append(-wgt * A_ * x)
            cf.append((r != wgt).double()), cfh.append((r > 1 + hi).double()), cfl.append((r < 1 - lo).double())
    else:  # the PPO clipped surrogate with the dual clip
        lo, hi, c = a.clip_low, a.clip_high, a.clip_c
        per, cf, cfh, cfl, dual = [], [], [], [], []
        for xr, A_ in zip(lr, advs):
            r = torch.exp(xr)
            un, cl = -A_ * r, -A_ * r.clamp(1 - lo, 1 + hi)
            t = torch.maximum(un, cl)
            cf.append((cl > un).double()), cfh.append(((r > 1 + hi) & (A_ > 0)).double())
            cfl.append(((r < 1 - lo) & (A_ < 0)).double())
            dual.append(((t > -A_ * c) & (A_ < 0)).double())
            per.append(torch.where(A_ < 0, torch.minimum(t, -A_ * c), t))
        m["dual_clip_frac"] = tmean(dual, masks)
    m["clip_frac"], m["clip_frac_high"], m["clip_frac_low"] = tmean(cf, masks), tmean(cfh, masks), tmean(cfl, masks)
    if is_w is not None:
        per = [t * w for t, w in zip(per, is_w)]
    if a.entropy_top_frac < 1:  # each micro-batch's (here: group's) top tokens by entropy, ties with the lowest kept
        assert cfg.learner.micro_batch_prompts == 1
        total = sum(float(mk.sum()) for mk in masks)
        thr_w = kept_n = 0.0
        for g0 in range(0, n, G):
            ents = torch.cat([rows[i]["ent"].detach()[masks[i] > 0] for i in range(g0, g0 + G)])
            k = min(len(ents), max(1, math.ceil(a.entropy_top_frac * len(ents) - 1e-9)))
            thr = torch.sort(ents, descending=True).values[k - 1]
            for i in range(g0, g0 + G):
                keep = ((rows[i]["ent"].detach() >= thr) & (masks[i] > 0)).double()
                per[i] = per[i] * keep
                kept_n += float(keep.sum())
            thr_w += float(thr) * len(ents) / total
        m["entropy_threshold"], m["entropy_kept_frac"] = torch.tensor(thr_w), torch.tensor(kept_n / total)
    loss = agg(per, agg_mode)
    m["pg_loss"] = loss.detach()
    if a.kl_coef:
        kl = agg([k3(r_ - x) for x, r_ in zip(lp, ref)], agg_mode)
        m["kl"] = kl.detach()
        loss = loss + a.kl_coef * kl
    if a.name == "ppo":
        v = [r["v"] for r in rows]
        c = a.value_clip
        per_v, vcf = [], []
        for vv, ov, ret in zip(v, old_v, returns):
            un = (vv - ret) ** 2
            cl = (torch.minimum(torch.maximum(vv, ov - c), ov + c) - ret) ** 2
            per_v.append(torch.maximum(un, cl)), vcf.append((cl > un).double())
        vf = 0.5 * agg(per_v, agg_mode)
        m["vf_loss"], m["vf_clip_frac"] = vf.detach(), tmean(vcf, masks)
        loss = loss + a.vf_coef * vf
    if a.entropy_coef:
        loss = loss - a.entropy_coef * agg([r["ent"] for r in rows], agg_mode)
    return loss, m


def gae_whitened(R, lens, old_v, gamma, lam):
    """GAE per row (the outcome reward on the last response token, value 0 after it), returns before whitening,
    advantages whitened over the step's response tokens (unbiased variance, eps 1e-8)."""
    advs, rets = [], []
    for r, n, v in zip(R, lens, old_v):
        a = torch.zeros(n, dtype=torch.float64)
        nxt_v, nxt_a = 0.0, 0.0
        for t in reversed(range(n)):
            rew = float(r) if t == n - 1 else 0.0
            delta = rew + gamma * nxt_v - v[t]
            a[t] = delta + gamma * lam * nxt_a
            nxt_v, nxt_a = v[t], a[t]
        advs.append(a), rets.append(a + v)
    flat = torch.cat(advs)
    mean, var = flat.mean(), flat.var(unbiased=True)
    return [(a - mean) / torch.sqrt(var + 1e-8) for a in advs], rets


def recompute(traced: Traced, ref: Ref, step: int, *, correction=None):
    """The float64 truth of a step: ``(mean loss, mean grad norm, mean metrics, per-optimiser-step list of
    (norm, grads))``; also checks each observed (clipped) gradient against the float64 one."""
    cfg, a, lc = traced.cfg, traced.cfg.algo, traced.cfg.learner
    prompts, _, comps = traced.train_calls()[step - 1]
    answers = []
    for p in prompts:
        x, y = ref.tok.decode(p).rstrip("=").split("+")
        answers.append(str(int(x) + int(y)))
    R = torch.tensor([true_reward(answers[g], c.text) for g in range(P) for c in comps[g]], dtype=torch.float64)
    mini = lc.mini_batch_prompts
    n_opt = lc.epochs * (P // mini)
    snaps = traced.opt_steps[(step - 1) * n_opt: step * n_opt]
    assert len(snaps) == n_opt
    vh = ref.load(snaps[0]["params"])
    start = ref.rows(prompts, comps, range(P), values=vh, grad=False)  # the policy before the step
    old = [r["lp"] for r in start]
    refs = old
    if a.name != "pacs" and a.kl_coef:  # the KL reference: the initial policy (no reset)
        ref.load([p for p in ref.initial_params])
        refs = [r["lp"] for r in ref.rows(prompts, comps, range(P), grad=False)]
    old_v = adv_tok = rets = None
    if a.name == "ppo":
        old_v = [r["v"] for r in start]
        adv_tok, rets = gae_whitened(R, [len(x) for x in old], old_v, a.gamma, a.lam)
    is_w = kept = seq_w = None
    corr = {}
    if correction is not None:
        mu = [torch.tensor(c.logprobs, dtype=torch.float64) for g in range(P) for c in comps[g]]
        is_w, kept, seq_w, corr = correction(old, mu)
    trunc = [c.finish_reason == "length" for g in range(P) for c in comps[g]] if lc.mask_truncated else None
    gen = torch.Generator().manual_seed(step_seed(cfg, step))
    k = 0
    losses, norms, mets = [], [], []
    for _ in range(lc.epochs):
        order = torch.randperm(P, generator=gen)
        for s0 in range(0, P, mini):
            groups = sorted(order[s0:s0 + mini].tolist())
            idx = [g * G + j for g in groups for j in range(G)]
            pick = (lambda xs: None if xs is None else [xs[i] for i in idx])  # noqa: E731
            vh = ref.load(snaps[k]["params"])
            ref.zero(vh)
            rows = ref.rows(prompts, comps, groups, values=vh)
            loss, m = minibatch_objective(cfg, rows, pick(old), pick(refs), R[idx], adv_tok=pick(adv_tok),
                                          returns=pick(rets), old_v=pick(old_v), is_w=pick(is_w), kept=pick(kept),
                                          seq_w=None if seq_w is None else seq_w[idx],
                                          trunc=pick(trunc))
            loss.backward()
            grads = ref.grads(vh)
            norm = torch.sqrt(sum((g ** 2).sum() for g in grads))
            coef = min(1.0, lc.grad_clip / (float(norm) + 1e-6)) if lc.grad_clip > 0 else 1.0
            got = snaps[k]["grads"]
            assert len(got) == len(grads)
            for gg, want in zip(got, grads):
                assert torch.allclose(gg.double(), want * coef, rtol=1e-4, atol=1e-6 * max(1.0, float(norm) * coef)), \
                    (step, k, float((gg.double() - want * coef).abs().max()))
            if lc.max_tokens_per_micro_batch:  # groups over the budget (every token a row feeds: all but its last)
                m["split_groups"] = torch.tensor(float(sum(
                    sum(len(prompts[g]) + len(c.token_ids) - 1 for c in comps[g]) > lc.max_tokens_per_micro_batch
                    for g in groups)))
            losses.append(float(loss.detach())), norms.append(float(norm)), mets.append({q: float(v) for q, v in m.items()})
            k += 1
    mean_m = {q: float(np.mean([x[q] for x in mets])) for q in mets[0]}
    return float(np.mean(losses)), float(np.mean(norms)), mean_m, corr, (losses, norms)


def check_adamw_chain(traced: Traced, ref: Ref):
    """AdamW (torch's definition, written out) from the initial weights with the observed clipped gradients and the
    logged rates: each optimiser step gives the weights the next one starts from, and the last step of each train
    step the checkpoint's."""
    from safetensors.torch import load_file

    lc = traced.cfg.learner
    b1, b2 = lc.betas
    first = traced.opt_steps[0]["params"]
    for (name, _), p0, q in zip(ref.named, ref.initial_params, first):
        assert torch.equal(q.double(), p0), name  # the run started from the warm-up's folder
    n_opt = lc.epochs * (P // lc.mini_batch_prompts)
    recs = traced.records()
    state = [(torch.zeros_like(p, dtype=torch.float64), torch.zeros_like(p, dtype=torch.float64))
             for p in first]
    params = [p.double() for p in first]
    for i, s in enumerate(traced.opt_steps):
        step = i // n_opt + 1
        lrs = [lc.lr * recs[step - 1]["learner/lr"] / lc.lr] + ([lc.critic_lr * recs[step - 1]["learner/lr"] / lc.lr]
                                                                 if len(s["lrs"]) > 1 else [])
        assert s["lrs"] == pytest.approx(lrs, rel=1e-12)
        t = i + 1
        sizes = s["sizes"]
        group_of = [gi for gi, n in enumerate(sizes) for _ in range(n)]
        new = []
        for j, (p, g, (mm, vv)) in enumerate(zip(params, s["grads"], state)):
            g = g.double()
            lr = lrs[group_of[j]]
            p = p * (1 - lr * lc.weight_decay)
            mm.mul_(b1).add_((1 - b1) * g)
            vv.mul_(b2).add_((1 - b2) * g * g)
            p = p - lr * (mm / (1 - b1 ** t)) / (torch.sqrt(vv / (1 - b2 ** t)) + lc.eps)
            new.append(p)
        params = new
        nxt = traced.opt_steps[i + 1]["params"] if i + 1 < len(traced.opt_steps) else None
        if nxt is not None:
            for p, q in zip(params, nxt):
                assert torch.allclose(p, q.double(), atol=2e-6, rtol=0), (i, float((p - q.double()).abs().max()))
            params = [q.double() for q in nxt]
        if t % n_opt == 0:
            ck = traced.run / "checkpoints" / f"step_{step:06d}"
            if ck.exists():
                w = load_file(ck / "model.safetensors")
                for (name, _), p in zip(ref.named, params):
                    if name in w:
                        assert torch.allclose(w[name].double(), p, atol=2e-6, rtol=0), name


def check_record(traced: Traced, ref: Ref, *, keys, correction=None, rel=1e-5):
    """Every train record's learner/loss, learner/grad_norm and ``keys`` (``learner/<key>``) against the float64
    recomputation (means over the optimiser steps); returns the recomputations."""
    out = []
    recs = traced.records()
    assert [r["step"] for r in recs] == [1, 2]
    lc = traced.cfg.learner
    for r in recs:
        loss, norm, m, corr, per = recompute(traced, ref, r["step"], correction=correction)
        assert r["learner/optimizer_steps"] == lc.epochs * P // lc.mini_batch_prompts
        assert r["learner/loss"] == pytest.approx(loss, rel=rel, abs=1e-6), (r["step"], per)
        assert r["learner/grad_norm"] == pytest.approx(norm, rel=rel), (r["step"], per)
        for k in keys:
            assert r[f"learner/{k}"] == pytest.approx(m[k], rel=rel, abs=1e-6), (r["step"], k, r[f"learner/{k}"], m[k])
        for k, v in corr.items():
            assert r[f"correction/{k}"] == pytest.approx(v, rel=rel, abs=1e-6), (r["step"], k)
        learner_keys = {k[len("learner/"):] for k in r if k.startswith("learner/")}
        extra = learner_keys - set(keys) - {"loss", "grad_norm", "optimizer_steps", "lr", "forward/packed",
                                             "forward/shared_prefix", "forward/padded", "forward/token_slots"}
        assert not extra, f"learner keys this sweep does not check: {sorted(extra)}"
        out.append((r, loss, norm, m, per))
    check_adamw_chain(traced, ref)
    return out


# ------------------------------------------------------------------------------------------- PACS

def test_pacs_loss_and_grad_norm_are_the_mini_batch_means(runs, cache):
    """learner/loss: the mean over the 4 optimiser steps of each mini-batch's BCE (1/B) sum_i w_i (softplus(psi_i) -
    R_i psi_i), psi the RLOO of r_i = beta sum_t (logp - logp_old) (logp_old: the policy before the step, so the
    first mini-batch's psi is 0 and its loss is ln 2 x the mean weight, 1); learner/grad_norm: the mean of the 4
    pre-clip norms. Not the first mini-batch's nor the last's: those differ here by far more than the bound."""
    run = runs("pacs")
    out = check_record(run, Ref(run, cache), keys=[])
    for r, loss, norm, m, (losses, norms) in out:
        assert losses[0] == pytest.approx(math.log(2), rel=1e-9)  # psi = 0, weights of mean 1 in each group
        assert abs(losses[-1] - loss) > 1e-3 and abs(norms[0] - norm) > 1e-3
    assert max(n for *_, (_, norms) in out for n in norms) > run.cfg.learner.grad_clip  # clipping acted


@pytest.mark.parametrize("variant", ["pacs_micro2", "pacs_packed", "pacs_split"])
def test_micro_batches_packing_and_split_groups_do_not_change_the_learner_metrics(variant, runs, cache):
    """Two groups a forward (learner.micro_batch_prompts=2 against 1), rows packed end to end (against each group's
    shared prefix), and a token budget under one group (every group trained a few rows at a time, by gradient
    caching): the same float64 truth, and the same logged loss / grad_norm as the reference run where the step's
    rollouts are the same (accumulation scales each micro-batch by the mini-batch's counts: no per-micro-batch
    normalisation)."""
    base, run = runs("pacs"), runs(variant)
    check_record(run, Ref(run, cache), keys=["split_groups"] if variant == "pacs_split" else [])
    same = 0
    for a, b, ca, cb in zip(base.records(), run.records(), base.train_calls(), run.train_calls()):
        if [c.token_ids for cs in ca[2] for c in cs] != [c.token_ids for cs in cb[2] for c in cs]:
            continue
        same += 1
        assert b["learner/loss"] == pytest.approx(a["learner/loss"], rel=1e-5)
        assert b["learner/grad_norm"] == pytest.approx(a["learner/grad_norm"], rel=1e-5)
    assert same >= 1
    if variant == "pacs_packed":
        assert all(r["learner/forward/packed"] > 0 and r["learner/forward/shared_prefix"] == 0 for r in run.records())


# ------------------------------------------------------------------------------------------- the baselines

CLIPS = ["pg_loss", "clip_frac", "clip_frac_high", "clip_frac_low", "ppo_kl", "approx_kl"]
ADV = ["adv_mean", "adv_abs_mean"]


def test_grpo_kl_entropy_clip_metrics(runs, cache):
    """GRPO: loss = token-mean clipped surrogate (dual clip for A < 0) + kl_coef x token-mean k3(logp_ref - logp) -
    entropy_coef x token-mean entropy; pg_loss, kl, clip_frac(_high, _low), dual_clip_frac, ppo_kl, approx_kl,
    adv_mean / adv_abs_mean: each the mean over the optimiser steps of the mini-batch's value."""
    run = runs("grpo_kl")
    keys = CLIPS + ADV + ["kl", "dual_clip_frac"]
    out = check_record(run, Ref(run, cache), keys=keys)
    for k in ("kl", "clip_frac", "clip_frac_high", "clip_frac_low", "dual_clip_frac"):
        assert max(m[k] for _, _, _, m, _ in out) > 0, k  # (each counter counted something)


def test_ppo_loss_includes_the_value_loss(runs, cache):
    """PPO: loss = pg_loss + vf_coef x vf_loss, vf_loss = 0.5 token-mean max((V - ret)^2, (clip(V, V_old +- c) -
    ret)^2), returns from GAE (gamma, lam; the value after the last token 0) on the old values, advantages whitened
    over the step's tokens; vf_clip_frac; the value head's gradient in grad_norm and its rate learner.critic_lr."""
    run = runs("ppo")
    out = check_record(run, Ref(run, cache), keys=CLIPS + ["dual_clip_frac", "vf_loss", "vf_clip_frac"])
    assert max(m["vf_clip_frac"] for _, _, _, m, _ in out) > 0
    for r, loss, _, m, _ in out:
        assert r["learner/loss"] == pytest.approx(m["pg_loss"] + run.cfg.algo.vf_coef * m["vf_loss"], rel=1e-5)


@pytest.mark.parametrize("name", ["dr_grpo", "gspo", "cispo"])
def test_dr_grpo_gspo_cispo(name, runs, cache):
    """Dr. GRPO (advantage R - mean, seq-mean-token-sum-norm over rollout.max_new_tokens), GSPO (the sequence ratio
    exp(mean_t log-ratio) in its stop-gradient token form, clip 3e-4 / 4e-4, seq-mean-token-mean), CISPO (-sg[clip(r,
    1 - 10, 1.2)] A logp, token-mean): loss, grad_norm and each metric they log."""
    run = runs(name)
    if name == "gspo":
        assert (run.cfg.algo.clip_low, run.cfg.algo.clip_high) == (3e-4, 4e-4)
    if name == "cispo":
        assert (run.cfg.algo.clip_low, run.cfg.algo.clip_high) == (10.0, 0.2)
    keys = CLIPS + ADV + (["dual_clip_frac"] if name == "dr_grpo" else []) + \
        (["seq_ratio_mean"] if name == "gspo" else [])
    out = check_record(run, Ref(run, cache), keys=keys)
    if name == "gspo":
        assert max(m["clip_frac"] for _, _, _, m, _ in out) > 0


def test_high_entropy_token_selection(runs, cache):
    """algo.entropy_top_frac=0.5: the clipped terms of the ceil(n / 2) highest-entropy tokens of each micro-batch
    (here a group) only, the denominators every token's; learner/entropy_threshold (the lowest kept entropy, each
    micro-batch's weighted by its tokens) and learner/entropy_kept_frac."""
    run = runs("grpo_top_entropy")
    check_record(run, Ref(run, cache), keys=CLIPS + ADV + ["dual_clip_frac", "entropy_threshold", "entropy_kept_frac"])


def test_split_groups_rows_apart(runs, cache):
    """GRPO (with a KL penalty) under a token budget below one group: rows train apart, each with its whole group's
    advantage; the loss, grad_norm and metrics of the whole groups (means over rows / tokens of the mini-batch),
    learner/split_groups (groups trained by rows: the mean over the step's optimiser steps)."""
    run = runs("grpo_split")
    check_record(run, Ref(run, cache), keys=CLIPS + ADV + ["dual_clip_frac", "kl", "split_groups"])


def test_mask_truncated(runs, cache):
    """learner.mask_truncated: PACS scores each group over its members left (RLOO and class weights over them; a group
    of fewer than 2 drops out) and averages over those rows; GRPO keeps the whole group's advantages, the cut rows'
    tokens out of the denominators and of the clip / KL fractions."""
    for name, keys in (("pacs_mask_truncated", []), ("grpo_mask_truncated", CLIPS + ADV + ["dual_clip_frac"])):
        run = runs(name)
        check_record(run, Ref(run, cache), keys=keys)
        assert any(c.finish_reason == "length" for _, _, cs in run.train_calls() for g in cs for c in g)


def test_rollout_temperature(runs, cache):
    """rollout.temperature=0.7: the learner's log-probs, ratios, KL and entropy bonus of softmax(logits / 0.7)."""
    run = runs("grpo_temperature")
    check_record(run, Ref(run, cache), keys=CLIPS + ADV + ["dual_clip_frac", "kl"])


# ------------------------------------------------------------------------------------------- off-policy correction

def token_correction(cap, low, high):
    """docs/OFF_POLICY.md, off_policy.py: lr = logp_old - logp_mu per token; w = min(e^lr, cap); tokens with e^lr
    outside [low, high] rejected (weight 0, out of the denominators); metrics over the response tokens, the weights
    before rejection."""
    def f(old, mu):
        lr = [o - m for o, m in zip(old, mu)]
        w = [torch.exp(x).clamp(max=cap) for x in lr]
        kept = [((torch.exp(x) >= low) & (torch.exp(x) <= high)).double() for x in lr]
        flat, wf, kf = torch.cat(lr), torch.cat(w), torch.cat(kept)
        seq = torch.stack([x.sum() for x in lr])
        corr = {"is_weight_mean": float(wf.mean()), "is_weight_max": float(wf.max()),
                "frac_truncated": float((flat > math.log(cap)).double().mean()),
                "frac_rejected": float(1 - kf.mean()), "kl_k1": float((-flat).mean()),
                "kl_k3": float(k3(flat).mean()), "seq_log_ratio_mean": float(seq.mean()),
                "seq_log_ratio_min": float(seq.min()), "seq_log_ratio_max": float(seq.max()), "seqs": float(len(seq))}
        return [x * k for x, k in zip(w, kept)], kept, None, corr
    return f


def sequence_correction(cap):
    """PACS: one weight a sequence, min(e^(sum_t lr), cap), multiplying its BCE term (docs/OFF_POLICY.md)."""
    def f(old, mu):
        lr = [o - m for o, m in zip(old, mu)]
        seq = torch.stack([x.sum() for x in lr])
        sw = torch.exp(seq).clamp(max=cap)
        flat = torch.cat(lr)
        wtok = torch.cat([sw[i].expand(len(x)) for i, x in enumerate(lr)])
        corr = {"is_weight_mean": float(wtok.mean()), "is_weight_max": float(wtok.max()),
                "frac_truncated": float(torch.cat([(seq[i] > math.log(cap)).double().expand(len(x))
                                                   for i, x in enumerate(lr)]).mean()),
                "frac_rejected": 0.0, "kl_k1": float((-flat).mean()), "kl_k3": float(k3(flat).mean()),
                "seq_log_ratio_mean": float(seq.mean()), "seq_log_ratio_min": float(seq.min()),
                "seq_log_ratio_max": float(seq.max()), "seqs": float(len(seq))}
        return None, None, sw, corr
    return f


def test_correction_metrics_and_weighted_loss_grpo(runs, cache):
    """Token-level truncated IS (cap 1.5) with token rejection outside [0.5, 2]: correction/* from the float64 old
    log-probs and the engine's, and the loss aggregated over the kept tokens with each token's clipped term
    weighted (a separate proximal pass: rejection needs the denominators first)."""
    run = runs("corr_grpo")
    out = check_record(run, Ref(run, cache), keys=CLIPS + ADV + ["dual_clip_frac"],
                       correction=token_correction(1.5, 0.5, 2.0))
    for r, *_ in out:
        assert r["correction/frac_truncated"] > 0 and r["correction/frac_rejected"] > 0
        assert r["correction/fused"] == 0.0


def test_correction_metrics_and_weighted_loss_pacs_fused(runs, cache):
    """PACS with sequence-level IS (cap 1.5), fused into the update's first forward: its BCE terms weighted by each
    row's min(e^(sum lr), 1.5), the mean still over every row."""
    run = runs("corr_pacs")
    out = check_record(run, Ref(run, cache), keys=[], correction=sequence_correction(1.5))
    for r, *_ in out:
        assert r["correction/frac_truncated"] > 0 and r["correction/fused"] == 1.0


# ------------------------------------------------------------------------------------------- megatron

@pytest.mark.megatron
@pytest.mark.parametrize("name", ["pacs", "grpo_kl", "ppo", "gspo", "grpo_top_entropy", "pacs_split", "grpo_split",
                                  "corr_grpo", "corr_pacs", "pacs_mask_truncated", "grpo_temperature"])
def test_megatron_logs_the_torch_learner_s_learner_metrics(name, runs):
    """learner.backend=megatron (one process, tp 1) on the same settings: the same learner/* and correction/* keys
    (but which forward ran: megatron has no shared-prefix forward) with the torch learner's values, where the step's
    rollouts are the same: to 1e-5 at step 1 (the same start, 2 to 4 optimiser steps), 1e-4 at step 2, whose weights
    already differ by float32 noise that AdamW's normalised steps amplify (corr_grpo's approx_kl: 3e-5 from
    megatron, where two torch runs with micro-batches of 1 and 2 groups differ by 1.3e-6)."""
    pytest.importorskip("megatron.core")
    torch_run, mega = runs(name), runs(name, megatron=True)
    same = 0
    for a, b, ca, cb in zip(torch_run.records(), mega.records(), torch_run.train_calls(), mega.train_calls()):
        ka = {k for k in a if k.startswith(("learner/", "correction/")) and not k.startswith("learner/forward/")}
        kb = {k for k in b if k.startswith(("learner/", "correction/")) and not k.startswith("learner/forward/")}
        assert ka == kb, (sorted(ka ^ kb))
        if [c.token_ids for cs in ca[2] for c in cs] != [c.token_ids for cs in cb[2] for c in cs]:
            continue
        same += 1
        for k in sorted(ka):
            tol = 1e-5 if a["step"] == 1 else 1e-4
            assert b[k] == pytest.approx(a[k], rel=tol, abs=1e-6), (a["step"], k, a[k], b[k])
    assert same >= 1 and torch_run.records()[0]["learner/grad_norm"] == pytest.approx(
        mega.records()[0]["learner/grad_norm"], rel=1e-5)  # (step 1: the same rollouts, always)
