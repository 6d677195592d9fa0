"""Settings that run but train badly: a warning each at the start of a run, never an error.

``algo.score=grpo`` (PACS) with the log-ratio proxy: the score ``psi = (r - mean) / (std + 1e-6)`` normalises a
learned quantity, so its gradient is ``1 / (std of the group's proxies + 1e-6)``. Every step starts with the
policy equal to its reference (``r = 0`` in every group, ``algo.ref=rollout``; after each reset with
``ref=fixed``): there the gradient is ``(delta_ij - 1/G) / 1e-6``. Measured on the built-in task: gradient
norms of 1.8e6-3.2e6 a step against 3.6-6.0 with ``rloo``, so ``learner.grad_clip`` sets the update's size and
the eps its direction.

``algo.name=gspo`` with one clip bound of GSPO's scale (its defaults 3e-4 / 4e-4, which a bound nobody set takes)
and the other of a token ratio's (a config's ``algo.clip_high=0.28`` for DAPO carries over to a GSPO arm of an
experiment): a sequence ratio range such as [1 - 3e-4, 1.28], lopsided by three orders of magnitude.

An aggregation that undoes its algorithm: ``algo.name=gspo`` with any ``algo.loss_agg`` but ``seq-mean-token-mean``
(GSPO's loss is a sequence's: under ``token-mean`` or a token sum a long response weighs as many sequences as it
has tokens; TRL warns of the same), ``algo.name=dr_grpo`` with ``seq-mean-token-mean`` (the per-response length normalisation
Dr. GRPO removes). ``auto`` (the default) takes each algorithm's own.

``data.system_prompt`` / ``data.instruction`` of the text null, ~ or None: on the command line a text key takes its
value as written (``data.instruction=null`` appended "null" to every problem; ``instruction: null`` in a config
file is none).

The code reward (``reward.fn=pacs_fast.reward.code_tests:...``) with the default ``data.instruction`` (the
paper's, which asks for a boxed final answer, not a code block), where the prompts carry it (a ``data.prompt_template``
of the user's own without ``{instruction}`` does not). The verifier's extraction against the answer format the prompts
ask for: ``reward.extraction=answer_tag`` with prompts that never ask for ``<answer>`` tags, ``boxed`` with prompts
that ask for them and never for ``\\boxed{}`` (pacs_fast/config/answer_format_checks.py).

``rollout.filter_groups=true`` (DAPO's dynamic sampling) with ``algo.name=ppo``: it drops the groups whose verifier
rewards are all equal, whose GRPO-style advantages are 0 anyway; PPO's come from GAE and a critic and are not, so
the filter changes what PPO trains on, not only the batch's size.

More than 4 optimiser steps per rollout batch from a mini-batch under 32 groups: what a prompt count with no
divisor near 32 gives when ``learner.mini_batch_prompts`` is not set (``train.prompts_per_step=37``: 37 steps of
one group, each further off-policy than the last).

A mixture-of-experts ``config.json`` with ``output_router_logits: true`` (it asks for the router's load-balancing
loss in training, which transformers' forward and TRL's GRPOTrainer add): the learners do not add it.

``model.dtype=bfloat16`` with ``learner.lr`` below 1e-4 and ``learner.master_weights=false``: the weights and
AdamW's moments are bf16, so an update smaller than half a bf16 step of its weight (2^-9 of it) rounds away.
Measured on weights ~ N(0, 0.02) with AdamW's step ~ lr: after 10 steps 2% of them had moved at lr 1e-6 (the
PACS recipe's), 15% at 1e-5, 84% at 1e-4 (tests/test_hazard_warnings.py checks the first). With fp32 master
weights (the default) these updates accumulate in fp32 (pacs_fast/learner/master_weights.py).
"""
from __future__ import annotations

from pacs_fast.config.answer_format_checks import answer_format_warning
from pacs_fast.config.model_files import router_aux_loss
from pacs_fast.config.prompt_template_checks import names, typed_escape_warning
from pacs_fast.config.reward_specs import uses_verifier
from pacs_fast.config.schema import Config, LearnerConfig
from pacs_fast.config.stop_string_checks import escape_warning
from pacs_fast.config.unused import idle_rules


def hazard_warnings(cfg: Config) -> list[str]:
    """One line per setting of ``cfg`` that runs but is known to train badly, naming the key and the way out."""
    a = cfg.algo
    out = []
    if a.name == "pacs" and a.score == "grpo" and a.proxy == "logratio":
        out.append("algo.score=grpo divides by the std of each group's proxies (+1e-6), and every step starts with "
                   "the proxies equal (the policy is its reference): gradients of ~1e6 (learner/grad_norm), so "
                   "learner.grad_clip sets the update's size and the 1e-6 its direction; algo.score=rloo (the "
                   "default) has no such point")
    if "pacs_fast.reward.code_tests:" in cfg.reward.fn and cfg.data.instruction == "pacs" and \
            names(cfg.data.prompt_template, "instruction"):  # (a template of its own without {instruction}: unused)
        out.append("reward.fn=pacs_fast.reward.code_tests:... scores the response's last fenced code block, but "
                   "data.instruction=pacs (the default) asks for a final answer within \\boxed{}: set "
                   "data.instruction to ask for a ```python block (or '' when the problems say so themselves)")
    d = cfg.data
    tagged = answer_format_warning(cfg.reward.extraction, d.prompt_template, d.system_prompt, d.instruction)
    if tagged and uses_verifier(cfg.reward.fn):  # (the extraction against the prompts' answer format)
        out.append(tagged)
    for key in ("data.system_prompt", "data.instruction"):  # (a text key takes the command line's text as written)
        value = getattr(cfg.data, key.split(".")[1])
        if value.strip() in ("null", "Null", "NULL", "~", "None"):
            out.append(f"{key}={value!r} is that text, in every prompt: on the command line a text key takes its "
                       f"value as written (null and ~ are empty only in a config file); for none give {key}=")
    for typed in (escape_warning(cfg.rollout.stop, "rollout.stop"),
                  typed_escape_warning(d.prompt_template, "data.prompt_template")):
        if typed:
            out.append(typed)
    lc = cfg.learner
    if (cfg.model.gradient_checkpointing and cfg.model.recompute_granularity == "selective" and lc.backend == "megatron"
            and (lc.packing == "off" or lc.packed_attention == "dense")):
        out.append(f"model.recompute_granularity=selective recomputes the MLPs only: with learner.packing={lc.packing} "
                   f"and learner.packed_attention={lc.packed_attention} the megatron learner's attention keeps its "
                   f"[b, heads, S, S] scores; use model.recompute_granularity=full, or "
                   + ("learner.packed_attention=auto (THD)" if lc.packing != "off" else
                      "learner.packing=auto (THD)" if lc.packed_attention != "dense" else
                      "learner.packing=auto with learner.packed_attention=auto (THD)"))
    mini, per_step = cfg.learner.mini_batch_prompts, cfg.train.prompts_per_step
    if mini < LearnerConfig().mini_batch_prompts and per_step // mini > 4:
        out.append(f"learner.mini_batch_prompts={mini} makes {per_step // mini} optimiser steps per rollout batch of "
                   f"train.prompts_per_step={per_step} (unset, it is the largest divisor up to 32), each further "
                   f"off-policy than the last; set learner.mini_batch_prompts (e.g. {per_step} for one step)")
    lo, hi = a.clip_low, a.clip_high
    if a.name == "gspo" and min(lo, hi) > 0 and max(lo, hi) / min(lo, hi) > 100:
        apart = max(lo, hi) / min(lo, hi)
        out.append(f"algo.clip_low={lo:g} and algo.clip_high={hi:g} with algo.name=gspo are {apart:.0f}x apart: "
                   f"GSPO's sequence ratio takes clips of its own scale (3e-4 / 4e-4, the defaults a bound nobody "
                   f"set takes); set both, e.g. algo.clip_low=3e-4 algo.clip_high=4e-4")
    # every token of a response has the sequence's loss: any sum over its tokens, or mean over all tokens, weighs it
    # by its length (seq-mean-token-sum is that on purpose: LUSPO, TRL's loss_type="luspo", the runner's preset)
    if a.name == "gspo" and a.loss_agg not in ("auto", "seq-mean-token-mean", "seq-mean-token-sum"):
        out.append(f"algo.loss_agg={a.loss_agg} with algo.name=gspo weighs each response by its token count: GSPO's "
                   f"loss is a sequence's (its ratio is the sequence's); use algo.loss_agg=seq-mean-token-mean "
                   f"(what auto, the default, takes), or seq-mean-token-sum for LUSPO's length weighting")
    if a.name == "dr_grpo" and a.loss_agg == "seq-mean-token-mean":
        out.append("algo.loss_agg=seq-mean-token-mean with algo.name=dr_grpo divides each response's loss by its own "
                   "length, the bias Dr. GRPO removes; use algo.loss_agg=seq-mean-token-sum-norm (what auto, the "
                   "default, takes)")
    if a.name == "ppo" and cfg.rollout.filter_groups:
        out.append("rollout.filter_groups=true with algo.name=ppo drops the groups whose verifier rewards are equal, "
                   "but PPO's advantages come from GAE and its critic and are not 0 there: the filter changes what "
                   "PPO trains on, not only the batch's size (it is DAPO's, for group-relative advantages)")
    if a.name.startswith("reinforce_plus_plus") and cfg.rollout.filter_groups:
        out.append(f"rollout.filter_groups=true with algo.name={a.name} drops the groups whose verifier rewards are "
                   f"equal, but REINFORCE++ whitens over the whole step, so their advantages are -mean / std, not 0: "
                   f"the filter changes what it trains on, not only the batch's size")
    idle = {k for keys, _ in idle_rules(cfg) for k in keys}  # (a coefficient this algorithm does not read)
    big = [f"{k}={getattr(a, k.split('.')[1]):g}" for k in ("algo.entropy_coef", "algo.kl_coef", "algo.vf_coef")
           if abs(getattr(a, k.split(".")[1])) >= 1e6 and k not in idle]
    if big:  # (1e37 times an entropy overflowed float32 at step 1, and the stop blamed learner.lr)
        out.append(f"{', '.join(big)}: a loss coefficient of 1e6 or more makes its term outweigh the policy loss by "
                   f"as much, and near 1e37 overflows float32 (the run stops at the first non-finite loss, naming "
                   f"learner.lr); the defaults are algo.entropy_coef=0, algo.kl_coef=0, algo.vf_coef=0.5")
    if cfg.model.dtype == "bfloat16" and cfg.learner.lr < 1e-4 and not cfg.learner.master_weights:
        out.append(f"model.dtype=bfloat16 with learner.master_weights=false keeps the weights and AdamW's moments in "
                   f"bf16: an update under 2^-9 of its weight rounds away, and at learner.lr={cfg.learner.lr:g} most "
                   f"do (lr 1e-6: 98% of weights ~ N(0, 0.02) unchanged after 10 steps; 1e-5: 85%); use "
                   f"learner.master_weights=true (the default) or model.dtype=float32")
    warm, steps = cfg.learner.lr_warmup_steps, cfg.train.steps
    if warm > steps > 0:
        out.append(f"learner.lr_warmup_steps={warm} with train.steps={steps}: the run ends inside its warm-up, its "
                   f"last step at {steps / warm:.3g} of learner.lr and no step at the rate itself; raise "
                   f"train.steps, or (in a new run) lower learner.lr_warmup_steps")
    coef = router_aux_loss(cfg.model.path) if cfg.model.path else None
    if coef:  # (the learners' log-prob ops run the decoder body and the head: the router's logits are not asked for)
        out.append(f"model.path={cfg.model.path}: its config.json sets output_router_logits=true "
                   f"(router_aux_loss_coef={coef:g}), but the learner's loss is the policy's alone: the router's "
                   f"load-balancing loss is not added (as verl's; TRL's GRPOTrainer with pacs_fast.integrations.trl "
                   f"adds it); set output_router_logits=false in config.json to say so")
    if a.reset_every and a.reset_every >= steps:  # the first reset comes before step reset_every + 1
        out.append(f"algo.reset_every={a.reset_every} with train.steps={steps}: the first reset would come before "
                   f"step {a.reset_every + 1}, so the reference is never reset in this run")
    return out
