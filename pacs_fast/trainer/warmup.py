"""The default model: the project's tiny Qwen2 + character tokenizer, briefly fine-tuned on the
built-in arithmetic task (supervised warm-up) so that RL starts from a model that sometimes
answers right. The result is cached (``~/.cache/pacs_fast/warmup/<key>``, key = hash of every
setting that changes it); a later run with the same settings reuses it.

The warm-up has its own seed (``warmup.seed``, default 0, fixed): ``train.seed`` changes the RL run
(sampling, data order), not the starting model. ``warmup.seed=-1`` ties it to ``train.seed`` (one
warmed model per RL seed, as ``python -m pacs_fast.experiment`` does to include start-to-start
variation). A fixed number of steps leaves the step-0 accuracy swinging with the seed (0.05 to 0.27
over 5 seeds); the warm-up therefore stops once a sampled probe on training problems reaches
``warmup.target_acc`` (``warmup.steps`` is then the cap), which keeps it in a narrow band (docs/EFFICACY.md).
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import torch

from pacs_fast.config import Config
from pacs_fast.config.validation import warmup_cache_root
from pacs_fast.files import default_mode

# Part of every cache key: bump it whenever the warm-up's result changes for the same settings, or a cached
# model made by the earlier code is reused. 6: the HF sampler seeds each row on its own (rollout/sampling.py),
# which moved the sampled accuracy checks and so the step the warm-up stops at (a version-5 cache gave the
# default run step-0 accuracy 0.381 where a fresh warm-up gives 0.244).
WARMUP_VERSION = 7
# 7: the character tokenizer keeps spaces and newlines (pacs_fast/data/tiny.py): a version-6 folder holds the old
# one, which transformers 5 reloads without them (the arithmetic prompts have none: the same weights come out).


def cache_root(cfg: Config) -> Path:
    return warmup_cache_root(cfg)  # (validation probes the same folder before any work)


def warmup_seed(cfg: Config) -> int:
    """The seed of the warm-up: ``warmup.seed``, or ``train.seed`` when it is -1."""
    return cfg.train.seed if cfg.warmup.seed == -1 else cfg.warmup.seed


def warmup_key(cfg: Config) -> str:
    """Hash of every setting that changes the warmed-up model (and nothing else: the RL seed is
    not in it unless ``warmup.seed=-1`` makes the warm-up follow it)."""
    settings = {"v": WARMUP_VERSION, "hidden": cfg.model.tiny_hidden_size, "layers": cfg.model.tiny_num_layers,
                "seed": warmup_seed(cfg), "steps": cfg.warmup.steps, "bs": cfg.warmup.batch_size, "lr": cfg.warmup.lr,
                "digits": cfg.data.arith_max_digits, "ops": cfg.data.arith_ops, "terms": cfg.data.arith_terms,
                "data_seed": cfg.data.arith_seed, "train_size": cfg.data.arith_train_size,
                "target": cfg.warmup.target_acc, "check_every": cfg.warmup.check_every,
                "max_new_tokens": cfg.rollout.max_new_tokens,
                "eval_size": cfg.data.eval_size}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def tiny_model_kwargs(cfg: Config) -> dict:
    h = cfg.model.tiny_hidden_size
    heads = h // 32
    kv = heads // 2 if heads % 2 == 0 else heads
    return dict(hidden_size=h, num_layers=cfg.model.tiny_num_layers, num_heads=heads, num_kv_heads=kv,
                intermediate_size=3 * h)


def sft_loss(model, ids: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of the response tokens of right-padded rows ``ids [B, T]``,
    from hidden states through ``linear_logprobs`` (no full logits tensor)."""
    from pacs_fast.causal_lm import decoder_body, lm_head
    from pacs_fast.ops.linear_logprobs import linear_logprobs

    hidden = decoder_body(model)(input_ids=ids, use_cache=False).last_hidden_state
    sel = response_mask[:, 1:] > 0
    head = lm_head(model)
    logp = linear_logprobs(hidden[:, :-1][sel], head.weight, ids[:, 1:][sel], bias=head.bias)
    return -logp.mean()


def probe_accuracy(model, tokenizer, records: list[dict], *, max_new_tokens: int, seed: int = 0) -> float:
    """Share of ``records`` whose one sample at temperature 1 (seeded) is exactly the reference
    response: the sampled accuracy the RL run's step-0 evaluation measures, on training problems."""
    from pacs_fast.rollout.base import SamplingParams
    from pacs_fast.rollout.hf import HFEngine

    was_training = model.training
    model.eval()
    engine = HFEngine(model, tokenizer, batch_size=len(records))
    prompts = [tokenizer.encode(r["prompt"], add_special_tokens=False) for r in records]
    comps = engine.generate(prompts, SamplingParams(n=1, temperature=1.0, max_new_tokens=max_new_tokens, seed=seed))
    model.train(was_training)
    return sum(cs[0].text.strip() == r["response"] for cs, r in zip(comps, records)) / max(len(records), 1)


def supervised_warmup(model, tokenizer, records: list[dict], *, steps: int, batch_size: int, lr: float,
                      seed: int, log=print, target_acc: float = 0.0, check_every: int = 10,
                      probe_size: int = 512, max_new_tokens: int = 12) -> int:
    """Teacher-forced training on ``prompt -> response + EOS`` for up to ``steps`` AdamW steps
    (linear warm-up over the first 10%, then linear decay to 10% of ``lr``).

    With ``target_acc > 0`` the training stops at the first check (every ``check_every`` steps,
    from ``2 * check_every`` on) where the mean of the last two :func:`probe_accuracy` values on the
    first ``probe_size`` records reaches ``target_acc``; those records are then left out of the
    training (when there are at least 4 x ``probe_size``), so the probe measures held-out accuracy.
    The warmed model's sampled accuracy then lands near the target whatever the seed (a fixed step
    count does not: docs/EFFICACY.md). Returns the steps taken."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warm = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * max(0.1, 1.0 - s / max(1, steps)))
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    probe, history = records[:probe_size], []
    if target_acc > 0 and len(records) >= 4 * probe_size:
        records = records[probe_size:]  # the probe problems are not trained on (no memorisation in the probe)
    encoded = [(tokenizer.encode(r["prompt"], add_special_tokens=False),
                tokenizer.encode(r["response"], add_special_tokens=False) + [eos]) for r in records]
    model.train()
    t0 = time.perf_counter()
    for step in range(steps):
        idx = torch.randint(len(encoded), (batch_size,), generator=gen).tolist()
        rows = [encoded[i] for i in idx]
        T = max(len(p) + len(r) for p, r in rows)
        ids = torch.full((batch_size, T), pad, dtype=torch.long)
        mask = torch.zeros((batch_size, T))
        for b, (p, r) in enumerate(rows):
            ids[b, :len(p) + len(r)] = torch.tensor(p + r)
            mask[b, len(p):len(p) + len(r)] = 1
        loss = sft_loss(model, ids, mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            log(f"warm-up step {step + 1}/{steps}  loss {loss.item():.3f}  ({time.perf_counter() - t0:.0f} s)")
        done = step + 1
        if target_acc > 0 and done >= 2 * check_every and done % check_every == 0:
            history.append(probe_accuracy(model, tokenizer, probe, max_new_tokens=max_new_tokens))
            acc = sum(history[-2:]) / len(history[-2:])  # two checks: one lucky draw does not stop it
            if acc >= target_acc:
                log(f"warm-up: sampled accuracy {acc:.3f} (mean of the last two checks) >= "
                    f"warmup.target_acc={target_acc} at step {done}")
                model.eval()
                return done
    if target_acc > 0 and not history:  # the first check comes at step 2 x check_every
        log(f"warning: the warm-up ran all warmup.steps={steps} steps without checking its accuracy: "
            f"warmup.check_every={check_every} puts the first check at step {2 * check_every}; lower it for "
            f"warmup.target_acc={target_acc} to stop the warm-up")
    elif target_acc > 0:
        log(f"warning: the warm-up did not reach warmup.target_acc={target_acc} in warmup.steps={steps} steps")
    model.eval()
    return steps


# what a warmed-up model folder holds (the weights, the config, the character tokenizer); a folder in the
# cache without one of them was renamed there by a build another process had emptied (before the builds' locks)
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer_config.json")


def is_complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in MODEL_FILES)


def default_model(cfg: Config, train_records: list[dict], *, log=print) -> Path:
    """Path of the (cached) warmed-up tiny model for ``cfg``; builds it on first use (under a temporary
    name and its lock, pacs_fast/folder_build.py: runs, containers and nodes may share the cache)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pacs_fast.data.tiny import make_tiny_model, save_model_here
    from pacs_fast.folder_build import build_folder, remove_dead_builds

    final = cache_root(cfg) / "warmup" / warmup_key(cfg)
    if final.parent.is_dir():  # a warm-up killed while writing left its temporary folder here
        remove_dead_builds(final.parent)
    if is_complete(final):
        log(f"using the cached warmed-up tiny model {final}")
        return final
    if final.exists():
        log(f"warning: the cached warmed-up model {final} lacks one of {', '.join(MODEL_FILES)}: built again")
        shutil.rmtree(final, ignore_errors=True)
    with build_folder(final) as tmp:
        seed = warmup_seed(cfg)
        make_tiny_model(tmp, seed=seed, **tiny_model_kwargs(cfg))
        if cfg.warmup.steps:
            log(f"supervised warm-up of the tiny model ({cfg.warmup.steps} steps; cached in {final})")
            model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(tmp)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                supervised_warmup(model, tokenizer, train_records, steps=cfg.warmup.steps,
                                  batch_size=cfg.warmup.batch_size, lr=cfg.warmup.lr, seed=seed, log=log,
                                  target_acc=cfg.warmup.target_acc, check_every=cfg.warmup.check_every,
                                  max_new_tokens=cfg.rollout.max_new_tokens)
            save_model_here(model, tmp)
            for f in Path(tmp).glob("*.safetensors"):  # (written 0600: readable as the folder's other files)
                default_mode(f)
        if not is_complete(tmp):  # never renamed into the cache without one (every later run would read it)
            missing = [name for name in MODEL_FILES if not (tmp / name).is_file()]
            raise RuntimeError(f"the warmed-up tiny model was written without {', '.join(missing)} ({tmp})")
    return final
