"""Rejects impossible settings before any model loads: a ValueError naming the key, on one line."""
from __future__ import annotations

from pathlib import Path

from pacs_fast.config.algorithm_checks import validate_loss_modes, validate_reset
from pacs_fast.config.launch_checks import validate_async, validate_parallel, world_size
from pacs_fast.config.paths import SHIPPED_DATASETS, validate_paths, warmup_cache_root, write_problem  # noqa: F401
from pacs_fast.config.prompt_template_checks import check_prompt_template
from pacs_fast.config.reward_fields import field_keywords
from pacs_fast.config.reward_specs import VERIFIER, checked_weights, is_mix, reward_specs, user_specs
from pacs_fast.config.schema import (ALGORITHMS, RECOMPUTE_GRANULARITIES, SPLIT_GROUPS, Config, field_types,
                                     section_classes)
from pacs_fast.config.stop_string_checks import check_stop_strings


# responses of one generation batch at most: batch b samples response j of prompt i with the seed
# batch_seed(b) + i * rollout.n + j, and consecutive batches' seeds lie this far apart (trainer/rollout_step.py)
MAX_BATCH_SAMPLES = 2 ** 20


def _choice(key: str, value: str, choices) -> None:
    if value not in choices:
        raise ValueError(f"{key} must be one of {', '.join(choices)}; got {value!r}")


ATTENTIONS = ("auto", "short", "sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")
MIN_TEMPERATURE = 0.01  # the lowest sampling temperature (vLLM warns of NaN below; the HF sampler's overflowed)
VLLM_MAX_TEMPERATURE = 2.0  # vLLM refuses a higher one, at its first generate (after every model had loaded)
# (key, lowest, highest, lowest allowed?, highest allowed?) for every float that has a range.
FLOAT_RANGES = (
    ("learner.lr", 0.0, 1.0, False, True), ("learner.eps", 0.0, 1.0, False, True),
    ("learner.weight_decay", 0.0, None, True, None), ("learner.grad_clip", 0.0, None, True, None),
    ("learner.critic_lr", 0.0, 1.0, False, True), ("warmup.lr", 0.0, 1.0, False, True),
    ("algo.beta", 0.0, None, False, None), ("algo.clip_low", 0.0, None, True, None),  # < 1 but cispo: _validate_clips
    ("algo.clip_high", 0.0, None, True, None), ("algo.kl_coef", 0.0, None, True, None),
    ("algo.kl_clamp", 0.0, None, True, None), ("learner.min_lr_ratio", 0.0, 1.0, True, True),
    ("algo.gamma", 0.0, 1.0, True, True), ("algo.lam", 0.0, 1.0, True, True),
    ("algo.vf_coef", 0.0, None, True, None), ("algo.value_clip", 0.0, None, True, None),
    ("algo.entropy_top_frac", 0.0, 1.0, False, True), ("algo.cov_frac", 0.0, 1.0, False, True),
    ("algo.cov_kl_coef", 0.0, None, True, None), ("algo.dro_beta", 0.0, None, True, None),
    ("algo.tau_pos", 0.0, None, False, None), ("algo.vespo_k_pos", 0.0, None, True, None),
    ("algo.vespo_k_neg", 0.0, None, True, None), ("algo.vespo_lambda_pos", 0.0, None, False, None),
    ("algo.vespo_lambda_neg", 0.0, None, False, None),
    ("algo.tau_neg", 0.0, None, False, None), ("model.lora_alpha", 0.0, None, True, None),
    ("rollout.temperature", MIN_TEMPERATURE, None, True, None), ("rollout.eval_temperature", 0.0, None, True, None),
    ("rollout.top_p", 0.0, 1.0, False, True), ("rollout.eval_top_p", 0.0, 1.0, False, True),
    ("rollout.min_p", 0.0, 1.0, True, False), ("rollout.eval_min_p", 0.0, 1.0, True, False),
    ("rollout.gpu_memory_utilization", 0.0, 1.0, False, True), ("reward.outcome_weight", 0.0, None, True, None),
    # timeouts at most 1e6 s (reward.verifier.MAX_TIME_LIMIT): 1e10 overflowed the OS timer and thread joins
    ("reward.user_fn_timeout_s", 0.0, 1e6, False, True), ("reward.overlong_penalty", 0.0, None, True, None),
    ("reward.time_limit_s", 0.0, 1e6, False, True),
)
FLOAT32_MAX = 3.4028234663852886e38
NONNEGATIVE_INTS = ("train.threads", "train.log_samples", "train.reward_workers", "train.eval_every",
                    "train.save_every", "warmup.steps", "algo.reset_every", "rollout.top_k", "rollout.eval_top_k",
                    "learner.lr_warmup_steps")


# apply_chat_template's own arguments and what it hands the template itself (the messages, tools, documents, the
# special tokens): not variables of data.chat_template_kwargs / --chat-template-kwargs
RESERVED_TEMPLATE_KWARGS = ("conversation", "tokenize", "add_generation_prompt", "continue_final_message",
                            "return_dict", "return_tensors", "padding", "truncation", "max_length",
                            "tokenizer_kwargs", "return_assistant_tokens_mask", "chat_template", "messages",
                            "conversations", "tools", "documents", "bos_token", "eos_token", "unk_token", "pad_token",
                            "sep_token", "cls_token", "mask_token", "additional_special_tokens")


def check_template_kwargs(kwargs, key: str) -> dict:
    """``kwargs`` as the chat template's variables (``{"enable_thinking": False}``), or a ValueError naming ``key``:
    a mapping of names that are not :data:`RESERVED_TEMPLATE_KWARGS`."""
    if not isinstance(kwargs, dict):
        raise ValueError(f"{key} must be a mapping of the chat template's variables, e.g. {{enable_thinking: "
                         f"false}}, got {kwargs!r}")
    bad = [k for k in kwargs if not isinstance(k, str) or not k.isidentifier() or k in RESERVED_TEMPLATE_KWARGS]
    if bad:
        own = ", ".join(RESERVED_TEMPLATE_KWARGS[:4])
        raise ValueError(f"{key}: {bad[0]!r} is not a chat template variable (names such as enable_thinking; "
                         f"apply_chat_template's own arguments, {own}, ..., and what it hands the template, "
                         f"messages, tools, the special tokens, are set by the prompt builder)")
    return dict(kwargs)

def _get(cfg: Config, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def _validate_numbers(cfg: Config) -> None:
    """Every float finite (NaN / inf name their key), every ranged value in its range."""
    import math

    for section, cls in section_classes().items():
        for name, typ in field_types(cls).items():
            v = getattr(getattr(cfg, section), name)
            if typ is float and not math.isfinite(v):
                raise ValueError(f"{section}.{name} must be a finite number, got {v}")
            if typ is float and abs(v) > FLOAT32_MAX:  # training computes in float32: 1e39 became inf there
                raise ValueError(f"{section}.{name}={v:g} is beyond float32's range (|x| <= 3.4e38), in which the run "
                                 f"computes")
    for key, lo, hi, lo_ok, hi_ok in FLOAT_RANGES:
        v = _get(cfg, key)
        bad_lo = v < lo if lo_ok else v <= lo
        bad_hi = hi is not None and (v > hi if hi_ok else v >= hi)
        if bad_lo or bad_hi:
            interval = f"{'[' if lo_ok else '('}{lo:g}, {'inf)' if hi is None else f'{hi:g}' + (']' if hi_ok else ')')}"
            raise ValueError(f"{key} must be in {interval}, got {v}")
    for key in ("rollout.temperature", "rollout.eval_temperature") if cfg.rollout.engine == "vllm" else ():
        if _get(cfg, key) > VLLM_MAX_TEMPERATURE:
            raise ValueError(f"{key} must be <= {VLLM_MAX_TEMPERATURE:g} with rollout.engine=vllm (vLLM samples at "
                             f"temperatures in [0, {VLLM_MAX_TEMPERATURE:g}]), got {_get(cfg, key)}")
    if 0 < cfg.rollout.eval_temperature < MIN_TEMPERATURE:
        raise ValueError(f"rollout.eval_temperature must be 0 (greedy) or >= {MIN_TEMPERATURE:g}, got "
                         f"{cfg.rollout.eval_temperature}")
    for key in NONNEGATIVE_INTS:
        if _get(cfg, key) < 0:
            raise ValueError(f"{key} must be >= 0, got {_get(cfg, key)}")
    betas = cfg.learner.betas
    if (len(betas) != 2 or not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in betas)
            or not all(math.isfinite(b) and 0 <= b < 1 for b in betas)):
        raise ValueError(f"learner.betas must be two numbers in [0, 1), got {betas}")
    if cfg.model.tiny_num_layers < 1 or cfg.model.tiny_hidden_size < 32:
        raise ValueError(f"model.tiny_num_layers must be >= 1 and model.tiny_hidden_size >= 32, got "
                         f"{cfg.model.tiny_num_layers}, {cfg.model.tiny_hidden_size}")
    if not 1 <= cfg.warmup.batch_size <= 1 << 16:
        raise ValueError(f"warmup.batch_size must be in 1..65536, got {cfg.warmup.batch_size}")
    for lr_key in ("learner.lr", "learner.critic_lr"):  # AdamW multiplies the weights by 1 - lr x weight_decay
        decay = _get(cfg, lr_key) * cfg.learner.weight_decay
        if decay >= 1 and (lr_key == "learner.lr" or cfg.algo.name == "ppo"):
            raise ValueError(f"{lr_key} x learner.weight_decay = {decay:g} >= 1: AdamW multiplies every weight by "
                             f"1 - {decay:g} <= 0 each step; lower learner.weight_decay (0.01-0.1 is usual)")


def _validate_cuda(cfg: Config) -> None:
    what = _needs_cuda(cfg)
    if what:
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"{what} needs a CUDA GPU, and none is available here; use learner.logprob_backend="
                             f"auto / model.device=auto")


def _needs_cuda(cfg: Config) -> str | None:
    """The key that asks for CUDA, if any (model.device=cuda, learner.logprob_backend=triton)."""
    if cfg.model.device == "cuda":
        return "model.device=cuda"
    if cfg.learner.logprob_backend == "triton":
        return "learner.logprob_backend=triton (compiled Triton kernels)"
    return None


def _validate_micro_batching(cfg: Config) -> None:
    """learner.max_tokens_per_micro_batch must hold the largest group the rollout settings allow
    (checked here, before any model loads); learner.distributed_optimizer is megatron's."""
    budget = cfg.learner.max_tokens_per_micro_batch
    if budget < 0:
        raise ValueError(f"learner.max_tokens_per_micro_batch must be >= 0 (0 = off), got {budget}")
    if cfg.learner.distributed_optimizer and cfg.learner.backend != "megatron":
        raise ValueError("learner.distributed_optimizer=true shards the optimiser over data-parallel ranks, which "
                         "only learner.backend=megatron has (the torch learner is one process)")
    # the real prompts are checked once tokenised (pacs_fast.trainer.problems.check_token_budget);
    # here only what no data can fit: a group of n one-token prompts with full-length responses
    _choice("learner.split_groups", cfg.learner.split_groups, SPLIT_GROUPS)
    if splits_groups(cfg):  # a group over the budget trains a few rows at a time: a row must fit
        if budget and budget < 1 + cfg.rollout.max_new_tokens:
            raise ValueError(f"learner.max_tokens_per_micro_batch={budget} cannot hold one full-length response: a "
                             f"prompt of at least 1 token + rollout.max_new_tokens={cfg.rollout.max_new_tokens}")
        return
    smallest = cfg.rollout.n * (1 + cfg.rollout.max_new_tokens)
    if budget and budget < smallest:
        raise ValueError(f"learner.max_tokens_per_micro_batch={budget} cannot hold a group of full-length responses: "
                         f"rollout.n={cfg.rollout.n} x (a prompt of at least 1 token + rollout.max_new_tokens="
                         f"{cfg.rollout.max_new_tokens}) = {smallest} tokens ({whole_groups_why(cfg)})")


def splits_groups(cfg: Config) -> bool:
    """Whether a group over learner.max_tokens_per_micro_batch trains a few rows at a time (learner.split_groups=auto):
    not with LoRA dropout, which draws other masks in its rows' two forwards (the torch learner's update refuses it)."""
    return cfg.learner.split_groups == "auto" and not (cfg.model.lora_rank > 0 and cfg.model.lora_dropout > 0)


def whole_groups_why(cfg: Config) -> str:
    """Why a micro-batch must hold a group (``not splits_groups(cfg)``), for the errors that say so."""
    return ("learner.split_groups=off" if cfg.learner.split_groups == "off" else
            f"model.lora_dropout={cfg.model.lora_dropout}: a group over the budget cannot train a few rows at a time")


def is_level(cfg: Config) -> str:
    """``correction.is_level`` with ``auto`` resolved (none when synchronous; per sequence for the
    objectives whose term is per sequence: PACS's score, GSPO's sequence ratio)."""
    if cfg.correction.is_level != "auto":
        return cfg.correction.is_level
    if cfg.rollout.max_staleness == 0:
        return "none"
    return "sequence" if cfg.algo.name in ("pacs", "gspo") else "token"


def _validate_correction(cfg: Config) -> None:
    """correction.*: levels per algorithm (PACS's score is per sequence), a positive cap, bounds around 1."""
    c, pacs = cfg.correction, cfg.algo.name == "pacs"
    why = " (algo.name=pacs: its score is per sequence, docs/OFF_POLICY.md)" if pacs else ""
    for key, value, choices in (("is_level", c.is_level, ("auto", "none", "token", "sequence")),
                                ("rs_level", c.rs_level, ("none", "token", "sequence", "geometric"))):
        allowed = [x for x in choices if not (pacs and x == "token")]
        if value not in allowed:
            raise ValueError(f"correction.{key} must be one of {', '.join(allowed)}{why}; got {value!r}")
    if not c.is_cap > 0:
        raise ValueError(f"correction.is_cap must be > 0, got {c.is_cap}")
    if not 0 <= c.rs_low <= 1 <= c.rs_high:
        raise ValueError(f"correction.rs_low={c.rs_low} and correction.rs_high={c.rs_high} must satisfy "
                         f"0 <= rs_low <= 1 <= rs_high (a ratio of 1, no mismatch, is always kept)")
    if c.rs_low == c.rs_high:
        raise ValueError(f"correction.rs_low and correction.rs_high are both {c.rs_low}: the band [rs_low, rs_high] "
                         f"then keeps only ratios of exactly 1 and rejects every token with any mismatch; widen it "
                         f"(e.g. rs_low=0.999 rs_high=1.001), or set correction.rs_level=none to reject nothing")


def _validate_efficacy(cfg: Config) -> None:
    """The built-in task's family, the warm-up seed, label noise and its corrections."""
    if not 2 <= cfg.data.arith_terms <= 4:
        raise ValueError(f"data.arith_terms must be in 2..4, got {cfg.data.arith_terms}")
    if cfg.warmup.seed < -1:
        raise ValueError(f"warmup.seed must be >= 0 (or -1 = train.seed), got {cfg.warmup.seed}")
    # the seeds feed numpy (< 2**32) and torch generators (int64, after the sampler's seed * 1,000,003 + epoch)
    for key in ("train.seed", "warmup.seed", "data.arith_seed", "data.split_seed"):
        v = _get(cfg, key)
        if not (-1 if key == "warmup.seed" else 0) <= v < 2**32:
            also = " (or -1 = train.seed)" if key == "warmup.seed" else ""
            raise ValueError(f"{key} must be in 0..{2**32 - 1}{also}, got {v}")
    if not 0.0 <= cfg.warmup.target_acc < 1.0 or cfg.warmup.check_every < 1:
        raise ValueError(f"warmup.target_acc must be in [0, 1) and warmup.check_every >= 1, got "
                         f"{cfg.warmup.target_acc}, {cfg.warmup.check_every}")
    _choice("algo.noise_correction", cfg.algo.noise_correction, ("none", "backward", "forward"))
    _choice("reward.fn_rate", cfg.reward.fn_rate, ("fixed", "appeal"))
    _choice("reward.extraction", cfg.reward.extraction, ("reference", "boxed", "answer_tag"))
    for key in ("reward.noise_fp", "reward.noise_fn", "algo.noise_rho0", "algo.noise_rho1"):
        s, k = key.split(".")
        v = getattr(getattr(cfg, s), k)
        if not 0.0 <= v < 1.0:
            raise ValueError(f"{key} must be in [0, 1), got {v}")
    for a, b in (("reward.noise_fp", "reward.noise_fn"), ("algo.noise_rho0", "algo.noise_rho1")):
        va, vb = (getattr(getattr(cfg, x.split(".")[0]), x.split(".")[1]) for x in (a, b))
        if va + vb >= 1.0:
            raise ValueError(f"{a} + {b} must be < 1 (got {va} + {vb}): the labels would carry no signal")
    if cfg.algo.entropy_top_frac < 1.0 and cfg.algo.name == "pacs":
        raise ValueError(f"algo.entropy_top_frac={cfg.algo.entropy_top_frac:g} selects tokens of a per-token policy "
                         f"gradient (the baselines'); PACS's score sums the log-ratio of every response token, with "
                         f"no per-token term to select: use algo.entropy_top_frac=1 with algo.name=pacs")
    if cfg.reward.fn_rate == "appeal" and not cfg.reward.appeal:
        raise ValueError("reward.fn_rate=appeal needs reward.appeal='module:function' (the lenient second check)")
    if cfg.reward.appeal and ":" not in cfg.reward.appeal:
        raise ValueError(f"reward.appeal must look like 'module:function', got {cfg.reward.appeal!r}")
    if is_mix(cfg.reward.fn, cfg.reward.fn_weights):
        checked_weights(cfg.reward.fn, cfg.reward.fn_weights)
    elif reward_specs(cfg.reward.fn) and reward_specs(cfg.reward.fn)[0] != VERIFIER and ":" not in cfg.reward.fn:
        raise ValueError(f"reward.fn must look like 'module:function', got {cfg.reward.fn!r}")
    if is_mix(cfg.reward.fn, cfg.reward.fn_weights) and (cfg.reward.noise_fp or cfg.reward.noise_fn):
        raise ValueError("reward.noise_fp / reward.noise_fn flip 0 / 1 labels; a mix of rewards in reward.fn gives "
                         "weighted sums (soft rewards): use one reward, or no label noise")
    if cfg.reward.fn_fields:
        field_keywords(cfg.reward.fn_fields, "reward.fn_fields")
        if not user_specs(cfg.reward.fn):
            raise ValueError("reward.fn_fields hands dataset fields to reward.fn; set reward.fn='module:function' "
                             "(the math verifier reads no fields)")
        if cfg.data.dataset == "arithmetic":
            raise ValueError("reward.fn_fields reads fields of data.dataset's rows; the built-in arithmetic task "
                             "has none (give a dataset file)")
    if cfg.algo.noise_correction != "none" and cfg.algo.name == "ppo":
        raise ValueError("algo.noise_correction applies to pacs, grpo, rloo and dr_grpo (ppo's rewards go "
                         "through GAE; not supported)")
    if cfg.algo.noise_correction != "none" and cfg.algo.name.startswith("reinforce_plus_plus"):
        raise ValueError(f"algo.noise_correction applies to pacs, grpo, rloo and dr_grpo ({cfg.algo.name} whitens "
                         f"its rewards over the whole step; not supported)")
    if cfg.algo.noise_correction != "none" and cfg.algo.name == "gpg":
        raise ValueError("algo.noise_correction applies to pacs, grpo, rloo and dr_grpo (gpg scales its advantages "
                         "by the step's count of non-zero rewards; not supported)")
    _choice("algo.credit", cfg.algo.credit, ("min", "sum"))
    if cfg.reward.step_rewards:
        if ":" not in cfg.reward.step_rewards:
            raise ValueError(f"reward.step_rewards must look like 'module:function', got {cfg.reward.step_rewards!r}")
        if cfg.algo.name != "rloo":
            raise ValueError(f"reward.step_rewards (process rewards) needs algo.name=rloo (PURE's leave-one-out "
                             f"advantages), got algo.name={cfg.algo.name}")
        if cfg.algo.noise_correction != "none":
            raise ValueError("reward.step_rewards cannot be combined with algo.noise_correction (the correction "
                             "applies to outcome-only rewards)")
        if not cfg.reward.step_split:
            raise ValueError("reward.step_split must not be empty (it marks where a step ends)")


def _validate_clips_and_overlong(cfg: Config) -> None:
    """algo.clip_low < 1 (the ratio's lower bound 1 - clip_low stays > 0) except for cispo, whose
    clip_low >= 1 means no lower bound on its IS weight; reward.overlong_buffer_len within the
    response length (verl's DAPO reward manager asserts 0 < buffer <= max_resp_len)."""
    if cfg.algo.clip_low >= 1 and cfg.algo.name not in ("cispo", "gmpo", "kl_cov", "sapo", "dppo_tv", "dppo_kl",
                                                         "dro", "vespo", "gpg"):  # (the last three clip nothing)
        raise ValueError(f"algo.clip_low must be in [0, 1) (the ratio's lower bound is 1 - clip_low; only "
                         f"algo.name=cispo takes >= 1, no lower bound, gmpo, whose bound is on the log-ratio, and "
                         f"dppo_tv / dppo_kl, whose bound is on a divergence), got {cfg.algo.clip_low}")
    buffer, max_new = cfg.reward.overlong_buffer_len, cfg.rollout.max_new_tokens
    if buffer < 0:
        raise ValueError(f"reward.overlong_buffer_len must be >= 0 (0 = off), got {buffer}")
    if buffer > max_new:
        raise ValueError(f"reward.overlong_buffer_len={buffer} must be <= rollout.max_new_tokens={max_new} (the "
                         f"penalty starts at max_new_tokens - overlong_buffer_len tokens)")


def _validate_lora(cfg: Config) -> None:
    """``model.lora_*``: a rank >= 0, the torch learner, PEFT installed (before any model loads)."""
    m = cfg.model
    if m.lora_rank < 0:
        raise ValueError(f"model.lora_rank must be >= 0 (0 = no adapters), got {m.lora_rank}")
    if not m.lora_rank:
        return
    if cfg.learner.backend == "megatron":
        raise ValueError("model.lora_rank trains LoRA adapters in the torch learner; learner.backend=megatron trains "
                         "the whole model (set model.lora_rank=0, or learner.backend=torch)")
    if not (0.0 <= m.lora_dropout < 1.0):
        raise ValueError(f"model.lora_dropout must be in [0, 1), got {m.lora_dropout}")
    if not m.lora_target_modules.strip(" ,"):
        raise ValueError("model.lora_target_modules is empty: all-linear, or module names (q_proj,v_proj)")
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        raise ValueError("model.lora_rank needs PEFT, which is not installed: pip install 'pacs_fast[lora]'")


def validate(cfg: Config, *, world: int | None = None, new_run: bool = True) -> None:
    """Rejects impossible settings with a ValueError naming the key. Checks files exist, not their content.

    ``world``: the number of processes of the launch (default: ``WORLD_SIZE`` from the environment,
    1 without torchrun); checked against ``learner.backend`` / ``learner.tp_size`` / the batch sizes.
    """
    _choice("algo.name", cfg.algo.name, ALGORITHMS)
    _choice("algo.proxy", cfg.algo.proxy, ("logratio", "mean_logp"))
    _choice("algo.score", cfg.algo.score, ("rloo", "grpo", "dr_grpo", "naive"))
    _choice("algo.weight", cfg.algo.weight, ("question", "none", "only_positive", "only_negative"))
    _choice("algo.ref", cfg.algo.ref, ("rollout", "fixed"))
    _choice("algo.kl_estimator", cfg.algo.kl_estimator, ("k1", "k2", "k3", "k1+", "k3+"))
    _choice("learner.lr_schedule", cfg.learner.lr_schedule, ("constant", "linear", "cosine"))
    check_template_kwargs(cfg.data.chat_template_kwargs, "data.chat_template_kwargs")
    check_prompt_template(cfg.data.prompt_template, "data.prompt_template")
    check_stop_strings(cfg.rollout.stop, "rollout.stop")
    if cfg.algo.kl_clamp and cfg.algo.kl_estimator not in ("k3", "k3+"):
        raise ValueError(f"algo.kl_clamp bounds the k3 (and k3+) estimate (verl's low_var_kl); algo.kl_estimator="
                         f"{cfg.algo.kl_estimator} takes none (set algo.kl_clamp=0)")
    _choice("algo.loss_agg", cfg.algo.loss_agg, ("auto", "token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                                 "seq-mean-token-sum-norm", "token-sum", "token-sum-norm"))
    _choice("rollout.engine", cfg.rollout.engine, ("hf", "vllm"))
    _choice("rollout.dtype", cfg.rollout.dtype, ("auto", "float32", "bfloat16"))
    _choice("learner.backend", cfg.learner.backend, ("torch", "megatron"))
    _choice("learner.logprob_backend", cfg.learner.logprob_backend, ("auto", "triton", "torch"))
    if cfg.model.dtype == "float16":
        raise ValueError("model.dtype=float16 cannot train here: the learner has no loss scaling, so float16's "
                         "range (6e-8 to 65,504) loses small gradients to underflow and can overflow large "
                         "activations (fp32 master weights keep only the update's digits; without them AdamW's "
                         "eps=1e-8 is 0 in float16 too); use bfloat16 (or float32)")
    _choice("model.dtype", cfg.model.dtype, ("float32", "bfloat16"))
    _choice("model.device", cfg.model.device, ("auto", "cpu", "cuda"))
    _choice("model.attention", cfg.model.attention, ATTENTIONS)
    _choice("learner.packing", cfg.learner.packing, ("auto", "on", "off"))
    _choice("learner.packed_attention", cfg.learner.packed_attention, ("auto", "varlen", "dense"))
    _choice("learner.fused_layers", cfg.learner.fused_layers, ("auto", "on", "off"))
    _choice("model.recompute_granularity", cfg.model.recompute_granularity, RECOMPUTE_GRANULARITIES)
    _validate_micro_batching(cfg)
    _validate_numbers(cfg)
    if cfg.rollout.dtype not in ("auto", cfg.model.dtype) and cfg.rollout.engine == "hf" and \
            cfg.learner.backend == "torch" and not cfg.rollout.ranks:
        raise ValueError(f"rollout.dtype={cfg.rollout.dtype}: with rollout.engine=hf the torch learner's engine samples "
                         f"with the learner's own model (model.dtype={cfg.model.dtype}); an engine of its own comes "
                         f"with rollout.engine=vllm, learner.backend=megatron or rollout.ranks >= 1, else leave "
                         f"rollout.dtype=auto")
    # (as pacs_fast.trainer.build.engine_dtypes resolves auto: an HF engine in model.dtype)
    engine_fp32 = cfg.rollout.dtype == "float32" or (cfg.rollout.engine == "hf" and cfg.rollout.dtype == "auto")
    if cfg.model.lm_head_fp32 and cfg.model.dtype == "float32" and engine_fp32:
        raise ValueError(f"model.lm_head_fp32=true has nothing to upcast: model.dtype=float32 with rollout.engine="
                         f"{cfg.rollout.engine} and rollout.dtype={cfg.rollout.dtype} computes the LM head in fp32 "
                         f"already (it applies to bfloat16 models, or a bf16 engine)")
    _validate_correction(cfg)

    G = cfg.rollout.n
    name = cfg.algo.name
    if G < 1:
        raise ValueError(f"rollout.n must be >= 1, got {G}")
    # PACS's scores that need a group: algorithms.pacs.GROUP_SCORES (a layer above)
    needs_group = (name in ("grpo", "rloo", "dr_grpo", "gspo", "cispo", "clip_cov", "kl_cov", "gmpo", "sapo",
                            "dppo_tv", "dppo_kl", "dro", "vespo")
                   or (name == "pacs" and cfg.algo.score in ("rloo", "grpo", "dr_grpo")))
    if needs_group and G < 2:
        what = f"algo.score={cfg.algo.score}" if name == "pacs" else f"algo.name={name}"
        raise ValueError(f"rollout.n must be >= 2 for {what} (group-relative baselines need several responses "
                         f"per prompt), got {G}")
    if cfg.rollout.filter_groups and G < 2:
        raise ValueError(f"rollout.filter_groups=true needs rollout.n >= 2, got {G}: it keeps the groups whose "
                         f"rewards differ, and a group of one response never does")
    for key in ("train.steps", "train.prompts_per_step", "learner.mini_batch_prompts",
                "learner.micro_batch_prompts", "learner.epochs", "rollout.max_new_tokens", "rollout.eval_n",
                "data.max_prompt_tokens", "learner.tp_size", "data.eval_size"):
        s, k = key.split(".")
        if getattr(getattr(cfg, s), k) < 1:
            raise ValueError(f"{key} must be >= 1, got {getattr(getattr(cfg, s), k)}")
    if cfg.train.keep_checkpoints < 1:
        raise ValueError(f"train.keep_checkpoints must be >= 1, got {cfg.train.keep_checkpoints}")
    P, mini, micro = cfg.train.prompts_per_step, cfg.learner.mini_batch_prompts, cfg.learner.micro_batch_prompts
    if P * G > MAX_BATCH_SAMPLES:
        raise ValueError(f"train.prompts_per_step x rollout.n = {P} x {G} = {P * G:,} responses per generation batch, "
                         f"more than {MAX_BATCH_SAMPLES:,}: consecutive batches would sample with the same seeds")
    if P % mini:
        raise ValueError(f"learner.mini_batch_prompts={mini} must divide train.prompts_per_step={P} "
                         f"(mini-batches keep whole groups)")
    if mini % micro and not cfg.learner.max_tokens_per_micro_batch:  # (a token budget cuts instead)
        raise ValueError(f"learner.micro_batch_prompts={micro} must divide learner.mini_batch_prompts={mini}")
    n_proc = world_size() if world is None else world
    validate_async(cfg, n_proc)
    validate_parallel(cfg, n_proc - cfg.rollout.ranks if cfg.rollout.ranks else n_proc)  # the learner's own processes
    _validate_lora(cfg)
    if not (cfg.algo.clip_c == 0 or 1 < cfg.algo.clip_c < float("inf")):  # NaN fails both
        raise ValueError(f"algo.clip_c (the dual clip; dppo_tv / dppo_kl: the ratio's truncation) must be > 1 and "
                         f"finite, or 0 (off), got {cfg.algo.clip_c}")
    if cfg.algo.ref == "fixed" and name != "pacs":
        raise ValueError("algo.ref applies to algo.name=pacs; baselines use algo.kl_coef for a fixed reference")
    if cfg.algo.ref == "fixed" and cfg.algo.proxy == "mean_logp":
        raise ValueError("algo.ref=fixed needs algo.proxy=logratio: algo.proxy=mean_logp (r = beta * mean log pi) "
                         "uses no reference policy")
    validate_reset(cfg)
    validate_loss_modes(cfg)
    _validate_clips_and_overlong(cfg)
    _validate_cuda(cfg)
    validate_paths(cfg, new_run=new_run)
    _validate_efficacy(cfg)
    if cfg.data.dataset == "arithmetic":
        if not 1 <= cfg.data.arith_max_digits <= 9:
            raise ValueError(f"data.arith_max_digits must be in 1..9, got {cfg.data.arith_max_digits}")
        if (not cfg.data.arith_ops or set(cfg.data.arith_ops) - set("+-*")
                or len(set(cfg.data.arith_ops)) != len(cfg.data.arith_ops)):
            raise ValueError(f"data.arith_ops must be a non-empty subset of '+-*', each operator once, got "
                             f"{cfg.data.arith_ops!r}")
        if cfg.data.arith_train_size < 1:
            raise ValueError(f"data.arith_train_size must be >= 1, got {cfg.data.arith_train_size}")
        # the family's distinct problems (pacs_fast.data.arithmetic draws them)
        total = len(set(cfg.data.arith_ops)) ** (cfg.data.arith_terms - 1) * 10 ** (cfg.data.arith_max_digits
                                                                                    * cfg.data.arith_terms)
        if cfg.data.eval_size >= total:
            raise ValueError(f"data.eval_size={cfg.data.eval_size} leaves no training problems: the built-in task "
                             f"with data.arith_max_digits={cfg.data.arith_max_digits}, data.arith_ops="
                             f"{cfg.data.arith_ops!r} and data.arith_terms={cfg.data.arith_terms} has {total}")
    if cfg.model.tiny_hidden_size % 32:
        raise ValueError(f"model.tiny_hidden_size must be a multiple of 32 (head size 32), got "
                         f"{cfg.model.tiny_hidden_size}")
