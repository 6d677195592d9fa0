"""What a Hugging Face model folder must hold before a model is loaded from it, checked without loading it.

Both command lines call these before any model work (``model.path`` of ``python -m pacs_fast.train``,
``--model`` of ``python -m pacs_fast.eval``), so that a folder without its tokenizer, with a weights
file cut short by an interrupted copy, or with a tokenizer whose added tokens have no embedding row, is one
line naming the cause instead of a traceback from the loader (or, for a missing tokenizer, an empty
tokenizer that transformers builds without a word). Imports
nothing from the rest of the package.
"""
from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

from pacs_fast.config.per_layer import config_attr
from pacs_fast.config.remote_code import remote_code_problem, trusted

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


def run_folder_hint(folder: str | Path) -> str:
    """``"; ..."`` naming the checkpoint to give when ``folder`` is a training run (or its ``checkpoints``),
    else ``""``. A checkpoint, not the run, is a model folder."""
    folder = Path(folder)
    root = folder if folder.name == "checkpoints" else folder / "checkpoints"
    steps = sorted(p for p in root.glob("step_*") if (p / "config.json").is_file()) if root.is_dir() else []
    if not steps:
        return ""
    return f"; that is a training run: give one of its checkpoints, e.g. the newest, {steps[-1]}"


def unfinished_checkpoint_problem(folder: str | Path) -> str | None:
    """What is wrong with ``folder`` when it is a checkpoint a run was still writing when it was killed
    (``RUN/checkpoints/.tmp-step_*``: its files may be cut short; the run's resume removes it), else None."""
    folder = Path(folder)
    if folder.name.startswith(".tmp-") and folder.parent.name == "checkpoints":
        return (f"an unfinished checkpoint (a run killed while writing it left this temporary folder)"
                f"{run_folder_hint(folder.parent) or '; give a finished one, RUN/checkpoints/step_*'}")
    return None


def has_tokenizer(folder: str | Path) -> bool:
    """Whether ``folder`` holds one of :data:`TOKENIZER_FILES`."""
    return any((Path(folder) / f).is_file() for f in TOKENIZER_FILES)


def trained_positions(folder: str | Path) -> int | None:
    """The positions the model in ``folder`` was trained on (:func:`config_positions` of its
    config.json); None when unknown."""
    return config_positions(text_config(folder))


def config_positions(config: dict) -> int | None:
    """The positions a language model's config (a config.json's dict, or ``PretrainedConfig.to_dict()``)
    says it was trained on: ``max_position_embeddings`` or ``n_positions``; None when unknown: neither key,
    or a RoPE scaling (transformers 4's ``rope_scaling``, or a ``rope_parameters`` whose ``rope_type`` is
    not ``default``, as transformers 5 writes it), whose reach each scaling type defines differently."""
    n = config.get("max_position_embeddings") or config.get("n_positions")
    return int(n) if n and not _rope_scaled(config) else None


def _rope_scaled(config: dict) -> bool:
    if config.get("rope_scaling"):
        return True
    params = config.get("rope_parameters")
    if not isinstance(params, dict):
        return False
    # one dict, or one per layer type (Gemma 3's {"full_attention": {...}, "sliding_attention": {...}})
    each = [v for v in params.values() if isinstance(v, dict)] or [params]
    return any(p.get("rope_type", p.get("type", "default")) not in ("default", None) for p in each)


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def text_config(folder: str | Path) -> dict:
    """The language model's part of ``folder``'s config.json (its ``text_config`` when it has one); {} when
    unreadable."""
    c = _json(Path(folder).expanduser() / "config.json")
    c = c.get("text_config", c) if isinstance(c, dict) else {}
    return c if isinstance(c, dict) else {}


def longrope_threshold(folder: str | Path) -> int | None:
    """For a longrope model (Phi-3.5-mini, Phi-4-mini: ``rope_scaling`` / ``rope_parameters`` of type longrope), the
    length past which its long factors apply (``original_max_position_embeddings``); None for any other model."""
    c = text_config(folder)
    for rope in (c.get("rope_scaling"), c.get("rope_parameters")):
        if isinstance(rope, dict) and "longrope" in (rope.get("type"), rope.get("rope_type")):
            n = rope.get("original_max_position_embeddings") or c.get("original_max_position_embeddings")
            return int(n) if n else None
    return None


def moe_of(c) -> dict | None:
    """The mixture-of-experts MLP of a (text) config, a ``config.json`` dict or a transformers config:
    ``{"experts", "top_k", "width", "shared", "layers"}`` (routed experts, experts per token, an expert's
    intermediate width, the always-on shared experts' total width, the number of MoE layers); None for a dense
    model. Keys: ``num_experts`` (Qwen2/3-MoE, OLMoE) / ``num_local_experts`` (Mixtral) / ``n_routed_experts``
    (DeepSeek), ``num_experts_per_tok``, ``moe_intermediate_size`` (else ``intermediate_size``, Mixtral's),
    ``n_shared_experts`` x width / ``shared_expert_intermediate_size`` (Gemma 4's ``enable_moe_block``: its dense
    MLP, ``intermediate_size``, beside the experts; ``top_k_experts`` its top-k); dense layers: DeepSeek's
    ``first_k_dense_replace`` / ``moe_layer_freq``, Qwen's ``mlp_only_layers`` / ``decoder_sparse_step``. ERNIE 4.5's
    hub keys: ``moe_num_experts``, ``moe_k``, ``moe_num_shared_experts``, ``moe_layer_start_index`` /
    ``moe_layer_end_index`` / ``moe_layer_interval`` (read as a dense model, ERNIE-4.5-21B-A3B's 21.8B parameters had
    counted 3.35B); AFMoE's (Arcee Trinity) ``num_dense_layers`` and ``num_shared_experts``."""
    get = c.get if isinstance(c, dict) else (lambda key: getattr(c, key, None))
    experts = get("num_experts") or get("num_local_experts") or get("n_routed_experts") or get("moe_num_experts")
    if not isinstance(experts, int) or experts <= 1:
        return None
    layers, width = int(get("num_hidden_layers")), int(get("moe_intermediate_size") or get("intermediate_size"))
    if get("first_k_dense_replace") is not None:
        k, freq = int(get("first_k_dense_replace")), int(get("moe_layer_freq") or 1)
        moe = [i >= k and i % freq == 0 for i in range(layers)]
    elif get("num_dense_layers") is not None:  # (Arcee's AFMoE, Trinity: its first layers dense)
        moe = [i >= int(get("num_dense_layers")) for i in range(layers)]
    elif isinstance(get("moe_layer_start_index"), int):  # (ERNIE 4.5's: MoE from a layer to a layer, every n-th)
        start, end, every = get("moe_layer_start_index"), get("moe_layer_end_index"), get("moe_layer_interval") or 1
        end = layers - 1 if not isinstance(end, int) or end < 0 else end
        moe = [(i + 1) % int(every) == 0 and start <= i <= end for i in range(layers)]
    else:
        only, step = set(get("mlp_only_layers") or []), int(get("decoder_sparse_step") or 1)
        moe = [i not in only and (i + 1) % step == 0 for i in range(layers)]
    shared = int(get("n_shared_experts") or get("moe_num_shared_experts") or get("num_shared_experts") or 0) * width + \
        int(get("shared_expert_intermediate_size") or 0)
    if get("enable_moe_block"):  # (Gemma 4's MoE layers keep their dense MLP beside the experts: a shared expert)
        shared += int(get("intermediate_size") or 0)
    top_k = get("num_experts_per_tok") or get("top_k_experts") or get("moe_k")  # (Gemma 4's name, ERNIE 4.5's)
    return {"experts": experts, "top_k": int(top_k or 1), "width": width, "shared": shared, "layers": sum(moe)}


def mla_of(c) -> dict | None:
    """The multi-head latent attention of a (text) config (DeepSeek-V2/V3, Moonlight, MiniCPM3), a ``config.json``
    dict or a transformers config: ``{"q_lora", "kv_lora", "nope", "rope", "v"}`` (``q_lora_rank``, 0 for a plain
    query projection; ``kv_lora_rank``; ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``); None for other
    attention. Its projections are not ``heads x head_dim`` wide, and transformers' cache holds the
    ``kv_lora_rank + qk_rope_head_dim`` latent a token instead of keys and values."""
    get = c.get if isinstance(c, dict) else (lambda key: getattr(c, key, None))
    if not get("kv_lora_rank") or not get("qk_nope_head_dim") or not get("v_head_dim"):
        return None
    return {"q_lora": int(get("q_lora_rank") or 0), "kv_lora": int(get("kv_lora_rank")),
            "nope": int(get("qk_nope_head_dim")), "rope": int(get("qk_rope_head_dim") or 0),
            "v": int(get("v_head_dim"))}


def router_aux_loss(folder: str | Path) -> float | None:
    """``router_aux_loss_coef`` of a mixture-of-experts config that asks for its router's load-balancing loss in
    training (``output_router_logits: true``: transformers' forward then adds ``coef x aux_loss`` to its loss, and
    TRL's GRPOTrainer adds it to the policy loss); None otherwise (the checkpoints of Qwen3-MoE and Mixtral
    say false)."""
    c = text_config(folder)
    if c.get("output_router_logits") is not True:
        return None
    return float(c.get("router_aux_loss_coef") or 0.0)


def tokenizer_ids(folder: str | Path) -> int | None:
    """One past the largest token id the tokenizer files of ``folder`` define (its vocabulary and added tokens:
    ``tokenizer.json``, ``tokenizer_config.json``'s ``added_tokens_decoder``); None when neither is readable."""
    folder = Path(folder).expanduser()
    ids = []
    tok = _json(folder / "tokenizer.json")
    if isinstance(tok, dict):
        vocab = (tok.get("model") or {}).get("vocab")
        if isinstance(vocab, dict):
            ids += [v for v in vocab.values() if isinstance(v, int)]
        elif isinstance(vocab, list):  # Unigram: [token, score] pairs, ids in order
            ids.append(len(vocab) - 1)
        ids += [t["id"] for t in tok.get("added_tokens") or [] if isinstance(t, dict) and isinstance(t.get("id"), int)]
    cfg = _json(folder / "tokenizer_config.json")
    if isinstance(cfg, dict) and isinstance(cfg.get("added_tokens_decoder"), dict):
        ids += [int(k) for k in cfg["added_tokens_decoder"] if str(k).isdigit()]
    return max(ids) + 1 if ids else None


def vocab_problem(folder: str | Path, ids: int | None = None) -> str | None:
    """Why the tokenizer of ``folder`` does not fit its model, or None: a token id past the model's embedding /
    LM-head rows (``vocab_size`` of config.json), as tokens added to a tokenizer without resizing the model
    leave; such an id fails in the embedding lookup (a traceback after loading) or gets no log-prob.
    ``ids``: the loaded tokenizer's ``len`` (default: read from the tokenizer files)."""
    rows = text_config(folder).get("vocab_size")
    ids = tokenizer_ids(folder) if ids is None else ids
    if not isinstance(rows, int) or ids is None or ids <= rows:
        return None
    return (f"its tokenizer has token ids up to {ids - 1} but the model has {rows} embedding rows (vocab_size in "
            f"config.json): ids {rows}-{ids - 1} (tokens added to the tokenizer) have no row; resize the model's "
            f"embeddings to the tokenizer (model.resize_token_embeddings(len(tokenizer)), then save_pretrained)")


def safetensors_problem(path: str | Path) -> str | None:
    """Why the safetensors file ``path`` cannot be loaded, or None. Reads only its header: 8 bytes of
    header length, the JSON header, then every tensor's ``data_offsets`` must end within the file, and the
    file must end where the last tensor does (a copy cut short, or bytes appended, otherwise)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{path} is cut short ({size} bytes: not even a safetensors header)"
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            return f"{path} is cut short ({size:,} bytes, its header alone says {n + 8:,})"
        try:
            header = json.loads(f.read(n))
            ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return f"{path} is not a safetensors file (unreadable header)"
    expected = 8 + n + max(ends, default=0)
    if size != expected:
        return (f"{path} is cut short ({size:,} bytes of the {expected:,} its header describes)" if size < expected
                else f"{path} has {size - expected:,} bytes after its last tensor (a damaged file)")
    return None


# the JSON files a model folder's tokenizer and generation read beside config.json (transformers reads a damaged
# generation_config.json with a logged warning and goes on without its stop ids and sampling defaults)
MODEL_JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                    "vocab.json", "generation_config.json")


def json_file_problem(folder: str | Path, names=MODEL_JSON_FILES) -> str | None:
    """``"<file> is not valid JSON (...)"`` for the first of ``names`` in ``folder`` that does not parse (a partial
    download or a damaged copy), else None."""
    for name in names:
        file = Path(folder) / name
        if not file.is_file():
            continue
        try:
            json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            return f"{file} is not valid JSON ({type(e).__name__}: {e})"
    return None


def config_problem(folder: str | Path) -> str | None:
    """Why transformers cannot build the configuration of ``folder``'s ``config.json`` (its own checks: e.g.
    ``layer_types`` of another length than ``num_hidden_layers``), or None. Without this a damaged config
    passed every check and stopped the run with transformers' traceback when the model loaded."""
    where = Path(folder) / "config.json"
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(folder), trust_remote_code=trusted())
    except Exception as e:  # noqa: BLE001 - any reason it cannot be read is the user's to see, in one line
        text = " ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
        return f"{where} cannot be read by transformers: {text[:300]}"
    shape = _shape_problem(getattr(config, "text_config", None) or config)
    return f"{where}: {shape}" if shape else None


def _shape_problem(c) -> str | None:
    """A decoder shape no model can have (transformers builds the config, then fails loading the weights with a
    reshape error): sizes below 1, heads that do not split the hidden size or group the key / value heads."""
    sizes = {k: config_attr(c, k) for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                                             "num_attention_heads", "num_key_value_heads")}
    bad = [f"{k}={v}" for k, v in sizes.items() if isinstance(v, int) and v < 1]
    if bad:
        return f"{', '.join(bad)}: must be >= 1"
    heads, kv, hidden = sizes["num_attention_heads"], sizes["num_key_value_heads"], sizes["hidden_size"]
    if isinstance(heads, int) and isinstance(kv, int) and heads % kv:
        return f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}"
    if config_attr(c, "head_dim") is None and isinstance(heads, int) and isinstance(hidden, int) and hidden % heads:
        return f"hidden_size={hidden} is not a multiple of num_attention_heads={heads} (and no head_dim is given)"
    return None


SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_INDEX_NAME = "model.safetensors.index.json"


def safetensors_weight_files(folder: str | Path) -> list[Path]:
    """The safetensors files a load of the model (or checkpoint) folder ``folder`` reads, chosen as transformers'
    ``from_pretrained`` chooses them (``modeling_utils._get_resolved_checkpoint_files``, ``utils.hub.
    get_checkpoint_shard_files``): ``model.safetensors`` when it is there; else the files that
    ``model.safetensors.index.json``'s ``weight_map`` names (sorted, each once). No other ``*.safetensors`` of the
    folder is read: a stale file beside shards and their index, ``adapter_model.safetensors``,
    ``consolidated.safetensors`` of another format, draft / MTP weights (read too, they failed on unknown names or
    replaced the model's tensors of the same name). One source for every reader of a folder's weights: the megatron
    learner's model load and a resume (:mod:`pacs_fast.learner.hf_folder`), the weight sync's names and shapes
    (:mod:`pacs_fast.rollout.weight_sync`).

    Raises FileNotFoundError (one line) when the index names a file the folder lacks (naming the index and the
    file), or when the folder has neither file (transformers does not load such a folder either: its
    ``*.safetensors``, if any, are not the model's by name); ValueError when the index is not a safetensors index's
    JSON."""
    folder = Path(folder)
    if (folder / SAFE_WEIGHTS_NAME).is_file():
        return [folder / SAFE_WEIGHTS_NAME]
    index = folder / SAFE_INDEX_NAME
    if not index.is_file():
        raise FileNotFoundError(f"{folder} has neither {SAFE_WEIGHTS_NAME} nor {SAFE_INDEX_NAME} (the weight files "
                                f"transformers loads a model folder from)")
    try:
        names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{index} is unreadable (not the JSON of a safetensors index: {type(e).__name__})") from None
    if not all(isinstance(n, str) for n in names):
        raise ValueError(f"{index} is unreadable (its weight_map names a file that is not a string)")
    for name in names:
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{index} names {name}, which the folder lacks")
    return [folder / name for name in names]


def weights_problem(folder: str | Path) -> str | None:
    """Why the weights in ``folder`` cannot be loaded, or None: a ``*.safetensors`` file that
    :func:`safetensors_problem` finds damaged, or a shard that ``model.safetensors.index.json`` names and
    the folder lacks. Folders without safetensors (``.bin`` weights, or a hub id) are not checked."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            return f"{index} is unreadable (not the JSON of a safetensors index)"
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            return f"{index} names {len(missing)} shard(s) the folder lacks ({', '.join(missing[:3])})"
    for path in sorted(folder.glob("*.safetensors")):
        problem = safetensors_problem(path)
        if problem:
            return problem
    return None


# the weight files transformers loads a model folder from (safetensors, with or without an index; PyTorch's .bin)
WEIGHT_FILES = ("*.safetensors", "*.bin")
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# what a model folder needs (config, tokenizer, weights); a hub repository's other formats (gguf, onnx, flax,
# tf, the original checkpoints) are left on the hub
HUB_MODEL_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja", "*.py"]


def broken_link_problem(folder: str | Path) -> str | None:
    """What is wrong with ``folder`` when some of its files are symbolic links to nothing, else None: a snapshot
    folder of the Hugging Face cache (``models--org--name/snapshots/<commit>``, whose files link to ``../../blobs``)
    copied without its blobs (``cp -r``), or a blob deleted. Such a weights file raised FileNotFoundError from the
    folder's check (a traceback, before 2026-12-06), a config.json or tokenizer file was reported missing."""
    try:
        broken = sorted(p for p in Path(folder).iterdir() if p.is_symlink() and not p.exists())
    except OSError:
        return None
    if not broken:
        return None
    more = f" (and {len(broken) - 1} more such link(s))" if len(broken) > 1 else ""
    return (f"{broken[0]} is a symbolic link to {os.readlink(broken[0])}, which does not exist{more}: a Hugging Face "
            f"cache snapshot copied without its blobs? copy the files themselves (cp -rL)")


def model_folder_problem(path: str | Path, trust_key: str = "model.trust_remote_code=true") -> str | None:
    """What keeps the existing ``path`` from being a usable Hugging Face model folder, as the rest of a sentence
    that starts with its name (``" is a file; ..."``, ``": <problem>"``), else None: a file, an unfinished
    checkpoint, no ``config.json``, no tokenizer files, a config, tokenizer or generation JSON file, weights or
    vocabulary that cannot load, code of its own this process does not run (``trust_key`` names the setting that
    runs it: :mod:`pacs_fast.config.remote_code`). Read by ``model.path`` (pacs_fast/config/paths.py) and the eval
    command's ``--model`` (pacs_fast/evaluation/args.py)."""
    path = Path(path)
    if not path.is_dir():
        return (f" is a file; give the Hugging Face model folder (the one holding config.json)"
                f"{run_folder_hint(path.parent)}")
    problem = unfinished_checkpoint_problem(path) or broken_link_problem(path)
    if problem:
        return f": {problem}"
    if (path / "adapter_config.json").is_file() and not (path / "config.json").is_file():  # (a LoRA run's adapter/)
        return (" is a PEFT adapter folder (the LoRA adapters alone, for PeftModel.from_pretrained on their base); "
                "give the model folder that holds the merged weights" + (f", {path.parent}" if
                                                                           (path.parent / "config.json").is_file()
                                                                           else ""))
    if not (path / "config.json").is_file():
        return f" has no config.json: not a Hugging Face model folder{run_folder_hint(path)}"
    if (path / "adapter_config.json").is_file():  # (a PEFT adapter saved into a model's folder, e.g. its merge's)
        return (" holds a PEFT adapter (adapter_config.json) beside config.json: transformers with PEFT loads the "
                "folder's weights with the adapter on top (twice, if they are its merge), vLLM the weights alone, and "
                "the trainer cannot train the frozen adapter; move adapter_config.json and adapter_model.* out of it")
    if not has_tokenizer(path):  # transformers would build an empty tokenizer without a word
        return f" has no tokenizer files ({' / '.join(TOKENIZER_FILES)}): copy the model's tokenizer into that folder"
    problem = remote_code_problem(path, trust_key) or config_problem(path)
    if problem:
        return f": {problem}"
    problem = json_file_problem(path)
    if problem:
        return f": {problem}; copy the model's files again"
    if not any(next(path.glob(pattern), None) for pattern in WEIGHT_FILES):
        return f" has no weights file ({' or '.join(WEIGHT_FILES)}): copy the model's weights into that folder"
    problem = weights_problem(path)
    if problem:
        return f": {problem}; copy the model's weights again"
    problem = vocab_problem(path)
    return f": {problem}" if problem else None


def hf_hub_offline() -> bool:
    """Whether Hugging Face's offline mode is on (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``, as
    huggingface_hub reads them: 1 / true / yes / on)."""
    return any(os.environ.get(k, "").lower() in ("1", "true", "yes", "on")
               for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_repo_of(folder: str | Path | None) -> tuple[str, str] | None:
    """``(repo id, revision)`` when ``folder`` is a snapshot folder of the Hugging Face cache
    (``.../models--org--name/snapshots/<commit>``, what :func:`hub_model_folder` gives for ``org/name``), else None.
    The inverse of :func:`hub_model_folder`: a run given a hub id records the snapshot folder, a path of this
    machine's cache; what leaves the run for other machines (a PEFT adapter's base) names the hub id instead."""
    if not folder:
        return None
    parts = Path(folder).parts
    if len(parts) < 3 or parts[-2] != "snapshots" or not parts[-3].startswith("models--"):
        return None
    repo = parts[-3][len("models--"):].split("--")
    name = "/".join(repo)
    return (name, parts[-1]) if len(repo) == 2 and _REPO_ID.fullmatch(name) else None


def hub_newest_commit(name: str) -> str | None:
    """The commit the hub id ``name``'s default branch is at now (one request: nothing is downloaded); None offline,
    for a name not shaped like a hub id, or when the hub does not answer (the download then says why)."""
    if hf_hub_offline() or not _REPO_ID.fullmatch(name) or name.startswith((".", "~")):
        return None
    try:
        from huggingface_hub import HfApi

        return HfApi().model_info(name).sha
    except Exception:  # noqa: BLE001 - not found, gated, no network: hub_model_folder's download names it
        return None


def hub_model_folder(name: str, key: str = "model.path", revision: str | None = None, *,
                     bin_weights: bool = False) -> Path | None:
    """The local snapshot folder of the Hugging Face Hub model ``name`` (``org/model``) at ``revision`` (a branch,
    tag or commit; default: the default branch's newest commit), downloaded (config, tokenizer, safetensors
    weights) or, offline (``HF_HUB_OFFLINE=1``), taken from the cache; ``None`` when ``name`` is not shaped like a
    hub id. The folder is named by the commit it holds (:func:`hub_repo_of`). ValueError naming ``key`` when the
    hub (or the cache) does not give it. A repository without safetensors (``pytorch_model.bin``, older models) gets
    its ``*.bin`` weights too, from the same commit (``bin_weights``: at once)."""
    if not _REPO_ID.fullmatch(name) or name.startswith((".", "~")):
        return None
    from huggingface_hub import snapshot_download

    offline = hf_hub_offline()
    at = f" at revision {revision!r}" if revision else ""
    try:
        folder = Path(snapshot_download(name, revision=revision, local_files_only=offline,
                                        allow_patterns=HUB_MODEL_FILES + ["*.bin"] * bin_weights))
    except Exception as e:  # not found, gated, no network, not cached offline
        if offline:
            raise ValueError(f"{key} {name!r}{at} is not a folder here, nor in the Hugging Face cache (offline: "
                             f"HF_HUB_OFFLINE); give a model folder, or a hub id that is cached") from e
        why = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ValueError(f"{key} {name!r}{at} is not a folder here, and the Hugging Face Hub did not give it "
                         f"({type(e).__name__}{': ' + why[:200] if why else ''}); give a model folder, or a hub id "
                         f"you can download") from e
    commit = hub_repo_of(folder)
    if not bin_weights and commit and not any(folder.glob("*.safetensors")):  # (pinned: the commit just resolved)
        return hub_model_folder(name, key, commit[1], bin_weights=True)
    return folder
