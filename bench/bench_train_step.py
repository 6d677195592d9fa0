"""Step time by phase of the default task, and the same workload with TRL's GRPOTrainer.

    python bench/bench_train_step.py                # ours, then TRL (if installed)
    python bench/bench_train_step.py --steps 10 --threads 1 --no-trl
    python bench/bench_train_step.py --steps 12 --rounds 3       # ours, TRL, ours, TRL, ...

Each run is a fresh process (spawn), so neither trainer inherits the other's process-wide settings:
ours applies ``train.keep_freed_memory`` (glibc thresholds) to itself and ``model.attention=auto``
(our short-sequence CPU attention) to its model; TRL runs as shipped unless
``--trl-keep-freed-memory`` / ``--trl-short-attention`` give it the same. Same tiny model (the warmed-up default, from the cache), same prompts
per step (P), samples per
prompt (G), response length limit, learning rate and one optimiser step per rollout batch. The
first step of each is excluded (warm-up); the table shows medians over the rest (the CPU is shared,
so single steps stall now and then). Prints a table and the ratio
ours / TRL (target <= 0.5). TRL is optional: ``pip install trl "torch==2.13.0"``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from pacs_fast.config import load_config
from pacs_fast.trainer.loop import train
from pacs_fast.trainer.problems import load_problems
from pacs_fast.trainer.metrics import read_jsonl
from pacs_fast.trainer.warmup import default_model

PHASES = ("time/rollout", "time/reward", "time/logprobs", "time/update", "time/step")


def in_fresh_process(fn, *args):
    """``fn(*args)`` in a new interpreter (spawn): each trainer runs with its own process-wide
    settings (threads, the allocator), none inherited from the other."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing as mp
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def bench_trl_in_process(cfg, model_path: Path, steps: int, out: Path, threads: int, keep_freed_memory: bool,
                         short_attention: bool = False):
    torch.set_num_threads(threads)
    if keep_freed_memory:
        from pacs_fast.trainer.allocator import keep_freed_memory as keep
        keep()
    return bench_trl(cfg, model_path, steps, out, short_attention=short_attention)


def bench_ours_in_process(cfg, steps: int, out: Path, threads: int):
    torch.set_num_threads(threads)
    return bench_ours(cfg, steps, out)


def bench_ours(cfg, steps: int, out: Path) -> dict:
    cfg.train.steps = steps
    cfg.train.eval_every = 0
    cfg.train.save_every = 0
    cfg.train.plots = cfg.train.tensorboard = cfg.train.progress = False
    cfg.train.out_dir, cfg.train.run_name = str(out), "ours"
    # TRL's workload: one optimiser step per rollout batch (micro-batching leaves the step unchanged)
    cfg.learner.mini_batch_prompts = cfg.train.prompts_per_step
    train(cfg, out)
    recs = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "train"][1:]
    return {k: [r[k] for r in recs] for k in PHASES}


def bench_trl(cfg, model_path: Path, steps: int, out: Path, *, short_attention: bool = False) -> dict | None:
    try:
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as e:
        print(f"TRL not measured: {e} (pip install trl 'torch==2.13.0')")
        return None
    from pacs_fast.reward import math_reward

    train_problems, _ = load_problems(cfg)
    data = Dataset.from_list([{"prompt": p["prompt"], "answer": p["answer"]} for p in train_problems])

    def reward(completions, answer, **_):
        return [math_reward(c, a) for c, a in zip(completions, answer)]

    P, G = cfg.train.prompts_per_step, cfg.rollout.n
    args = GRPOConfig(
        output_dir=str(out / "trl"), per_device_train_batch_size=P * G, num_generations=G,
        gradient_accumulation_steps=1, max_completion_length=cfg.rollout.max_new_tokens,
        learning_rate=cfg.learner.lr, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
        beta=0.0, num_iterations=1, max_steps=steps, logging_steps=1, report_to=[], save_strategy="no",
        use_cpu=not torch.cuda.is_available(), bf16=False, seed=cfg.train.seed, dataloader_num_workers=0,
        max_grad_norm=cfg.learner.grad_clip, disable_tqdm=True)
    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t)

    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if short_attention:  # TRL's generation and training forwards on our attention
        from pacs_fast.ops.short_attention import use_attention
        use_attention(model, "short")
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                          processing_class=tok, callbacks=[Timer()])
    # where TRL's step goes: its generation + scoring method (which also runs any extra log-prob
    # pass) and, inside it, the reward call; the rest of the step is forward / backward / AdamW
    spans: dict[str, list[float]] = {"gen": [], "reward": []}

    def timed(name, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spans[name].append(time.perf_counter() - t0)
        return wrapper

    for name, attr in (("gen", "_generate_and_score_completions"), ("reward", "_calculate_rewards")):
        if hasattr(trainer, attr):
            setattr(trainer, attr, timed(name, getattr(trainer, attr)))
    trainer.train()
    out = {"time/step": times[1:]}
    if len(spans["gen"]) == len(times) and len(spans["reward"]) == len(times):
        out["time/generate+reward"] = spans["gen"][1:]
        out["time/reward"] = spans["reward"][1:]
        out["time/train"] = [t - g for t, g in zip(times[1:], spans["gen"][1:])]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(),
                    help="torch threads for both trainers (default: torch's default, as the trainer's)")
    ap.add_argument("--rounds", type=int, default=1, help="alternate ours / TRL this many times")
    ap.add_argument("--no-trl", action="store_true")
    ap.add_argument("--trl-keep-freed-memory", action="store_true",
                    help="give TRL's process the allocator setting our trainer applies to itself "
                         "(train.keep_freed_memory); by default TRL runs as shipped")
    ap.add_argument("--trl-short-attention", action="store_true",
                    help="give TRL's model our short-sequence CPU attention (model.attention=auto picks it "
                         "for ours); by default TRL uses the model's own (SDPA)")
    ap.add_argument("overrides", nargs="*", help="config overrides (section.key=value)")
    a = ap.parse_args(argv)
    cfg = load_config(None, a.overrides + [f"train.threads={a.threads}"])
    torch.set_num_threads(a.threads)
    model_path = default_model(cfg, load_problems(cfg)[0])
    ours: dict[str, list] = {k: [] for k in PHASES}
    trl: dict[str, list] | None = None if a.no_trl else {}
    with tempfile.TemporaryDirectory() as d:
        for r in range(a.rounds):  # alternating, so that a slow spell of the machine hits both
            for k, v in in_fresh_process(bench_ours_in_process, cfg, a.steps, Path(d) / f"ours{r}",
                                         a.threads).items():
                ours[k] += v
            if trl is not None:
                got = in_fresh_process(bench_trl_in_process, cfg, model_path, a.steps, Path(d) / f"trl{r}",
                                       a.threads, a.trl_keep_freed_memory, a.trl_short_attention)
                if got is None:
                    trl = None
                else:
                    for k, v in got.items():
                        trl.setdefault(k, []).extend(v)
    ours = {k: statistics.median(v) for k, v in ours.items()}
    trl = {k: statistics.median(v) for k, v in trl.items()} if trl else None
    P, G = cfg.train.prompts_per_step, cfg.rollout.n
    print(f"\nworkload: {P} prompts x {G} samples, <= {cfg.rollout.max_new_tokens} new tokens, "
          f"{a.threads} thread(s), median of steps 2..{a.steps} of {a.rounds} round(s); TRL "
          f"{'with' if a.trl_keep_freed_memory else 'without'} our allocator setting, "
          f"{'with' if a.trl_short_attention else 'without'} our attention")
    print(f"{'phase':<28}{'ours (s)':>10}")
    for k in PHASES:
        print(f"{k[5:]:<28}{ours[k]:>10.3f}")
    if trl:
        for k in ("time/generate+reward", "time/reward", "time/train"):
            if k in trl:
                print(f"{'TRL ' + k[5:]:<28}{trl[k]:>10.3f}")
        print(f"{'TRL step':<28}{trl['time/step']:>10.3f}")
        print(f"ratio ours/TRL: {ours['time/step'] / trl['time/step']:.2f}  (target <= 0.5)")
    return ours, trl


if __name__ == "__main__":
    sys.exit(main() and 0)
