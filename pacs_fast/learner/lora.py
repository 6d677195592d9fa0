"""LoRA for the torch learner (``model.lora_rank``): low-rank adapters (Hu et al. 2021) on the linear layers of
a Hugging Face model, through PEFT's ``inject_adapter_in_model`` (the model keeps its class and its body / head
attributes; only the adapters train, the base weights are frozen).

- The optimiser (and the fp32 masters of a bf16 model) hold the adapters alone: AdamW's state is ~2 x the
  adapters' size instead of 2 x the model's.
- What leaves the learner is the merged model: :func:`iter_merged_weights` gives each adapted layer's
  ``W + scale * B @ A`` under the layer's plain Hugging Face name (the engines load it, checkpoints are plain
  Hugging Face folders that ``from_pretrained`` and ``python -m pacs_fast.eval`` read).
- The adapters themselves (:func:`adapter_state`) go into the learner's state, so a resume continues the same
  adapters on the same base (model.path's), exactly; each checkpoint also holds them as a PEFT adapter folder
  (:func:`save_adapter`, ``adapter/``) that ``PeftModel.from_pretrained(base, folder)`` loads.

- A fixed reference policy (PACS ``algo.ref=fixed``, a baseline's KL) shares the frozen base: the learner keeps a
  copy of the adapters only (:func:`adapter_snapshot`) and runs the reference forward with them swapped in
  (:func:`adapters_swapped`), instead of a second copy of the model.

The HF engine of a one-process run shares the model: it generates through the adapters, unmerged.
"""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping
from typing import Iterator

import torch

from pacs_fast.causal_lm import lm_head
from pacs_fast.config.hybrid_blocks import MAMBA_FAMILIES, NOT_ADAPTED_IN_MAMBA
from pacs_fast.learner.hf_folder import weights_and_shapes

LORA_MARK = ".lora_"  # in the state-dict names of PEFT's adapter tensors (lora_A, lora_B, ...)
BASE_MARK = ".base_layer"  # PEFT keeps an adapted layer's own weight under <layer>.base_layer


# model_type -> the names model.lora_target_modules may give for the fused experts and router of a family whose own
# checkpoints hold them as tensors (PEFT maps none of them: tests/test_gpt_oss_path_sweep.py), and the parameters
# (PEFT's target_parameters) they adapt; all-linear adapts every one. gpt-oss's gate and up rows are interleaved in
# one tensor: gate_proj and up_proj both name it.
OWN_FUSED_EXPERTS = {"gpt_oss": {"gate_up_proj": "mlp.experts.gate_up_proj", "gate_proj": "mlp.experts.gate_up_proj",
                                 "up_proj": "mlp.experts.gate_up_proj", "down_proj": "mlp.experts.down_proj",
                                 "router": "mlp.router.weight"}}
# model_type -> the same for a family whose experts transformers 5 fuses on load as Qwen2-MoE's (its hub checkpoints
# hold them per expert) but PEFT does not map (PEFT maps the hub's names onto the fused experts and the router by the
# model's own model_type alone; Qwen3.5-MoE's wrapper and text model are not among them): all-linear and the usual
# list left every expert and router of Qwen3.5-MoE bare (sweep of 2026-12-07). Adapted as PEFT adapts Qwen2-MoE's:
# the fused gate and up at twice the rank and alpha.
UNMAPPED_FUSED_EXPERTS = dict.fromkeys(("qwen3_5_moe", "qwen3_5_moe_text"), {
    "gate_proj": "mlp.experts.gate_up_proj", "up_proj": "mlp.experts.gate_up_proj",
    "down_proj": "mlp.experts.down_proj", "gate": "mlp.gate.weight"})


# model_type -> the same for a family whose MoE layers hold fused expert tensors of their own beside a dense MLP whose
# linear layers bear the experts' names (Gemma 4's enable_moe_block; its router is a Linear, router.proj): a listed
# gate_proj / up_proj / down_proj names both the dense layer and the experts, all-linear adapts every one (PEFT maps
# none of them: all-linear had left Gemma 4's experts bare). At the rank itself, as gpt-oss's. Nemotron-H's MoE layers
# (Nemotron 3 Nano: non-gated experts, up and down, beside a shared expert and the model's MLP layers) and Granite
# 4.0-H's (its hub checkpoints' input_linear / output_linear name both the experts and the shared MLP) likewise.
EXPERTS_BESIDE_MLP = {"gemma4_text": {"gate_proj": "experts.gate_up_proj", "up_proj": "experts.gate_up_proj",
                                      "down_proj": "experts.down_proj"},
                      "nemotron_h": {"up_proj": "mixer.experts.up_proj", "down_proj": "mixer.experts.down_proj"},
                      "granitemoehybrid": {"input_linear": "block_sparse_moe.experts.gate_up_proj",
                                           "output_linear": "block_sparse_moe.experts.down_proj"}}


def add_lora(model: torch.nn.Module, *, rank: int, alpha: float, dropout: float, target_modules: str) -> int:
    """Injects LoRA adapters into ``model`` in place (rank ``rank``, scale ``alpha / rank``; ``target_modules``:
    ``all-linear`` (every linear layer but the LM head) or comma-separated module names, e.g. ``q_proj,v_proj``);
    freezes everything else. Returns the number of trainable parameters. A ValueError naming the key when PEFT
    is missing or the names match no layer of this model."""
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError as e:
        raise ValueError("model.lora_rank needs PEFT: pip install 'pacs_fast[lora]'") from e
    key = f"model.lora_target_modules={target_modules!r}"
    names = [t.strip() for t in target_modules.split(",") if t.strip()]
    mamba_outs = mamba_out_projs(model)
    if mamba_outs and set(names) & set(NOT_ADAPTED_IN_MAMBA):
        raise ValueError(f"{key}: a Mamba mixer's out_proj takes no adapter: transformers' fused Mamba kernel "
                         f"(mamba_ssm, on a GPU) reads its weight directly, past any adapter (PEFT refuses it for "
                         f"Nemotron-H); all-linear leaves it out, or name in_proj")
    if any(t.lower() == "all-linear" for t in names):
        if len(names) > 1:
            raise ValueError(f"{key}: all-linear stands alone (every linear layer but the LM head), not in a list")
        names = []
    # a family whose experts and router are tensors in its own checkpoints (gpt-oss): PEFT maps no name onto them,
    # so all-linear left them without adapters (attention alone) and the usual gate/up/down list was refused; they
    # are PEFT's target_parameters here, as PEFT maps them for the families transformers 5 fuses (Qwen3-MoE, ...)
    text = getattr(model, "config", None)
    text = text.get_text_config() if hasattr(text, "get_text_config") else text
    own = OWN_FUSED_EXPERTS.get(getattr(text, "model_type", None), {})
    params = sorted(set(own.values())) if own and not names else sorted({own[t] for t in names if t in own})
    unmapped = UNMAPPED_FUSED_EXPERTS.get(getattr(text, "model_type", None), {})
    modules = [t for t in names if t not in own and not (t == "gate" and unmapped)]  # (the router: no Linear)
    params += sorted(set(unmapped.values()) if not names else {unmapped[t] for t in names if t in unmapped})
    beside = EXPERTS_BESIDE_MLP.get(getattr(text, "model_type", None), {})
    if beside and any(n.endswith("." + p) for p in beside.values() for n, _ in model.named_parameters()):  # (MoE)
        params += sorted(set(beside.values()) if not names else {beside[t] for t in names if t in beside})
    doubled = {r".*\.gate_up_proj": 2} if any(p.endswith("gate_up_proj") for p in params) and unmapped else {}
    excluded = outside_language_model(model) + (mamba_outs if not names else [])  # (all-linear's)
    config = LoraConfig(r=int(rank), lora_alpha=float(alpha), lora_dropout=float(dropout),
                        target_modules=modules or (None if names else "all-linear"), bias="none",
                        target_parameters=params or None, exclude_modules=excluded or None,
                        rank_pattern={k: v * int(rank) for k, v in doubled.items()},
                        alpha_pattern={k: v * float(alpha) for k, v in doubled.items()})
    try:
        with warnings.catch_warnings():  # (PEFT's advice on tied embeddings: the head is refused below anyway)
            warnings.simplefilter("ignore", UserWarning)
            # (and on a MoE its word that the doubled rank and alpha of the fused gate_up_proj "were ignored": they
            # were applied, r = 2 x model.lora_rank there; it printed two lines of PEFT's source at every start)
            warnings.filterwarnings("ignore", r"The following (rank|alpha)_pattern keys did not match", RuntimeWarning)
            inject_adapter_in_model(config, model)
    except ValueError as e:
        text = " ".join(str(e).split())
        if "is not supported" in text:  # a container (mlp, self_attn): PEFT's message holds its whole repr
            text = (f"it names a module that is not a linear layer (mlp, self_attn); name linear layers: "
                    f"{', '.join(linear_names(model))}")
        elif "not found in the base model" in text:  # (Phi-3 fuses q/k/v into qkv_proj: q_proj names nothing)
            text = f"{', '.join(names)} not found in this model; its linear layers: {', '.join(linear_names(model))}"
        raise ValueError(f"{key}: {text[:300]}") from None
    # PEFT builds each adapter's modules (its dropout) in train mode: in a model in eval mode (from_pretrained's) they
    # dropped inputs in every forward that did not call eval() first (model.training False; the value pass)
    for layer in lora_layers(model).values():
        layer.train(layer.base_layer.training)
    # a name that matched no layer beside one that did: PEFT trains the one that did (a typo lost v_proj). PEFT maps
    # the hub's expert names of a transformers 5 mixture of experts (gate_proj, up_proj, down_proj) onto its fused
    # experts, moving them from the config's target_modules to its target_parameters (in place): a name so moved
    # matched when a tensor it went to took adapters (the usual Qwen list had been refused on Qwen3-MoE)
    adapted = list(lora_layers(model))
    wrapped = {getattr(m, "parameter_name", None) for m in lora_layers(model).values()}
    moved = set(names) - set(config.target_modules or ()) if set(config.target_parameters or ()) & wrapped else set()
    moved |= {t for t in names if t in {**own, **unmapped}
              and {**own, **unmapped}[t].rsplit(".", 1)[-1] in wrapped}
    missing = [t for t in names if t not in moved and not any(n == t or n.endswith("." + t) for n in adapted)]
    if missing:
        raise ValueError(f"{key}: {', '.join(missing)} matched no layer of this model (names are module names or "
                         f"their last parts; its linear layers: {', '.join(linear_names(model))})")
    # the learner's log-prob op reads the LM head's weight (its adapters would be left out), and an adapted
    # embedding would reach the engines' tied head only through the merge: linear layers of the body only
    odd = [name for name, m in lora_layers(model).items()
           if m is lm_head(model) or isinstance(getattr(m, "base_layer", None), torch.nn.Embedding)]
    if odd:
        raise ValueError(f"model.lora_target_modules={target_modules!r} adapts {odd[0]}: adapters go on the linear "
                         f"layers of the decoder, not the embedding or the LM head (all-linear leaves those out)")
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def outside_language_model(model: torch.nn.Module) -> list[str]:
    """The linear layers of a multimodal wrapper (Gemma 3 4B+, Mistral 3, LLaVA) outside its language model
    (``get_decoder()``: the vision tower, the projector) but its LM head: a text-only forward never reaches them,
    so they take no adapters (PEFT's all-linear, and names such as q_proj, match them too). Empty for a causal LM,
    whose decoder is its ``model``."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if decoder is None or decoder is getattr(model, "model", None):
        return []
    prefix = next((n for n, m in model.named_modules() if m is decoder), None)
    if not prefix:
        return []
    head = lm_head(model)
    # (a linear layer, or a module wrapping one: Gemma 4's vision tower holds Gemma4ClippableLinear modules named
    # q_proj, gate_proj, ..., which PEFT refused as unsupported when a listed name matched them)
    return [n for n, m in model.named_modules() if m is not head and not n.startswith(prefix + ".") and n != prefix
            and not prefix.startswith(n + ".") and n
            and (isinstance(m, torch.nn.Linear) or any(isinstance(c, torch.nn.Linear) for c in m.children()))]


def mamba_out_projs(model: torch.nn.Module) -> list[str]:
    """The Mamba mixers' ``out_proj`` layers of a Nemotron-H / Falcon-H1 / Mamba model, which ``all-linear`` leaves
    without adapters: PEFT refuses to adapt them (the fused Mamba kernels read their weight directly, past any
    adapter), and had refused every ``all-linear`` run of these models. Empty for other models."""
    text = getattr(model, "config", None)
    text = text.get_text_config() if hasattr(text, "get_text_config") else text
    if getattr(text, "model_type", None) not in MAMBA_FAMILIES:
        return []
    return [n for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in NOT_ADAPTED_IN_MAMBA]


def bare_linears(model: torch.nn.Module, target_modules: str) -> list[str]:
    """The linear layers of the language model that ``target_modules`` names (``all-linear``: each but the LM head)
    and that took no adapters in :func:`add_lora`. PEFT maps the hub's expert names (``gate_proj``, ``up_proj``,
    ``down_proj``; Mixtral's ``w1``..``w3``) onto a transformers 5 mixture of experts' fused experts by the name alone,
    taking them from its dense MLPs too: DeepSeek-V2's first layers and shared experts, Qwen2-MoE's shared expert,
    Qwen3-MoE's ``mlp_only_layers`` stay bare under ``all-linear`` and under the usual list alike. Empty elsewhere."""
    names = [t.strip() for t in target_modules.split(",") if t.strip()]
    every = any(t.lower() == "all-linear" for t in names)
    head, outside, adapted = lm_head(model), set(outside_language_model(model)), lora_layers(model)
    outside |= set(mamba_out_projs(model)) if every else set()  # (left out on purpose: PEFT refuses them)
    bare = []
    for name, m in model.named_modules():
        if (not isinstance(m, torch.nn.Linear) or m is head or name in outside or name in adapted
                or LORA_MARK in name or name.endswith(BASE_MARK)):
            continue
        if every or any(name == t or name.endswith("." + t) for t in names):
            bare.append(name)
    return bare


def linear_names(model: torch.nn.Module) -> list[str]:
    """The last parts of the names of ``model``'s linear layers but its LM head (``q_proj``, ..., in order), the
    names ``model.lora_target_modules`` may give."""
    head, names = lm_head(model), []
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and m is not head and LORA_MARK not in name:  # (an adapted layer: its
            names.append(name.removesuffix(BASE_MARK).rsplit(".", 1)[-1])             # base_layer is the Linear)
    return list(dict.fromkeys(names))


def lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """``{module name: PEFT LoRA layer}`` of ``model`` (empty without adapters)."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return {}
    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def has_lora(model: torch.nn.Module) -> bool:
    return bool(lora_layers(model))


@torch.no_grad()
def iter_merged_weights(model: torch.nn.Module, *, merge: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's state under plain Hugging Face names as ``(name, tensor)`` pairs, each adapted layer's weight
    merged with its active adapters (``W + scale * B @ A`` in fp32, rounded once to ``W``'s dtype), the adapter
    tensors left out. A merge is computed as its pair is asked for: a consumer that streams (a checkpoint's buckets,
    the vLLM engine's weight sync) holds one merged layer at a time, not a merged copy of every adapted weight. In
    bf16 that rounding takes away a delta under half an ulp of ``W``, which the learner's own forward
    (``W x + scale * B (A x)``) keeps: the engines and checkpoints of a bf16 LoRA run see the update rounded.
    Unmerged tensors are the model's own (no copy). ``merge=False``: each adapted weight as a ``meta`` tensor of its
    shape and dtype instead (which its merge keeps), no merge computed: the pairs' names, shapes and dtypes alone (a
    checkpoint's file layout, laid out before its merged tensors are written)."""
    adapted = adapted_tensors(model)
    for name, t in model.state_dict().items():
        if LORA_MARK in name:
            continue
        m = adapted.get(name)
        if m is not None and not m.merged and not merge:
            t = torch.empty_like(t, device="meta")
        elif m is not None and not m.merged:  # (no_grad holds whenever the generator runs: torch wraps generators)
            merged = t.float()
            for adapter in m.active_adapters:
                if adapter in m.lora_A:
                    merged = merged + _delta(m, adapter)
            t = merged.to(t.dtype)  # (in fp32, rounded once: a bf16 sum rounded the delta, then the sum)
        yield name.replace(BASE_MARK, ""), t


def merged_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """:func:`iter_merged_weights` as a dict (every merge held at once)."""
    return dict(iter_merged_weights(model))


def adapted_tensors(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """``{state-dict name of an adapted base tensor: its PEFT LoRA layer}``: ``<layer>.base_layer.weight`` of an
    adapted linear layer; for PEFT's ``ParamWrapper`` (a tensor adapted in place: the fused ``[experts, in, out]``
    ``gate_up_proj`` / ``down_proj`` of transformers 5's MoE blocks, a router's weight) the wrapped module's tensor
    ``<layer>(.base_layer)*.base_layer.<parameter_name>``, as deep as the wrappers nest (two on one experts
    module). (Reading ``.base_layer.weight`` alone left the experts' adapters out of the merge, and failed.)"""
    from peft.tuners.lora import LoraLayer

    out = {}
    for name, layer in lora_layers(model).items():
        inner, path = layer, name
        while isinstance(inner.base_layer, LoraLayer):
            inner, path = inner.base_layer, path + BASE_MARK
        out[f"{path}{BASE_MARK}.{getattr(layer, 'parameter_name', 'weight')}"] = layer
    return out


def _delta(layer: torch.nn.Module, adapter: str) -> torch.Tensor:
    """``scale * B @ A`` of one adapter of a PEFT LoRA layer, in fp32 (PEFT's ``get_delta_weight`` rounds it to the
    weight's dtype first: a bf16 merge then rounded twice; a ``ParamWrapper``'s, shaped as its tensor
    (``[experts, ...]``), is PEFT's own, in the tensor's dtype)."""
    if hasattr(layer, "parameter_name"):  # (PEFT knows the experts' layout: [experts, in, out] or [.., out, in])
        return layer.get_delta_weight(adapter).float()
    delta = layer.lora_B[adapter].weight.float() @ layer.lora_A[adapter].weight.float()
    if getattr(layer, "fan_in_fan_out", False):  # (GPT-2's Conv1D layout: the weight is stored transposed)
        delta = delta.T
    return delta * float(layer.scaling[adapter])


@torch.no_grad()
def base_digest(model: torch.nn.Module) -> str:
    """SHA-1 (hex) of the adapted layers' frozen base weights (names, shapes, dtypes and bytes): what a checkpoint
    records of the base its adapters were trained on, compared exactly on resume. A checkpoint's merged weights
    given as the base (``model.path`` a checkpoint's copy) differ from it by the adapters' update alone, which at
    an RL learning rate lies within any tolerance of a merge's comparison: the adapters were applied twice."""
    import hashlib

    digest = hashlib.sha1()
    for name, layer in sorted(lora_layers(model).items()):
        w = (layer.get_param() if hasattr(layer, "parameter_name") else layer.base_layer.weight).detach()
        digest.update(f"{name}:{tuple(w.shape)}:{w.dtype};".encode())
        digest.update(memoryview(w.contiguous().cpu().view(torch.uint8).numpy()))  # (no copy: ~1 GB/s here)
    return digest.hexdigest()


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' tensors (their state-dict names), detached copies on the CPU."""
    return {n: t.detach().to("cpu").clone() for n, t in model.state_dict().items() if LORA_MARK in n}


def adapter_params(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """``{state-dict name: parameter}`` of the adapters (PEFT's ``lora_A`` / ``lora_B`` weights)."""
    return {n: p for n, p in model.named_parameters() if LORA_MARK in n}


@torch.no_grad()
def adapter_snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the adapters' values, each on its parameter's device and in its dtype: with the shared frozen
    base, all a fixed reference policy needs (``rank x (in + out)`` per adapted layer, not the model)."""
    return {n: p.detach().clone() for n, p in adapter_params(model).items()}


@contextlib.contextmanager
def adapters_swapped(model: torch.nn.Module, snapshot: dict[str, torch.Tensor]):
    """Within the block the model's adapters hold ``snapshot``'s values (the tensors swapped in, nothing
    copied), so a forward is the snapshot's policy; after it, also on an error, they hold their own again
    (the same tensors: the optimiser, its state and the fp32 masters never see the swap). For forwards
    without gradients (the reference's log-probs)."""
    params = adapter_params(model)
    if set(params) != set(snapshot):
        raise ValueError("the reference adapters are not this model's (model.lora_* changed since they were taken)")
    own: dict[str, torch.Tensor] = {}
    try:
        for n, p in params.items():
            own[n] = p.data
            p.data = snapshot[n]
        yield model
    finally:
        for n, t in own.items():
            params[n].data = t


@torch.no_grad()
def load_adapter_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Loads :func:`adapter_state`'s tensors back; a ValueError when they are not this model's adapters."""
    copy_adapters({n: t for n, t in model.state_dict().items() if LORA_MARK in n}, state)


@torch.no_grad()
def copy_adapters(own: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> None:
    """Copies ``state``'s adapter tensors into ``own``'s (same names and shapes, each kept on its device and
    dtype); a ValueError when they are not the same adapters."""
    if set(own) != set(state) or any(tuple(own[n].shape) != tuple(state[n].shape) for n in own):
        missing = sorted(set(own) ^ set(state))[:3]
        raise ValueError(f"the checkpoint's LoRA adapters are not this model's (model.lora_rank / "
                         f"model.lora_target_modules differ; e.g. {missing or 'the shapes'})")
    for n, t in own.items():
        t.copy_(state[n].to(device=t.device, dtype=t.dtype))


def checked_merged(model: torch.nn.Module, named_tensors) -> Mapping[str, torch.Tensor]:
    """A checkpoint's merged weights (``(name, tensor)`` pairs) as a mapping, after checking their names and shapes
    against :func:`merged_weights`' (a ValueError naming the first few that differ). A checkpoint's
    :class:`~pacs_fast.learner.hf_folder.LazyHFCheckpoint` (or its ``items()``) is checked from its headers and
    returned unread (:func:`check_same_merge` reads a tensor at a time); other pairs are collected into a dict."""
    merged = {n.replace(BASE_MARK, ""): t for n, t in model.state_dict().items() if LORA_MARK not in n}
    items, shapes = weights_and_shapes(named_tensors)
    bad = [n for n, shape in shapes.items() if n not in merged or tuple(merged[n].shape) != shape]
    if bad:
        raise ValueError(f"load_hf_weights: unknown names or wrong shapes: {bad[:5]}")
    return items


@torch.no_grad()
def check_same_merge(model: torch.nn.Module, loaded: Mapping[str, torch.Tensor]) -> None:
    """After a checkpoint's adapters loaded: their merge on this base equals the checkpoint's merged weights
    ``loaded`` (to the float rounding of the merge, 1e-5 of the largest entry), else a ValueError: the base
    (model.path's weights) changed since the run was saved."""
    for name, mine in iter_merged_weights(model):  # (one merge at a time)
        if name not in loaded:
            continue
        t, mine = loaded[name], mine.float()
        if not mine.numel():
            continue
        if float((mine - t.to(mine.device).float()).abs().max()) > 1e-5 * max(float(mine.abs().max()), 1.0):
            raise ValueError(f"the checkpoint's {name} is not model.path's base weight with the checkpoint's LoRA "
                             f"adapters: model.path's weights (or the run's model.lora_* settings) changed since the "
                             f"run was saved")


def save_adapter(model: torch.nn.Module, folder, *, base: str | None = None) -> None:
    """Writes the adapters as a PEFT adapter folder (``adapter_config.json`` and ``adapter_model.safetensors``, the
    names and layout ``PeftModel.save_pretrained`` writes) into ``folder``; ``base``: the base model's path or hub
    id, recorded as ``base_model_name_or_path``. A snapshot folder of the Hugging Face cache (a ``model.path`` given
    as a hub id) is recorded as its hub id and commit (``revision``), as PEFT writes an adapter trained on a hub
    model: ``AutoPeftModelForCausalLM`` then loads that base on any machine (a cache path is this machine's)."""
    import copy
    from pathlib import Path

    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    from pacs_fast.config.model_files import hub_repo_of
    from pacs_fast.files import default_mode

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(model.peft_config["default"])
    config.base_model_name_or_path, config.task_type, config.inference_mode = base, "CAUSAL_LM", True
    hub = hub_repo_of(base)
    if hub is not None:
        config.base_model_name_or_path, config.revision = hub
    if isinstance(config.target_modules, (set, list)):  # (all-linear's: a set, in string-hash order: identical runs
        config.target_modules = sorted(config.target_modules)  # wrote adapter_config.json files that differed)
    # (a PeftModel's own names: it wraps the model as base_model.model)
    state = {f"base_model.model.{name}": t.detach().to("cpu").contiguous().clone()
             for name, t in get_peft_model_state_dict(model).items()}
    save_file(state, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    default_mode(folder / "adapter_model.safetensors")
    config.save_pretrained(str(folder))
