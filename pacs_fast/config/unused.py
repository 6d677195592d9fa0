"""Settings that a run's other settings make have no effect: a warning each, never an error.

``algo.clip_high=0.28`` with ``algo.name=pacs`` (PACS clips no ratio), ``algo.score=naive`` with a
baseline, ``data.eval_dataset`` with the built-in task: each is a value the user chose (it differs
from the default) that the run then never reads. They are warnings, not errors, so that one config
file can serve several algorithms (``python -m pacs_fast.experiment`` runs the same settings under
every arm). Combinations that cannot run at all are :func:`~pacs_fast.config.validate`'s.
"""
from __future__ import annotations

from pacs_fast.config.loading import default_micro_batch_prompts
from pacs_fast.config.prompt_template_checks import names
from pacs_fast.config.reward_specs import is_mix, uses_verifier
from pacs_fast.config.schema import Config
from pacs_fast.config.validation import _get, is_level

PACS_ONLY = ("algo.beta", "algo.proxy", "algo.score", "algo.weight")
BASELINES_ONLY = ("algo.clip_low", "algo.clip_high", "algo.clip_c", "algo.kl_coef", "algo.kl_estimator",
                  "algo.kl_clamp")
PPO_ONLY = ("algo.lam", "algo.vf_coef", "algo.value_clip", "learner.critic_lr")
PROCESS_REWARDS_ONLY = ("algo.credit", "reward.step_split", "reward.outcome_weight")
TINY_MODEL_ONLY = ("model.tiny_hidden_size", "model.tiny_num_layers", "warmup.steps", "warmup.batch_size",
                   "warmup.lr", "warmup.target_acc", "warmup.check_every", "warmup.seed")
ARITHMETIC_ONLY = ("data.arith_max_digits", "data.arith_ops", "data.arith_train_size", "data.arith_terms",
                   "data.arith_seed")
FILE_DATASETS_ONLY = ("data.eval_dataset", "data.problem_key", "data.answer_key", "data.split_seed")
PROMPT_KEYS = ("data.system_prompt", "data.instruction", "data.prompt_template")


def idle_rules(cfg: Config) -> list[tuple[tuple[str, ...], str]]:
    """(keys, why they have no effect) for each condition of ``cfg`` under which those keys are not read."""
    a, name = cfg.algo, cfg.algo.name
    out = []
    if name != "pacs":
        out.append((PACS_ONLY, f"with algo.name={name} (PACS's settings)"))
        if not a.kl_coef:
            out.append((("algo.kl_estimator", "algo.kl_clamp"), "with algo.kl_coef=0 (no KL penalty)"))
    else:
        out.append((BASELINES_ONLY, "with algo.name=pacs (the baselines' ratio clipping and KL penalty)"))
        if a.entropy_coef == 0:
            out.append((("algo.loss_agg",), "with algo.name=pacs and algo.entropy_coef=0 (it aggregates the "
                                            "baselines' token losses and the entropy bonus only)"))
    if not a.reset_every:
        out.append((("algo.reset_optimizer", "algo.reset_mix"), "with algo.reset_every=0 (the reference is never "
                                                                 "reset)"))
    if name in ("gspo", "cispo", "clip_cov", "gmpo"):
        out.append((("algo.clip_c",), f"with algo.name={name} (PPO's dual clip; {name} has none, as in verl)"))
    if name in ("kl_cov", "sapo", "gpg", "dro", "vespo"):
        out.append((("algo.clip_low", "algo.clip_high", "algo.clip_c"), f"with algo.name={name} (it clips no "
                                                                        f"ratio, as in verl)"))
    if name != "vespo":
        out.append((("algo.vespo_k_pos", "algo.vespo_lambda_pos", "algo.vespo_k_neg", "algo.vespo_lambda_neg"),
                    f"with algo.name={name} (VESPO's Gamma weight)"))
    if name != "dro":
        out.append((("algo.dro_beta",), f"with algo.name={name} (DRO's penalty coefficient)"))
    if name != "sapo":
        out.append((("algo.tau_pos", "algo.tau_neg"), f"with algo.name={name} (SAPO's gate temperatures)"))
    if name not in ("clip_cov", "kl_cov"):
        out.append((("algo.cov_frac",), f"with algo.name={name} (Clip-Cov's / KL-Cov's share of the tokens)"))
    if name != "clip_cov":
        out.append((("algo.cov_low", "algo.cov_high"), f"with algo.name={name} (Clip-Cov's band of covariance)"))
    if name != "kl_cov":
        out.append((("algo.cov_kl_coef",), f"with algo.name={name} (KL-Cov's coefficient)"))
    if cfg.learner.lr_schedule == "constant":
        out.append((("learner.min_lr_ratio",), "with learner.lr_schedule=constant (the floor of a decay)"))
    if not cfg.model.lora_rank:
        out.append((("model.lora_alpha", "model.lora_dropout", "model.lora_target_modules"),
                    "with model.lora_rank=0 (no LoRA adapters)"))
    if not uses_verifier(cfg.reward.fn):
        out.append((("reward.extraction", "reward.time_limit_s", "train.reward_workers"),
                    "with reward.fn (the math verifier's settings; the user's function scores every response)"))
    if not is_mix(cfg.reward.fn, cfg.reward.fn_weights):
        out.append((("reward.fn_weights",), "without a list in reward.fn (it weighs a mix of rewards)"))
    if not cfg.reward.overlong_buffer_len:
        out.append((("reward.overlong_penalty",), "with reward.overlong_buffer_len=0 (no overlong shaping)"))
    elif not cfg.reward.overlong_penalty:  # every penalty is -(...) * 0: the rewards that train are the verifier's
        out.append((("reward.overlong_buffer_len",), "with reward.overlong_penalty=0 (the penalty's scale: no "
                                                     "response is penalised)"))
    if name != "ppo":
        out.append((PPO_ONLY, f"with algo.name={name} (PPO's value head and GAE)"))
        if not (cfg.reward.step_rewards and a.credit == "sum"):
            out.append((("algo.gamma",), f"with algo.name={name} (the discount of PPO and of process rewards "
                                         f"with algo.credit=sum)"))
    if not cfg.reward.step_rewards:
        out.append((PROCESS_REWARDS_ONLY, "without reward.step_rewards (process rewards)"))
    if a.noise_correction == "none":
        out.append((("algo.noise_rho0", "algo.noise_rho1", "reward.fn_rate"),
                    "with algo.noise_correction=none (the noisy-label correction reads the rates)"))
    if is_level(cfg) == "none":
        out.append((("correction.is_cap", "correction.fused"), "with correction.is_level resolving to none"))
    if cfg.rollout.temperature != 1.0 or cfg.correction.rs_level != "none":
        out.append((("correction.fused",), "with rollout.temperature != 1 or correction.rs_level set (the "
                                           "correction needs a forward of its own then)"))
    if name == "ppo":
        out.append((("correction.fused",), "with algo.name=ppo (its learner computes the old log-probs in a pass "
                                           "of their own: nothing to fuse)"))
    if cfg.correction.rs_level == "none":
        out.append((("correction.rs_low", "correction.rs_high"), "with correction.rs_level=none"))
    if cfg.rollout.eval_temperature == 0:
        out.append((("rollout.eval_top_p", "rollout.eval_top_k", "rollout.eval_min_p", "rollout.eval_n"),
                    "with rollout.eval_temperature=0 (greedy decoding: one response per problem)"))
    if not cfg.rollout.filter_groups:
        out.append((("rollout.max_gen_batches",), "without rollout.filter_groups (dynamic sampling)"))
    if cfg.rollout.engine != "vllm":
        out.append((("rollout.gpu_memory_utilization",), f"with rollout.engine={cfg.rollout.engine} (vLLM's)"))
    if cfg.learner.backend != "torch":
        out.append((("learner.shared_prefix",), f"with learner.backend={cfg.learner.backend} (the torch learner's)"))
        if cfg.rollout.engine == "vllm":
            out.append((("model.attention",), f"with learner.backend={cfg.learner.backend} and rollout.engine=vllm "
                                              f"(it sets the Hugging Face models' attention)"))
    if cfg.learner.backend != "megatron" or cfg.learner.tp_size <= 1:
        out.append((("learner.sequence_parallel",), "without learner.backend=megatron at learner.tp_size > 1 (it "
                                                    "splits what tensor parallelism leaves whole)"))
    if cfg.model.dtype == "float32":
        out.append((("learner.master_weights",), "with model.dtype=float32 (the weights are fp32 already)"))
    if cfg.model.gradient_checkpointing and cfg.model.recompute_granularity == "full":
        out.append((("learner.shared_prefix",), "with model.gradient_checkpointing=true (the shared-prefix "
                                                "forward is not used then; it is with "
                                                "model.recompute_granularity=selective)"))
    if not cfg.model.gradient_checkpointing:
        out.append((("model.recompute_granularity",), "without model.gradient_checkpointing=true"))
    if cfg.learner.packing == "on":
        out.append((("learner.shared_prefix",), "with learner.packing=on (packed rows replace the shared-prefix "
                                                "forward)"))
    if cfg.learner.max_tokens_per_micro_batch:
        out.append((("learner.micro_batch_prompts",), "with learner.max_tokens_per_micro_batch set (micro-batches "
                                                      "are cut by tokens)"))
    else:
        out.append((("learner.split_groups",), "without learner.max_tokens_per_micro_batch (no group is over a "
                                               "budget)"))
    if cfg.learner.packing == "off":
        out.append((("learner.packed_attention",), "with learner.packing=off (how packed rows attend)"))
    elif cfg.model.attention in ("flash_attention_2", "flash_attention_3"):  # learner/packing.py's FLASH
        out.append((("learner.packed_attention",), f"with model.attention={cfg.model.attention} (packed rows "
                                                   f"take flash-attention's own varlen path)"))
    if cfg.model.path:
        out.append((TINY_MODEL_ONLY, "with model.path set (the built-in tiny model's size and warm-up)"))
    elif not cfg.warmup.steps:
        out.append((("warmup.batch_size", "warmup.lr", "warmup.target_acc", "warmup.check_every"),
                    "with warmup.steps=0 (no warm-up)"))
    if not {"wandb", "mlflow", "trackio"} & set(cfg.train.loggers):
        out.append((("train.project",), "without wandb, mlflow or trackio in train.loggers"))
    if cfg.data.dataset == "arithmetic":
        out.append((FILE_DATASETS_ONLY, "with data.dataset=arithmetic (the built-in task holds out its own "
                                        "problems and has no fields)"))
        out.append((PROMPT_KEYS, "with data.dataset=arithmetic (the built-in task has its own prompt format)"))
    else:
        out.append((ARITHMETIC_ONLY, f"with data.dataset={cfg.data.dataset} (the built-in task's)"))
        for part, key in (("system", "data.system_prompt"), ("instruction", "data.instruction")):
            # (a template of the user's own places each text itself; '' is none there either)
            if not names(cfg.data.prompt_template, part) and _get(cfg, key):
                out.append(((key,), f"with data.prompt_template, a text of its own without {{{part}}} (write "
                                    f"{{{part}}} where the text goes)"))
        if cfg.data.eval_dataset:
            out.append((("data.split_seed",), "with data.eval_dataset set (no split of the training data)"))
    return out


def unused_settings(cfg: Config) -> list[str]:
    """One line per setting that differs from its default yet has no effect in this run, naming the
    key, its value and the setting that makes it idle. Empty when every chosen value is read."""
    default = Config()
    # what loading gives a micro-batch size nobody set (it follows the mini-batch)
    default.learner.micro_batch_prompts = default_micro_batch_prompts(cfg.learner.mini_batch_prompts)
    lines, seen = [], set()
    for keys, why in idle_rules(cfg):
        for key in keys:
            value = _get(cfg, key)
            if key not in seen and value != _get(default, key):
                seen.add(key)
                shown = str(value).lower() if isinstance(value, bool) else value  # as a user types it
                shown = repr(shown) if isinstance(shown, str) and "\n" in shown else shown  # (a template: one line)
                lines.append(f"{key}={shown} has no effect {why}")
    return lines
