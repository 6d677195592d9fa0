"""One learner update on one GPU: tokens/s, MFU, peak memory and where the time goes (issue 38).

    python bench/gpu/learner.py --out OUT_DIR [--budget-s 180] [--steps 3]
    python bench/gpu/learner.py --out OUT_DIR --dry-run         # CPU, tiny shape, seconds (CI)

The real step: ``TorchLearner.update`` on one rollout batch (fused old log-probs: one forward and one
backward per micro-batch, the log-probs from hidden states, the PACS loss (its fused kernels since 2026-12-05,
the torch path before), AdamW on fp32 master weights),
bf16, random weights of a Qwen2.5-1.5B shape (28 layers, hidden 1536, 12 / 2 heads, FFN 8960) and a Qwen2.5-0.5B shape
(24 layers, hidden 896, 14 / 2 heads, FFN 4864), vocabulary 151,936, tied embeddings. Responses after
a 256-token prompt: every row 1k, 4k, 16k or 32k tokens (groups of 2, about 32k tokens per update),
and ``mix``: lognormal lengths (median 1k, sigma 1, cap 16k), 4 groups of 8 (``--dry-run``: ``k`` is one
token, the mix median 16, cap 64, one group; a 2-layer hidden-64 model in fp32). Learners: ``torch packed
varlen`` (learner.packed_attention=varlen), the same with ``learner.fused_layers=on`` (RMSNorm and SwiGLU
through Liger-Kernel; ``--dry-run``: their torch twins), ``torch packed dense`` (the block-diagonal mask; not run
where the memory model says its masks do not fit), ``torch padded + SDPA`` (learner.packing=off), and
``megatron packed THD`` (``MegatronLearner`` at TP = 1 on a one-process group, learner.packing=on: its own
core attention on THD rows, pacs_fast/learner/megatron/core_attention.py; the same random weights, saved
once per shape and loaded by its converter; ``--dry-run`` runs it on CPU / gloo), the same with its
MLPs' SwiGLU through Liger's fused gate-up op (learner.fused_layers=on; ``--dry-run``: the op's torch twin),
and ``megatron padded`` (learner.packing=off: its padded rows through the same core attention's causal kernel).
The micro-batch token budget comes from the memory model (pacs_fast/trainer/memory_model.py) at 80% of the
GPU, with activation recompute only as much as one group needs to fit (``model.recompute_granularity``: none, else
selective, each layer's MLP, else full); a row that runs out of memory is retried once with more recompute,
then says so. Order: the main shape first, its rows in the order of issue 38's targets (``FIRST``: 4k packed,
the mix packed and padded, 32k, the fused layers, ...), each row skipped cleanly once ``--budget-s`` is
spent. Per row: one untimed update, ``--steps`` timed ones (median), one profiled
(torch.profiler: device time in attention, LM head + loss, optimiser, the rest). Writes
OUT/learner.json (one row per learner x shape x length: ``hidden``, ``response_tokens``, ``tokens_per_s``,
``mfu``, ``peak_gb``, ...) and OUT/learner.md (the table, with the FLOP formula beside it).
"""
from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)  # (also when a test loads this file by its path)

import torch  # noqa: E402
from learner_args import LEARNERS, SHAPES, TINY, parser  # noqa: E402
from learner_profile import profile_shares, shares_of  # noqa: E402,F401 (shares_of: tests/test_gpu_learner_bench.py)

# (length, learner) of each shape measured first, in the order of issue 38's targets: MFU at 4k; packed against
# padded on the long-tailed mix; the longest response; whether the fused layers pay; the memory curve; then the rest
# length-major, so that a time budget cut short still answers the targets
FIRST = [("4k", "torch packed varlen"), ("4k", "megatron packed THD"), ("mix", "torch packed varlen"),
         ("mix", "torch padded + SDPA"), ("mix", "megatron packed THD"), ("32k", "torch packed varlen"),
         ("4k", "torch packed varlen + Liger layers"), ("4k", "megatron packed THD + Liger SwiGLU"),
         ("4k", "torch padded + SDPA"), ("16k", "torch packed varlen"), ("1k", "torch packed varlen")]
PROMPT = 256


def lengths_for(spec: str, seed: int, dry: bool) -> tuple[list[int], int]:
    """Response lengths of the batch and its group size for ``spec`` (``1k`` ... or ``mix``)."""
    if spec == "mix":
        gen = torch.Generator().manual_seed(seed)
        med, cap, n = (16, 64, 8) if dry else (1024, 16384, 32)
        x = torch.exp(math.log(med) + torch.randn(n, generator=gen)).round().clamp(1, cap)
        return x.long().tolist(), 8
    L = int(spec[:-1]) * (1 if dry else 1024) if spec.endswith("k") else int(spec)
    rows = max(2, 2 * math.ceil((64 if dry else 32768) / (2 * L)))
    return [L] * rows, 2


def make_batch(lengths, G, vocab, prompt, seed):
    from pacs_fast.learner.base import RolloutBatch

    gen = torch.Generator().manual_seed(seed)
    T = prompt + max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), T), generator=gen)
    att = torch.zeros(len(lengths), T, dtype=torch.long)
    resp = torch.zeros(len(lengths), T)
    for i, n in enumerate(lengths):
        att[i, :prompt + n], resp[i, prompt:prompt + n] = 1, 1
    rewards = torch.randint(0, 2, (len(lengths),), generator=gen).float()
    return RolloutBatch(ids * att, att, resp, rewards, group_size=G)


def make_model(dims, vocab, dtype, device, max_len):
    from transformers import Qwen2ForCausalLM

    from pacs_fast.data.tiny import tiny_qwen2_config

    layers, hidden, heads, kv, ffn = dims
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(tiny_qwen2_config(vocab, hidden_size=hidden, num_layers=layers, num_heads=heads,
                                                   num_kv_heads=kv, intermediate_size=ffn, max_positions=max_len))
    model.set_attn_implementation("sdpa")
    return model.to(dtype)


RECOMPUTE = (False, "selective", "full")  # the least recompute first (model.recompute_granularity)


def memory_config(learner_name, recompute, prompt, longest, G, dtype="bfloat16"):
    """The run config whose learner memory (pacs_fast/trainer/memory_model.py) a row predicts: this learner's
    settings, ``recompute`` (False, "selective" or "full"), prompts of ``prompt`` tokens and responses up to
    ``longest``, groups of ``G``."""
    from pacs_fast.config import load_config

    kw = LEARNERS[learner_name]
    over = [f"learner.{k}={v}" for k, v in kw.items()] + ([] if "fused_layers" in kw else ["learner.fused_layers=off"])
    over += [f"model.dtype={dtype}", f"model.gradient_checkpointing={'true' if recompute else 'false'}",
             f"model.recompute_granularity={recompute or 'full'}", f"data.max_prompt_tokens={prompt}",
             f"rollout.max_new_tokens={longest}", f"rollout.n={G}", "learner.shared_prefix=false"]
    return load_config(None, over)


def group_costs(lengths, G, prompt, padded) -> list[int]:
    """What each group counts against the token budget: its real tokens, or (``padded``: learner.packing=off, and
    the dense mask's bins) its rows x its longest row, the token slots the padded forward runs
    (pacs_fast/learner/packing.py)."""
    groups = [lengths[g:g + G] for g in range(0, len(lengths), G)]
    return [len(x) * (prompt + max(x)) if padded else sum(prompt + n for n in x) for x in groups]


def plan(shape, lengths, G, prompt, mem_bytes, learner_name, levels=RECOMPUTE, budget=None):
    """``(recompute, token budget, predicted bytes, why not)`` from the product's memory model
    (:func:`pacs_fast.trainer.memory_model.learner_memory`: weights, fp32 masters, gradients, AdamW's moments and
    step, the tied head's gradient, activations, the log-prob workspace): the largest token budget whose
    predicted peak stays within 80% of the device, at the first of ``levels`` (False; ``"selective"``: each
    layer's MLP; ``"full"``: each layer) at which one group fits, else at the last level a budget under one group
    (its groups then train a few rows at a time: ``learner.split_groups=auto``) as long as one row fits; a given
    ``budget`` is taken as it is (the memory curve). Padded rows (learner.packing=off) and dense bins count their token slots (:func:`group_costs`)."""
    from pacs_fast.trainer.memory_model import learner_memory

    spec = LEARNERS[learner_name]
    costs = group_costs(lengths, G, prompt, spec.get("packing") == "off" or spec.get("packed_attention") == "dense")
    group, total = max(costs), sum(costs)
    room = 0.8 * mem_bytes
    for ckpt in levels:
        cfg = memory_config(learner_name, ckpt, prompt, max(lengths), G,
                            "bfloat16" if shape["bytes"] == 2 else "float32")
        peak = lambda t: learner_memory(cfg, shape, tokens=t)["total"]  # noqa: E731
        if budget is not None:
            return ckpt, budget, peak(min(budget, total)), None
        if peak(group) > room:
            continue
        lo, hi = group, total  # the largest budget that fits (the prediction grows with the tokens)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if peak(mid) <= room else (lo, mid - 1)
        return ckpt, lo, peak(lo), None
    row = max(prompt + n for n in lengths)  # one row alone: a group over the budget trains a few rows at a time
    if budget is None and peak(row) <= room:  # (learner.split_groups=auto, one more forward of its rows)
        lo, hi = row, group
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if peak(mid) <= room else (lo, mid - 1)
        return ckpt, lo, peak(lo), None
    return ckpt, group, None, (f"not run: one row of {row:,} tokens needs {peak(row) / 2**30:.0f} GiB with "
                               f"recompute {ckpt}, more than 80% of {mem_bytes / 2**30:.0f} GiB")


def run_row(model, shape, shape_name, learner_name, spec, args, device, mem_bytes, t_end, token_budget=None) -> dict:
    """One table row: plan, warm up, time, profile (a CUDA out-of-memory retries once with gradient
    checkpointing, then the row says it did not fit)."""
    lengths, G = lengths_for(spec, 0, args.dry_run)
    P = args.prompt
    row = {"learner": learner_name, "shape": shape_name, "hidden": shape["hidden"], "spec": spec,
           "response_tokens": "mix" if spec == "mix" else lengths[0], "rows": len(lengths),
           "tokens": sum(P + n for n in lengths)}
    if LEARNERS[learner_name].get("backend") == "megatron" and importlib.util.find_spec("megatron") is None:
        return {**row, "not_run": "megatron-core is not installed"}
    if (LEARNERS[learner_name].get("fused_layers") == "on" and not args.dry_run
            and importlib.util.find_spec("liger_kernel") is None):
        return {**row, "not_run": "liger-kernel is not installed"}
    if time.time() > t_end:
        return {**row, "not_run": "time budget spent"}
    forced = {"auto": None, "off": False}.get(args.recompute, args.recompute)
    ckpt, budget, pred, why = plan(shape, lengths, G, P, mem_bytes, learner_name,
                                   RECOMPUTE if forced is None else (forced,), budget=token_budget)
    if why and not args.dry_run:
        return {**row, "not_run": why}
    try:
        return measure(model, shape, learner_name, lengths, G, args, device, {**row, "gradient_checkpointing": ckpt,
                       "token_budget": budget, "predicted_gb": pred and pred / 2**30})
    except torch.cuda.OutOfMemoryError as e:
        first = f"out of memory (recompute {ckpt or 'off'}, budget {budget:,}): {str(e)[:100]}"
    _cleanup(model, device)
    more = RECOMPUTE[RECOMPUTE.index(ckpt) + 1:] if forced is None else ()
    ckpt2, budget2, pred2, why2 = (plan(shape, lengths, G, P, mem_bytes, learner_name, more, budget=token_budget)
                                   if more else (None,) * 3 + ("",))
    if not more or why2 or time.time() > t_end:
        return {**row, "not_run": first}
    try:
        return measure(model, shape, learner_name, lengths, G, args, device, {**row, "gradient_checkpointing": ckpt2,
                       "token_budget": budget2, "predicted_gb": pred2 / 2**30, "retried_after": first})
    except torch.cuda.OutOfMemoryError as e:
        _cleanup(model, device)
        return {**row, "not_run": f"{first}; with recompute {ckpt2}: out of memory too ({str(e)[:80]})"}


def _cleanup(model, device):
    model.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.empty_cache()


def saved_model(model, out: str) -> str:
    """The HF folder of ``model``'s weights (written once per shape under ``out``), which the megatron
    learner loads through its converter."""
    path = os.path.join(out, "model_" + "_".join(str(v) for v in (model.config.num_hidden_layers,
                                                                   model.config.hidden_size)))
    if not os.path.isfile(os.path.join(path, "config.json")):
        model.save_pretrained(path + ".tmp")
        os.replace(path + ".tmp", path)
    return path


def make_learner(model, learner_name, lengths, G, args, row):
    """The learner of ``learner_name`` on ``model``'s weights (torch: the live model; megatron: its copy)."""
    from pacs_fast.config import AlgoConfig, LearnerConfig

    groups = len(lengths) // G
    lc = LearnerConfig(lr=1e-6, shared_prefix=False, mini_batch_prompts=groups, micro_batch_prompts=groups,
                       max_tokens_per_micro_batch=row["token_budget"], **LEARNERS[learner_name])
    from pacs_fast.learner.fused_layers import fuse_layers, liger_ops, torch_ops, unfuse_layers
    if lc.backend == "megatron":
        from pacs_fast.learner.megatron.learner import MegatronLearner
        dtype = "bfloat16" if model.dtype == torch.bfloat16 else "float32"
        fused, lc.fused_layers = lc.fused_layers == "on", "off"  # (fused below: the dry run's twins, else Liger)
        learner = MegatronLearner(saved_model(model, args.out), algo=AlgoConfig(), learner=lc, horizon=max(lengths),
                                  dtype=dtype, gradient_checkpointing=bool(row["gradient_checkpointing"]),
                                  recompute_granularity=row["gradient_checkpointing"] or "full")
        c = learner.model.config  # what megatron recomputes
        row["recompute"] = c.recompute_granularity and (  # (megatron fills in its modules for full too: unused)
            f"selective: {','.join(c.recompute_modules)}" if c.recompute_granularity == "selective" else "full")
        if fused:
            ops = torch_ops() if args.dry_run else liger_ops()
            row["fused_layers"] = fuse_layers(learner.model, ops=ops)
            if learner.ref_model is not None:
                fuse_layers(learner.ref_model, ops=ops)
        return learner
    from pacs_fast.learner.recompute import apply_recompute, undo_recompute
    from pacs_fast.learner.torch_learner import TorchLearner
    undo_recompute(model)  # the rows share one model: each row fuses it or not, recomputes or not
    unfuse_layers(model)
    model.gradient_checkpointing_disable()
    if lc.fused_layers == "on":  # (dry run: the ops' torch twins; Liger's kernels need a GPU)
        row["fused_layers"] = fuse_layers(model, ops=torch_ops() if args.dry_run else liger_ops())
    row["recompute"] = apply_recompute(model, bool(row["gradient_checkpointing"]),
                                       row["gradient_checkpointing"] or "full")
    return TorchLearner(model, algo=AlgoConfig(), learner=lc, horizon=max(lengths))


def measure(model, shape, learner_name, lengths, G, args, device, row) -> dict:
    from pacs_fast.learner import flops, torch_forward, torch_learner
    from pacs_fast.ops import varlen_attention

    learner = make_learner(model, learner_name, lengths, G, args, row)
    varlen_attention.KERNEL_CALLS.clear()
    batch = make_batch(lengths, G, shape["vocab"], args.prompt, 0)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    wrap = torch.profiler.record_function

    last = {}

    def step():
        batch.old_logp = batch.ref_logp = None
        with wrap("bench.update"):
            last.update(learner.update(batch, seed=1))  # (its forward/* counts: update() then clears them)

    # the LM head and loss under one profiler label (the profile's share reads it; a function moved out of these
    # modules would silently read 0, so the warm-up checks that each wrapper ran)
    if isinstance(learner, torch_learner.TorchLearner):
        hooks = [(torch_forward, "linear_logprobs"), (torch_learner, "objective")]
    else:  # megatron: the vocabulary-parallel log-probs' kernels go by their names (learner_profile.LOGPROB)
        import pacs_fast.learner.megatron.learner as megatron_learner
        hooks = [(megatron_learner, "objective")]
    saved = [(m, n, getattr(m, n)) for m, n in hooks]
    entered = set()
    for m, n, fn in saved:
        setattr(m, n, functools.partial(_in, wrap, "bench.lm_head_loss", fn, entered, f"{m.__name__}.{n}"))
    try:
        step()  # warm-up: kernels compile, the optimiser allocates its moments
        if len(entered) < len(saved):
            missing = sorted({f"{m.__name__}.{n}" for m, n, _ in saved} - entered)
            raise RuntimeError(f"bench/gpu/learner.py: the update never called {', '.join(missing)} (moved?): the "
                               f"profile's LM head + loss share would miss it")
        sync()
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(1 if args.dry_run else args.steps):
            t0 = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t0)
        row["peak_gb"] = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
        row["shares"] = profile_shares(step) if device == "cuda" else None
        row["forwards"] = {k[len("forward/"):]: v for k, v in last.items() if k.startswith("forward/") and v}
        row["split_groups"] = last.get("split_groups", 0.0)  # groups over the budget, trained a few rows at a time
        # the packed attention's kernel(s) that answered (a failing one falls back with one stderr line)
        row["attention_kernels"] = dict(varlen_attention.KERNEL_CALLS)
    finally:
        for m, n, fn in saved:
            setattr(m, n, fn)
        del learner
        _cleanup(model, device)
    sec = statistics.median(times)
    fed = [args.prompt + n - 1 for n in lengths]  # the last token is only a label
    f = flops.update_flops(shape, fed, head_tokens=sum(lengths))
    peak = flops.peak_flops(torch.cuda.get_device_name()) if device == "cuda" else None
    if row.get("shares"):  # the device's kernel time over the step's median wall time
        row["device_busy"] = row["shares"]["device_s"] / sec
    row.update(seconds=sec, tokens_per_s=row["tokens"] / sec, flops=f["total"], mfu=flops.mfu(f["total"], sec, peak),
               attention_flop_share=f["attention"] / f["total"])
    return row


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _in(wrap, label, fn, entered, name, *a, **k):
    entered.add(name)
    with wrap(label):
        return fn(*a, **k)


def table(rows, device, formula) -> str:
    L = [f"# Learner update ({device})", "", f"MFU: {formula}.", "",
         "| learner | shape | response | tokens | recompute | tokens / micro-batch | tok/s | MFU | peak / predicted GB "
         "| attention | LM head+loss | optimiser | other | GPU busy |",
         "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        kernels = ", ".join(sorted(r.get("attention_kernels") or {}))
        head = f"| {r['learner']}{f' ({kernels})' if kernels else ''} | {r['shape']} | {r['spec']} | {r['tokens']:,} |"
        if "not_run" in r:
            L.append(f"{head} | {r['not_run']} | | | | | | | | |")
            continue
        s = r.get("shares") or {}
        pct = [f"{100 * s[k]:.0f}%" if k in s else "-" for k in ("attention", "lm_head+loss", "optimizer", "other")]
        mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        peak = "-" if r["peak_gb"] is None else f"{r['peak_gb']:.1f}"
        peak += "" if r.get("predicted_gb") is None else f" / {r['predicted_gb']:.1f}"
        split = f" ({r['split_groups']:g} groups by rows)" if r.get("split_groups") else ""  # learner.split_groups
        L.append(f"{head} {r['gradient_checkpointing'] or 'no'} | {r['token_budget']:,}{split} | "
                 f"{r['tokens_per_s']:,.0f} | {mfu} | {peak} | " + " | ".join(pct) + f" | {_pct(r.get('device_busy'))} |")
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    args = parser(__doc__.split("\n")[0]).parse_args(argv)
    if args.check_args:
        return 0
    budgets = args.token_budgets or [None]
    from pacs_fast.learner.flops import FORMULA, shape_of

    t0 = time.time()
    t_end = t0 + args.budget_s
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("bench/gpu/learner.py: no CUDA device (use --dry-run on CPU)", file=sys.stderr)
        return 2
    args.prompt = 8 if args.dry_run else PROMPT
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    vocab = 512 if args.dry_run else 151936
    mem_bytes = torch.cuda.get_device_properties(0).total_memory if device == "cuda" else 8 << 30
    shapes = TINY if args.dry_run else {k: SHAPES[k] for k in args.shapes}
    specs, names = args.lengths, args.learners
    rows = []
    os.makedirs(args.out, exist_ok=True)
    for shape_name, dims in shapes.items():
        top = max(lengths_for(sp, 0, args.dry_run)[0][0] if sp != "mix" else 16384 for sp in specs)
        model = None
        for spec, name, tb in ((sp, nm, tb) for sp, nm in row_order(specs, names) for tb in budgets):
            if model is None and time.time() < t_end:
                model = make_model(dims, vocab, dtype, device, args.prompt + top + 8)
            shape = shape_of(model.config if model is not None else _config(dims, vocab),
                             2 if dtype == torch.bfloat16 else 4)
            try:
                row = run_row(model, shape, shape_name, name, spec, args, device, mem_bytes, t_end, tb)
            except Exception as e:  # noqa: BLE001 - one row's failure (a kernel, an API) must not end the lease's run
                traceback.print_exc()
                lengths, _ = lengths_for(spec, 0, args.dry_run)
                row = {"learner": name, "shape": shape_name, "hidden": dims[1], "spec": spec,
                       "response_tokens": spec, "tokens": sum(args.prompt + n for n in lengths),
                       "not_run": f"failed (token budget {tb or 'planned'}): {type(e).__name__}: {e}"[:300]}
                if model is not None:
                    _cleanup(model, device)
            rows.append(row)
            mfu = "-" if row.get("mfu") is None else f"{100 * row['mfu']:.1f}%"
            done = row.get("not_run") or f"{row['tokens_per_s']:,.0f} tok/s, MFU {mfu}"
            print(f"[{time.time() - t0:6.1f} s] {name} | {shape_name} | {spec}: {done}", flush=True)
            _write(args.out, rows, device, FORMULA)
        del model
    print(table(rows, device, FORMULA))
    return 0


def row_order(specs, names) -> list[tuple[str, str]]:
    """The (length, learner) rows of one shape: those of :data:`FIRST` that were asked for, then the others
    length-major."""
    asked = [(spec, name) for spec in specs for name in names]
    return [r for r in FIRST if r in asked] + [r for r in asked if r not in FIRST]


def _config(dims, vocab):
    from pacs_fast.data.tiny import tiny_qwen2_config

    layers, hidden, heads, kv, ffn = dims
    return tiny_qwen2_config(vocab, hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv,
                             intermediate_size=ffn)


def _write(out, rows, device, formula):
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)"
    with open(os.path.join(out, "learner.json.tmp"), "w") as f:
        json.dump({"device": name, "formula": formula, "rows": rows}, f, indent=1, default=str)
    os.replace(os.path.join(out, "learner.json.tmp"), os.path.join(out, "learner.json"))
    with open(os.path.join(out, "learner.md.tmp"), "w") as f:
        f.write(table(rows, name, formula))
    os.replace(os.path.join(out, "learner.md.tmp"), os.path.join(out, "learner.md"))


if __name__ == "__main__":
    sys.exit(main())
