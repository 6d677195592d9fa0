"""PACS in TRL: ``PACSTrainer`` / ``PACSConfig``, drop-ins for ``GRPOTrainer`` / ``GRPOConfig``.

    from pacs_fast.integrations.trl import PACSConfig, PACSTrainer
    args = PACSConfig(output_dir="out", num_generations=8, per_device_train_batch_size=16)
    trainer = PACSTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", reward_funcs=reward, args=args,
                          train_dataset=dataset)
    trainer.train()

Written against trl 1.16.0 (``SUPPORTED_TRL``): it overrides GRPOTrainer's private methods
``_generate_and_score_completions``, ``_calculate_rewards``, ``_prepare_inputs``,
``_get_per_token_logps_and_entropies`` and ``_compute_loss``. What changes against GRPO:

- Rewards: the raw reward ``R_i`` (sum of ``reward_weights * reward_funcs``, which must lie in
  [0, 1]) travels with each completion as ``inputs["pacs_rewards"]``, its group as
  ``inputs["pacs_group"]``; TRL's advantages are computed and logged but not used.
- Groups: a group is the ``num_generations`` completions of one prompt. The generation batch is
  shuffled by whole groups (TRL shuffles rows), and every micro-batch is checked to hold whole
  groups (``per_device_train_batch_size`` must be a multiple of ``num_generations``, checked when
  the config is built). A group never spans processes then.
- Reference: the rollout policy (PACS ``ref="rollout"``): TRL's ``old_per_token_logps`` when it
  computes them (several optimiser steps per generation, ``num_iterations > 1``, vLLM), else the
  current log-probs detached (the same policy: no update since the rollout).
- Log-probs: ``pacs_fast.linear_logprobs`` on the backbone's last hidden states (the
  ``[B, T, V]`` logits never exist), at TRL's sampling ``temperature`` as TRL does.
- Loss: ``pacs_fast.pacs_loss`` per micro-batch, divided by the gradient-accumulation steps. No
  KL term: ``PACSConfig.beta`` is PACS's beta (the proxy scale, paper eq. 8; default 1.0), not
  TRL's KL coefficient, and no reference model is loaded.
- Metrics (TRL's logger): ``pacs/loss``, ``pacs/psi_mean``, ``pacs/psi_std``,
  ``pacs/pred_reward_mean`` / ``_std``, ``pacs/pred_reward_pos`` / ``_neg``, ``pacs/brier``,
  ``pacs/calib_gap``, ``pacs/proxy_abs_mean``, plus TRL's reward / entropy metrics.

Not supported (clear errors at config time): ``top_entropy_quantile < 1``,
``off_policy_mask_threshold``, ``entropy_coef`` / ``use_adaptive_entropy``, and vLLM's importance-sampling
correction in a token mode. In its sequence modes (TRL's default ``sequence_mask``) TRL's ratio
(``importance_sampling_ratio``: the trainer's over vLLM's sequence probability, truncated or masked) weighs each
sample's BCE term (docs/OFF_POLICY.md); the reference stays the trainer's recomputed rollout log-probs (TRL's
``old_per_token_logps``). Vision-language inputs, MoE auxiliary losses and models whose LM head scales or
soft-caps its logits use TRL's own fused LM head for the log-probs (still no ``[B, T, V]``
logits); everything else in the loss is the same. A MoE model's router auxiliary loss is added as GRPOTrainer adds
it (``router_aux_loss_coef`` times it, scaled for gradient accumulation; metric ``aux_loss``).
"""
from __future__ import annotations

import dataclasses
import textwrap
import types
import warnings
from dataclasses import dataclass, field

import torch

try:
    import trl
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import split_pixel_values_by_grid, split_tensor_dict, unsplit_pixel_values_by_grid
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("pacs_fast.integrations.trl needs TRL (tested with trl==1.16.0): "
                      "pip install 'pacs_fast[trl]' 'torch==2.13.0'") from e

from pacs_fast.algorithms.overlong import loss_over_members as _loss_over_members
from pacs_fast.algorithms.pacs import BACKENDS, GROUP_SCORES, PROXIES, SCORES, WEIGHT_MODES, pacs_loss
from pacs_fast.integrations._groups import check_beta, check_whole_groups, pacs_metrics, rows_kept
from pacs_fast.integrations.trl_checks import check_group_settings, check_reward_funcs
from pacs_fast.integrations.trl_model import add_pacs_head, head_unsupported_reason, sync_by_reload, vllm_runs_on_cpu
from pacs_fast.ops.backend import require_triton

SUPPORTED_TRL = "1.16"

__all__ = ["PACSConfig", "PACSTrainer", "SUPPORTED_TRL"]

if not trl.__version__.startswith(SUPPORTED_TRL + "."):
    warnings.warn(f"pacs_fast.integrations.trl was written for trl {SUPPORTED_TRL}.x and overrides "
                  f"private GRPOTrainer methods; found trl {trl.__version__}", stacklevel=2)

# GRPOConfig options that shape GRPO's loss or advantages and do not enter the PACS loss.
IGNORED_GRPO_OPTIONS = ("loss_type", "scale_rewards", "epsilon", "epsilon_high", "delta", "importance_sampling_level")
_GRPO_DEFAULTS = {f.name: f.default for f in dataclasses.fields(GRPOConfig) if f.name in IGNORED_GRPO_OPTIONS}

REWARD_ROUNDING = 1e-5  # fp32 rounding of a weighted sum of reward functions (~1e-6 for 20 functions)

_GROUP_FIX = ("set per_device_train_batch_size (and per_device_eval_batch_size) to a multiple of "
              "num_generations (num_generations_eval), and keep PACSTrainer's own batching")


@dataclass
class PACSConfig(GRPOConfig):
    """``GRPOConfig`` plus PACS's options; every GRPOConfig argument keeps its meaning, except
    ``beta``, which is PACS's beta here (see the module docstring)."""

    beta: float = field(default=1.0, metadata={"help": "PACS beta: scale of the reward proxy "
                        "r_i = beta * sum_t (logp - logp_ref) (paper eq. 8). Not a KL coefficient: "
                        "PACS has no KL term."})
    score: str = field(default="rloo", metadata={"help": f"PACS score: one of {SCORES}."})
    weight_mode: str = field(default="question", metadata={"help": f"PACS sample weights: one of {WEIGHT_MODES}."})
    proxy: str = field(default="logratio", metadata={"help": f"PACS reward proxy: one of {PROXIES}."})
    pacs_backend: str = field(default="torch", metadata={"help": "pacs_loss backend: torch, triton (fused "
                              "kernel) or auto (fused on CUDA)."})

    def __post_init__(self):
        # a split group: PACS's line before TRL's, whose "generation_batch_size (6) must be divisible by
        # num_generations (4)" named neither the setting to change nor why (sweep of 2026-12-01)
        G = self.num_generations
        if isinstance(G, bool) or not isinstance(G, int) or G < 1:  # (TRL divided by 0, or raised a TypeError for
            raise ValueError(f"PACSConfig: num_generations must be a whole number >= 1 (the responses per prompt "
                             f"that form a group), got {G!r}")  # None; 2.0 had been taken)
        if self.per_device_train_batch_size % G:
            check_group_settings(self)
        super().__post_init__()
        check_beta(self.beta, "PACSConfig")
        ignored = [f"{name}={getattr(self, name)!r}" for name in IGNORED_GRPO_OPTIONS
                   if getattr(self, name) != _GRPO_DEFAULTS[name]]
        if ignored:
            what = "is a GRPO loss option" if len(ignored) == 1 else "are GRPO loss options"
            warnings.warn(f"PACSConfig: {', '.join(ignored)} {what} with no effect on the PACS loss", stacklevel=3)
        if self.multi_objective_aggregation != "sum_then_normalize":  # TRL's default; PACS takes the raw sum
            raise ValueError(f"PACSConfig: multi_objective_aggregation={self.multi_objective_aggregation!r} "
                             "normalises each reward function within its group, out of [0, 1]; PACS trains on the "
                             "weighted sum of the rewards as its label (in [0, 1]): leave the default")
        if self.beta < 0.1:
            warnings.warn(f"PACSConfig: beta={self.beta:g} scales PACS's reward proxy and with it the gradient "
                          f"(~{1 / self.beta:.0f}x smaller than at the paper's beta=1); a GRPO recipe's KL "
                          "coefficient does not carry over", stacklevel=3)
        for name, options in (("score", SCORES), ("weight_mode", WEIGHT_MODES), ("proxy", PROXIES),
                              ("pacs_backend", BACKENDS)):
            if getattr(self, name) not in options:
                raise ValueError(f"PACSConfig: {name} must be one of {options}, got {getattr(self, name)!r}")
        check_group_settings(self)


def loss_over_members(loss_fn, logp, logp_ref, mask, rewards, group_size: int, valid, min_members: int,
                      sample_weights=None):
    """The PACS loss of a micro-batch from which some rows were removed (``valid[i]`` False: a
    completion TRL masked, ``mask_truncated_completions=True``).

    Semantics: a removed row has no label, no class weight and no part in its group's score; each
    group is scored over the members it has left (RLOO's leave-one-out mean, GRPO's mean / std and
    the class weights over those k members, i.e. ``loss_fn(..., group_size=k)``); a group left with
    fewer than ``min_members`` (2 for the rloo / grpo / dr_grpo scores) drops out; the loss is the mean over
    the rows that remain (the paper's 1/B with B = those rows), 0 with a graph when none does.
    ``terms`` are full-size, NaN on the rows that left. ``sample_weights`` ``[B]`` (or None): each row's factor of its
    BCE term (vLLM's importance-sampling ratio), passed on with the rows. Returns ``(loss, terms)``."""
    def rows_loss(idx, k):
        kw = {} if sample_weights is None else {"sample_weights": sample_weights[idx]}  # (an override without it)
        return loss_fn(logp[idx], logp_ref[idx], mask[idx], rewards[idx], k, **kw)

    total, terms, rows = _loss_over_members(rows_loss, valid, group_size, min_members)
    for name in ("score", "pred_reward", "proxy"):
        terms.setdefault(name, torch.full((logp.shape[0],), float("nan"), device=logp.device))
    return (total / rows if rows else logp.sum() * 0.0), terms


def sequence_is_weights(ratio, rows: int):
    """TRL's ``importance_sampling_ratio`` (vLLM's correction, ``[B, 1]`` in its sequence modes: ``exp`` of the sum of
    the trainer's minus vLLM's token log-probs, truncated or masked to 0 at ``vllm_importance_sampling_clip_*``) as
    PACS's ``[B]`` sample weights (docs/OFF_POLICY.md: a sequence-level BCE takes the sequence ratio); None without
    it. A per-token ratio (its token modes, refused when the trainer is built) is an error."""
    if ratio is None:
        return None
    if ratio.dim() != 2 or ratio.shape != (rows, 1):
        raise ValueError(f"PACS: TRL's importance_sampling_ratio has shape {tuple(ratio.shape)}, not ({rows}, 1) "
                         "(one ratio per sequence: vllm_importance_sampling_mode='sequence_mask' or "
                         "'sequence_truncate')")
    return ratio.reshape(rows).detach().float()


def _shuffle_whole_groups(batch: dict, group_size: int) -> dict:
    """Shuffles the rows of a generation batch by whole groups (members stay contiguous and in
    order); 0-d tensors and None pass through, lists are permuted like tensors."""
    num_rows = batch["prompt_ids"].shape[0]
    order = torch.randperm(num_rows // group_size)
    perm = (order[:, None] * group_size + torch.arange(group_size)).reshape(-1)

    def permute(v):
        if v is None or (isinstance(v, torch.Tensor) and v.ndim == 0):
            return v
        if isinstance(v, torch.Tensor):
            return v[perm.to(v.device)]
        if isinstance(v, (list, tuple)) and len(v) == num_rows:
            return [v[i] for i in perm.tolist()]
        return v

    return {k: permute(v) for k, v in batch.items()}


class PACSTrainer(GRPOTrainer):
    """``GRPOTrainer`` trained with the PACS loss; same constructor arguments. ``args`` must be a
    ``PACSConfig`` (None builds one named after the model)."""

    _tag_names = ["trl", "pacs"]
    _name = "PACS"
    _paper = {  # TRL's model card cites it (GRPOTrainer's would cite DeepSeekMath)
        "title": "Implicit Actor Critic Coupling via a Supervised Learning Framework for RLVR",
        "id": "2509.02522",
        "citation": textwrap.dedent("""\
            @article{li2025pacs,
                title        = {{Implicit Actor Critic Coupling via a Supervised Learning Framework for RLVR}},
                author       = {Jiaming Li and Longze Chen and Ze Gong and Yukun Chen and Lu Wang and Wanwei He and Run Luo and Min Yang},
                year         = 2025,
                eprint       = {arXiv:2509.02522},
            }"""),
    }

    def __init__(self, model, reward_funcs, args=None, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = PACSConfig(f"{name.split('/')[-1]}-PACS")
        if not isinstance(args, PACSConfig):
            raise TypeError(f"PACSTrainer needs args=PACSConfig(...), got {type(args).__name__}")
        check_group_settings(args)
        check_reward_funcs(reward_funcs, args.reward_weights)
        # TRL reads args.beta as a KL coefficient: hide PACS's beta during its constructor so that
        # no reference model is loaded and no KL term is added (self.beta stays 0.0).
        pacs_beta, args.beta = args.beta, 0.0
        try:
            super().__init__(model, reward_funcs, args=args, **kwargs)
        finally:
            args.beta = pacs_beta
        self.pacs_beta = float(pacs_beta)
        if args.pacs_backend == "triton":  # refused here, not at the first loss step
            try:
                require_triton(torch.empty(0, device=self.accelerator.device))
            except ValueError as e:
                raise ValueError(f"PACSConfig: pacs_backend='triton' cannot run on {self.accelerator.device}: {e}; "
                                 "pacs_backend='auto' takes the fused kernel on CUDA and torch elsewhere") from None
        self._pacs_rewards_per_func = None
        self._pacs_warned_soft = False
        self._pacs_warned_empty = False
        target = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        self._pacs_head_fallback = head_unsupported_reason(target)
        if self._pacs_head_fallback is None:
            add_pacs_head(target, self.temperature)
        else:
            warnings.warn(f"PACSTrainer: the model's LM head has {self._pacs_head_fallback}; log-probs "
                          "come from TRL's fused LM head instead of pacs_fast.linear_logprobs", stacklevel=2)
        if self.use_vllm and args.vllm_mode == "colocate" and vllm_runs_on_cpu():
            generation = self.vllm_generation
            generation.sync_weights = types.MethodType(sync_by_reload, generation)

    # ---------------------------------------------------------------- rollout: rewards and groups

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._pacs_rewards_per_func = rewards_per_func  # [all processes' rows, num funcs]
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        mode = "train" if self.model.training else "eval"
        G = self.num_generations if mode == "train" else self.num_generations_eval
        n = len(inputs)
        if n % G:
            raise ValueError(f"PACS: this process got {n} rows, not whole groups of {G}; {_GROUP_FIX}")
        prompts = [x.get("prompt") for x in inputs]
        for start in range(0, n, G):
            if any(p != prompts[start] for p in prompts[start:start + G]):
                raise ValueError(f"PACS: rows {start}..{start + G - 1} of the generation batch are not "
                                 f"{G} copies of one prompt (TRL's RepeatSampler layout); {_GROUP_FIX}")
        self._pacs_rewards_per_func = None
        out = super()._generate_and_score_completions(inputs)
        per_func = self._pacs_rewards_per_func
        if per_func is None:
            raise RuntimeError("PACS: TRL did not compute rewards through _calculate_rewards "
                               f"(trl {trl.__version__}; supported {SUPPORTED_TRL}.x)")
        if bool(torch.isnan(per_func).all(dim=1).any()):
            raise ValueError("PACS needs a reward for every completion: every reward function returned "
                             "None for some completion")
        rewards = (per_func * self.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
        # weights that add up to 1 (0.1 x 10) can sum a little past it in fp32: that much is rounding
        outside = (rewards < -REWARD_ROUNDING) | (rewards > 1 + REWARD_ROUNDING)
        if bool(outside.any()):
            bad = int(outside.nonzero()[0])
            lo, hi = float(rewards.min()), float(rewards.max())
            raise ValueError("PACS needs rewards in [0, 1] (the verifier's label): the weighted sum of "
                             f"reward_funcs (reward_weights={self.reward_weights.tolist()}) gave "
                             f"{float(rewards[bad]):.9g} for completion {bad} (values in [{lo:.9g}, {hi:.9g}])")
        rewards = rewards.clamp(0.0, 1.0)
        if not self._pacs_warned_soft and bool(((rewards != 0) & (rewards != 1)).any()):
            self._pacs_warned_soft = True
            warnings.warn("PACSTrainer: some rewards lie strictly between 0 and 1 (e.g. weighted reward functions); "
                          "they are used as soft labels of the PACS binary cross-entropy", stacklevel=2)
        first = self.accelerator.process_index * n
        device = out["completion_ids"].device
        out["pacs_rewards"] = rewards[first:first + n].to(device=device, dtype=torch.float32)
        out["pacs_group"] = (torch.arange(first, first + n, device=device) // G)
        if self.mask_truncated_completions:  # TRL zeroed a truncated completion's mask: it leaves the loss
            out["pacs_valid"] = out["completion_mask"].bool().any(dim=1)
        return out

    def _prepare_inputs(self, generation_batch):
        if not self.model.training:
            return super()._prepare_inputs(generation_batch)  # eval: one batch, never shuffled
        # GRPOTrainer's buffering, with a shuffle that keeps groups whole (TRL's shuffles rows)
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            batch = self._generate_and_score_completions(generation_batch)
            batch = split_pixel_values_by_grid(batch)
            batch = _shuffle_whole_groups(batch, self.num_generations)
            chunks = split_tensor_dict(batch, self.args.steps_per_generation)
            if self.mask_truncated_completions:
                self._count_rows_per_step(chunks)
            self._buffered_inputs = [unsplit_pixel_values_by_grid(c) for c in chunks]
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def _count_rows_per_step(self, chunks: list[dict]) -> None:
        """With ``mask_truncated_completions``: each micro-batch ``chunks[c]`` gets ``pacs_rows_kept``, the rows left
        in the loss (:func:`rows_kept`) over the optimiser step it belongs to, on every process. Its loss is then the
        sum over its rows divided by that count: the step's gradient is the mean over the step's remaining rows,
        however they fell into micro-batches (the mean of each micro-batch's mean weighed a row of a micro-batch
        that lost rows more than one of a full one). The step of chunk c is ``c // gradient_accumulation_steps``
        when the accumulation divides ``steps_per_generation``; otherwise (steps straddling generations) TRL's own
        approximation for its dapo loss: the generation batch's count x accumulation / steps_per_generation."""
        min_members = 2 if self.args.score in GROUP_SCORES else 1
        counts = torch.stack([rows_kept(c["pacs_valid"], self.num_generations, min_members) for c in chunks])
        counts = self.accelerator.gather(counts.to(self.accelerator.device).reshape(1, -1)).sum(dim=0).float()
        ga, spg = self.args.gradient_accumulation_steps, self.args.steps_per_generation
        if spg % ga == 0:
            per_step = counts.view(spg // ga, ga).sum(dim=1).repeat_interleave(ga)
        else:
            per_step = counts.sum().expand(spg) * ga / spg
        for c, n in zip(chunks, per_step):
            c["pacs_rows_kept"] = n.reshape(())

    # ---------------------------------------------------------------- log-probs without logits

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                           batch_size=None, compute_entropy=False,
                                           compute_aux_loss=False, **multimodal):
        if (self._pacs_head_fallback is not None or compute_aux_loss
                or any(v is not None for v in multimodal.values())):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal)
        batch_size = batch_size or input_ids.size(0)
        logps, ents = [], []
        for start in range(0, input_ids.size(0), batch_size):
            sl = slice(start, start + batch_size)
            with self.accelerator.autocast():
                logp, ent = model(input_ids=input_ids[sl], attention_mask=attention_mask[sl],
                                  pacs_logits_to_keep=logits_to_keep, pacs_entropy=compute_entropy)
            logps.append(logp)
            ents.append(ent)
        entropies = torch.cat(ents, dim=0) if compute_entropy else None
        return torch.cat(logps, dim=0), entropies, None

    # ---------------------------------------------------------------- the loss

    def pacs_loss(self, logp, logp_ref, mask, rewards, group_size: int, sample_weights=None):
        """The PACS loss of one micro-batch: ``pacs_fast.pacs_loss(..., return_terms=True)`` with
        this trainer's options. ``logp``/``logp_ref``/``mask`` ``[B, T]``, ``rewards`` ``[B]``; ``sample_weights``
        ``[B]`` or None: each sample's factor of its BCE term (vLLM's sequence importance-sampling ratio)."""
        a = self.args
        return pacs_loss(logp, logp_ref, mask, rewards, group_size=group_size, beta=self.pacs_beta,
                         score=a.score, weight_mode=a.weight_mode, proxy=a.proxy, return_terms=True,
                         backend=a.pacs_backend, sample_weights=sample_weights)

    def _compute_loss(self, model, inputs):
        mode = "train" if self.model.training else "eval"
        G = self.num_generations if mode == "train" else self.num_generations_eval
        check_whole_groups(inputs["pacs_group"], G, _GROUP_FIX)
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        multimodal = {k: inputs.get(k) for k in (
            "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
            "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")}
        aux_enabled = getattr(self, "aux_loss_enabled", False)  # a MoE model's router loss, as GRPOTrainer adds it
        logp, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True,
            compute_aux_loss=aux_enabled, **multimodal)
        old = inputs.get("old_per_token_logps")
        logp_ref = logp.detach() if old is None else old
        rewards = inputs["pacs_rewards"]
        valid = inputs.get("pacs_valid")
        min_members = 2 if self.args.score in GROUP_SCORES else 1
        weights = sequence_is_weights(inputs.get("importance_sampling_ratio"), rewards.shape[0])
        if valid is None or bool(valid.all()):  # (no weights: called as before, a subclass's override without them)
            kw = {} if weights is None else {"sample_weights": weights}
            loss, terms = self.pacs_loss(logp, logp_ref, mask, rewards, G, **kw)
        else:
            loss, terms = loss_over_members(self.pacs_loss, logp, logp_ref, mask, rewards, G, valid, min_members,
                                            sample_weights=weights)
        normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        step_rows = inputs.get("pacs_rows_kept") if mode == "train" else None
        # the sum over this micro-batch's remaining rows / the step's remaining rows per process (_count_rows_per_step)
        policy_loss = loss / normalizer if step_rows is None else \
            loss * rows_kept(valid, G, min_members) * self.accelerator.num_processes / step_rows.clamp(min=1.0)

        gather = self.accelerator.gather
        all_terms = {k: gather(terms[k].float().contiguous()) for k in ("score", "pred_reward", "proxy")}
        for key, value in pacs_metrics(all_terms, gather(rewards.float().contiguous())).items():
            self._metrics[mode][key].append(value)
        self._metrics[mode]["pacs/loss"].append(gather(loss.detach().float().reshape(1)).mean().item())
        m = mask.float()
        totals = self.accelerator.reduce(torch.stack([(entropies.detach() * m).sum(), m.sum()]), reduction="sum")
        if totals[1] > 0:  # no completion token to train (all truncated and masked): no entropy, not 0
            self._metrics[mode]["entropy"].append((totals[0] / totals[1]).item())
        elif mode == "train" and not self._pacs_warned_empty:
            self._pacs_warned_empty = True
            warnings.warn("PACSTrainer: a batch has no completion token to train (every completion masked, e.g. "
                          "truncated under mask_truncated_completions=True): its loss and gradient are 0; raise "
                          "max_completion_length", stacklevel=2)

        if aux_enabled:  # (it was dropped: a MoE model trained without its load-balancing loss, silently)
            policy_loss = policy_loss + self.router_aux_loss_coef * aux_loss / normalizer
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())
        return policy_loss
