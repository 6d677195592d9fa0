"""The integrations under hostile use (sweep of 2026-12-01): TRL's MoE router loss reaches the PACS loss, several
reward functions without weights warn when the trainer is built, verl's loss refuses the KL loss and entropy bonus
verl would add to it and names rollout.n, OpenRLHF's check refuses a KL term in either place and its loss refuses
the Triton backend where it cannot run."""
from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

from pacs_fast.data.tiny import build_char_tokenizer


def test_a_moe_models_router_loss_is_added_as_grpo_adds_it(tmp_path):
    """A MoE model's load-balancing loss (router_aux_loss_coef) was dropped: PACSTrainer trained the router without
    it, silently, where GRPOTrainer adds it."""
    pytest.importorskip("trl", reason="TRL not installed")
    datasets = pytest.importorskip("datasets")
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    from pacs_fast.integrations.trl import PACSConfig, PACSTrainer

    tok = build_char_tokenizer()
    cfg = Qwen2MoeConfig(vocab_size=-(-len(tok) // 64) * 64, hidden_size=64, intermediate_size=64,
                         moe_intermediate_size=32, shared_expert_intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, num_experts=4, num_experts_per_tok=2,
                         router_aux_loss_coef=0.01, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                         bos_token_id=tok.bos_token_id)
    torch.manual_seed(0)
    model = Qwen2MoeForCausalLM(cfg)
    gc = model.generation_config
    gc.pad_token_id, gc.eos_token_id, gc.bos_token_id = tok.pad_token_id, tok.eos_token_id, tok.bos_token_id
    args = PACSConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4,
                      steps_per_generation=1, max_completion_length=6, learning_rate=1e-2, max_steps=1,
                      logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, bf16=False, seed=0,
                      dataloader_num_workers=0, disable_tqdm=True)
    data = datasets.Dataset.from_list([{"prompt": f"{i}+{i + 1}="} for i in range(8)])
    trainer = PACSTrainer(model=model, reward_funcs=lambda completions, **_: [float(len(c) % 2) for c in completions],
                          args=args, train_dataset=data, processing_class=tok)
    assert trainer.aux_loss_enabled and trainer.router_aux_loss_coef == 0.01
    trainer.train()
    log = trainer.state.log_history[0]
    assert log["aux_loss"] > 0, log
    # the step's loss is PACS's plus the coefficient times the router loss (one micro-batch a step)
    assert log["loss"] == pytest.approx(log["pacs/loss"] + 0.01 * log["aux_loss"], rel=1e-4, abs=1e-6), log


def test_several_reward_functions_without_weights_warn_when_built():
    """Two functions in [0, 1] with TRL's default weights 1 can sum to 2: the run stopped at its first step, ten
    frames deep; a negative weight can go below 0. Both warn before TRL loads anything."""
    from pacs_fast.integrations.trl_checks import check_reward_funcs

    def f(completions, **_):
        return [1.0] * len(completions)

    with pytest.warns(UserWarning, match="2 reward functions with TRL's default weights 1 sum to 2"):
        check_reward_funcs([f, f], None)
    with pytest.warns(UserWarning, match=r"reward_weights=\[1, -1\] hold a negative weight"):
        check_reward_funcs([f, f], [1, -1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_reward_funcs([f], None)
        check_reward_funcs([f, f], [0.5, 0.5])


def test_verls_loss_refuses_the_terms_verl_would_add():
    """verl's ppo_loss adds the entropy bonus and the KL loss to what the policy loss returns: the PACS loss read the
    ActorConfig on every call but let both through (check_config, which the documented command need not call,
    refused only the KL loss); rollout.n=1 failed inside pacs_loss without naming the setting."""
    pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl not installed")
    from verl.workers.config import ActorConfig

    import pacs_fast.integrations.verl as pv

    logp = torch.zeros(4, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(4, 3)
    adv = pv.compute_pacs_advantage(torch.tensor([[0, 0, 1.0], [0, 0, 0], [0, 0, 1.0], [0, 0, 0]]), mask,
                                    index=["a", "a", "b", "b"])[0]

    def loss(**kw):
        cfg = ActorConfig(strategy="fsdp", rollout_n=kw.pop("n", 2), ppo_micro_batch_size_per_gpu=4,
                          ppo_mini_batch_size=2, **kw)
        return pv.compute_policy_loss_pacs(logp.detach(), logp, adv, mask, config=cfg)

    loss()  # the plain config trains
    with pytest.raises(ValueError, match="actor_rollout_ref.actor.use_kl_loss must be False"):
        loss(use_kl_loss=True, kl_loss_coef=0.1)
    with pytest.raises(ValueError, match=r"actor_rollout_ref.actor.entropy_coeff must be 0 \(got 0.01"):
        loss(entropy_coeff=0.01)
    with pytest.raises(ValueError, match="actor_rollout_ref.rollout.n=1, but score='rloo'"):
        pv.compute_policy_loss_pacs(logp.detach(), logp, adv, mask, config=ActorConfig(
            strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=4, ppo_mini_batch_size=2))
    config = {"algorithm": {"adv_estimator": "pacs"}, "trainer": {"balance_batch": False},
              "actor_rollout_ref": {"rollout": {"n": 2}, "actor": {
                  "policy_loss": {"loss_mode": "pacs"}, "ppo_micro_batch_size_per_gpu": 4, "entropy_coeff": 0.01}}}
    with pytest.raises(ValueError, match="actor_rollout_ref.actor.entropy_coeff must be 0"):
        pv.check_config(config)


def test_openrlhfs_kl_term_is_refused_in_either_place_and_triton_where_it_cannot_run(monkeypatch):
    """check_args accepted algo.kl.use_loss with init_coef > 0 and even advised it ("or algo.kl.use_loss"): a KL
    term in the actor's loss PACS does not have. PACSPolicyLoss(backend='triton') without CUDA failed only at the
    first update."""
    from pacs_fast.integrations.openrlhf import PACSPolicyLoss, check_args

    args = SimpleNamespace(rollout=SimpleNamespace(n_samples_per_prompt=8),
                           train=SimpleNamespace(micro_batch_size=16, dynamic_batch_enable=False),
                           ds=SimpleNamespace(packing_samples=False),
                           algo=SimpleNamespace(kl=SimpleNamespace(init_coef=0.01, use_loss=True)))
    with pytest.raises(ValueError, match="algo.kl.init_coef must be 0: > 0 puts a KL term into the actor's loss"):
        check_args(args)
    args.algo.kl.use_loss = False
    with pytest.raises(ValueError, match="puts a KL term into the reward"):
        check_args(args)
    args.algo.kl.init_coef = 0.0
    check_args(args)
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the triton backend can run here (the refusal is for machines without)")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # (the suite interprets Triton on CPU)
    with pytest.raises(ValueError, match="PACSPolicyLoss: backend='triton' cannot run here"):
        PACSPolicyLoss(group_size=4, backend="triton")


def test_verls_check_names_the_deprecated_micro_batch_key():
    pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl not installed")
    import pacs_fast.integrations.verl as pv

    config = {"algorithm": {"adv_estimator": "pacs"}, "trainer": {"balance_batch": False},
              "actor_rollout_ref": {"rollout": {"n": 8}, "actor": {"policy_loss": {"loss_mode": "pacs"},
                                                                   "ppo_micro_batch_size": 16}}}
    with pytest.raises(ValueError, match=r"ppo_micro_batch_size_per_gpu \(None\) must be a multiple of "
                                         r"actor_rollout_ref.rollout.n \(8\) \(the deprecated "
                                         r"actor_rollout_ref.actor.ppo_micro_batch_size=16 is a global size"):
        pv.check_config(config)


def test_pacs_names_a_split_group_before_trls_own_check(tmp_path):
    """per_device_train_batch_size=6 with num_generations=4 and steps_per_generation=1: TRL's check came first,
    "generation_batch_size (6) must be divisible by num_generations (4)", naming neither the setting nor why."""
    pytest.importorskip("trl", reason="TRL not installed")
    from pacs_fast.integrations.trl import PACSConfig

    with pytest.raises(ValueError, match=r"^PACS needs whole groups in every micro-batch: per_device_train_batch_size"
                                         r"=6 is not a multiple of num_generations=4"):
        PACSConfig(output_dir=str(tmp_path), per_device_train_batch_size=6, num_generations=4,
                   steps_per_generation=1, use_cpu=True, report_to=[])
