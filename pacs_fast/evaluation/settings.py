"""An eval folder's settings file (``run_config.json``): the sampling settings every samples file in the
folder was made with. A run into a folder holding samples made with other settings is refused (the results
would mix them); ``--overwrite`` deletes the samples of the benchmarks it asks for, and never another
benchmark's (hours of sampling at n = 512)."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from pacs_fast.config.model_files import (WEIGHT_FILES, hub_model_folder, hub_newest_commit, hub_repo_of,
                                          model_folder_problem)
from pacs_fast.config.reward_specs import VERIFIER
from pacs_fast.evaluation.args import UsageError, read_json
from pacs_fast.evaluation.results import LEGACY_SETTINGS, UNRECORDED_SAMPLING, samples_path
from pacs_fast.files import write_text_atomic
from pacs_fast.reward.time_limit import DEFAULT_TIME_LIMIT, MAX_TIME_LIMIT

SETTINGS_FILE = "run_config.json"
SAMPLING_KEYS = ("model", "temperature", "top_p", "top_k", "min_p", "max_tokens", "stop", "seed", "n", "system",
                 "instruction", "template_kwargs", "prompt_template")


def weights_stamp(model: str) -> dict[str, list[int]] | None:
    """``{file: [bytes, mtime_ns]}`` of the weight files (``*.safetensors``, ``*.bin``) of the model folder ``model``,
    recorded as the settings' ``weights``; None for a hub id or a folder without them. A folder whose weights were
    written again since its samples were drawn (a new export into the same folder) had a resume append the new model's
    samples to the old one's, and the results mixed the two without a word. Sizes and dates, not digests: reading a
    model's weights at every eval start would cost minutes; a file rewritten with the same bytes reads as changed
    (a Hugging Face cache snapshot's file: its blob's digest instead of its date)."""
    folder = Path(model)
    if not folder.is_dir():
        return None
    files = sorted({p for pattern in WEIGHT_FILES for p in folder.glob(pattern) if p.is_file()})
    return {p.name: [p.stat().st_size, _content_name(p) or p.stat().st_mtime_ns] for p in files} or None


def hub_snapshot(model: str, revision: str | None = None, out_dir: Path | None = None) -> tuple[str, str] | None:
    """``(snapshot folder, commit)`` when ``--model`` is a Hugging Face Hub id (``org/name``, no such folder here):
    the cache's folder of the commit the id resolves to (``--revision``'s, else the default branch's newest),
    downloaded when online (:func:`~pacs_fast.config.model_files.hub_model_folder`, as the trainer's ``model.path``);
    None for a model folder. The run loads that folder and records the commit (``revision``): the hub id alone named
    no weights, and a resume after the repository got a new commit appended the new model's samples to the old
    one's without a word. ``out_dir``: a resume's folder; when its samples were drawn from another commit of this id
    than the hub's newest (and no ``revision`` is given), that is one line before anything is downloaded (the
    settings check would refuse it after the download)."""
    if Path(model).expanduser().exists():
        return None
    drawn = recorded_revision(out_dir, model) if out_dir is not None and not revision else None
    newest = hub_newest_commit(model) if drawn else None
    if newest and newest != drawn:
        raise UsageError(f"{out_dir} holds samples drawn from commit {drawn} of --model {model}, whose newest commit "
                         f"is now {newest}: --revision {drawn} resumes on the one those samples were drawn from; "
                         f"another --out, or --overwrite, starts afresh (nothing was downloaded)")
    folder = hub_model_folder(model, "--model", revision)  # (a ValueError naming --model: not on the hub / cached)
    hub = hub_repo_of(folder)
    if hub is None:  # (a name without an org, "gpt2": transformers resolves it when it loads, as before)
        if revision:
            raise UsageError(f"--revision {revision}: --model {model} is not a hub id org/name (give the full id)")
        return None
    problem = model_folder_problem(folder, trust_key="--trust-remote-code")
    if problem:
        raise UsageError(f"--model {model} (commit {hub[1]}, {folder}){problem}")
    return str(folder), hub[1]


def _recorded(out_dir: Path, *keys: str) -> list[str | None]:
    """The settings file's text values of ``keys`` in ``out_dir``, each None where it records none (no settings file,
    an unreadable one: the settings check says why; --overwrite replaces it)."""
    try:
        settings = read_json(out_dir / SETTINGS_FILE, "run settings file") if (out_dir / SETTINGS_FILE).is_file() \
            else {}
    except UsageError:
        settings = {}
    settings = settings if isinstance(settings, dict) else {}
    return [settings.get(k) if isinstance(settings.get(k), str) else None for k in keys]


def recorded_revision(out_dir: Path, model: str) -> str | None:
    """The hub commit ``out_dir``'s samples of ``model`` were drawn from (the settings' ``revision``), or None: no
    samples, another model's, none recorded, no settings file or an unreadable one."""
    if not any(out_dir.glob("samples_*.jsonl")):
        return None
    recorded_model, revision = _recorded(out_dir, "model", "revision")
    return revision if recorded_model == model else None


def recorded_prompt_date(out_dir: Path) -> str | None:
    """The date a dating chat template's prompts were given in ``out_dir``'s samples (the settings' ``prompt_date``:
    pacs_fast/data/prompt_date.py), or None (none recorded, no settings file, an unreadable one: --overwrite's)."""
    return _recorded(out_dir, "prompt_date")[0]


def _content_name(path: Path) -> str | None:
    """The SHA-256 a Hugging Face cache snapshot's file links to (``blobs/<sha256>``): the weights' own digest, which
    a download again of the same revision keeps (its date does not); None for a file of its own."""
    name = path.resolve().name if path.is_symlink() else ""
    return name if re.fullmatch(r"[0-9a-f]{64}", name) else None


def _weights_change(old: dict, new: dict) -> str:
    """The weight files that differ between two :func:`weights_stamp` records, in words."""
    changed = sorted(n for n in set(old) | set(new) if old.get(n) != new.get(n))
    return "the weight files " + ", ".join(changed[:3]) + (", ..." if len(changed) > 3 else "") + \
        " were written again, added or removed since those samples were drawn"


def setting_differences(old: dict, config: dict) -> list[str]:
    """The sampling settings of ``config`` that differ from ``old`` (a settings file): ``n`` per benchmark
    both name, the engine and dtype where recorded resolved, the extraction."""
    diff = [k for k in SAMPLING_KEYS if k != "n" and old.get(k, UNRECORDED_SAMPLING.get(k)) != config.get(k)]
    diff += [f"n[{b}]" for b, n in config["n"].items() if b in old.get("n", {}) and old["n"][b] != n]
    # the engine and dtype (files written before they were recorded resolved: "auto" or none, not compared)
    diff += [k for k in ("engine", "dtype") if old.get(k) not in (None, "auto") and old[k] != config[k]]
    verifier = not config.get("reward_fn") or VERIFIER in config["reward_fn"].split(",")
    if verifier and old.get("extraction", "reference") != config["extraction"]:  # (recorded since it exists; read
        diff.append("extraction")  # by the verifier only: a --reward-fn without it scores alike under any)
    if verifier and "time_limit" in old and old["time_limit"] != config.get("time_limit"):  # (recorded since it
        diff.append("time_limit")  # exists: a comparison past it scores 0; folders from before it, not compared)
    if old.get("reward_fn", "") != config.get("reward_fn", ""):  # (recorded since it exists; "": the verifier)
        diff.append("reward_fn")
    if old.get("reward_fields", []) != config.get("reward_fields", []):  # (recorded when given)
        diff.append("reward_fields")
    if old.get("reward_weights", []) != config.get("reward_weights", []):  # (recorded for a mix of rewards)
        diff.append("reward_weights")
    if old.get("model") == config.get("model") and isinstance(old.get("weights"), dict) and config.get("weights") \
            and old["weights"] != config["weights"]:  # (recorded since 2026-12-06; the same folder, other weights)
        diff.append("weights")
    if old.get("model") == config.get("model") and old.get("revision") and config.get("revision") \
            and old["revision"] != config["revision"]:  # (recorded since 2026-12-07; the same hub id, another commit)
        diff.append("revision")
    if "rope_factors" in old and old["rope_factors"] != config.get("rope_factors"):  # (a longrope model's, recorded
        diff.append("rope_factors")  # since 2026-12-07: its long or short factors, which the longest row chose)
    return diff


def _values(diff: list[str], old: dict, config: dict) -> str:
    """``"seed 0 there, 3 here"`` for each setting of ``diff`` but the model (named apart): what the folder's samples
    were made with and what this run asks (the refusal named the keys only)."""
    def value(d: dict, key: str):
        if key.startswith("n["):
            return d.get("n", {}).get(key[2:-1])
        return d.get(key, LEGACY_SETTINGS.get(key))

    parts = [_weights_change(old["weights"], config["weights"]) if k == "weights" else
             f"{k} {value(old, k)!r} there, {value(config, k)!r} here" +
             (f" (the hub id's commit: --revision {old[k]} resumes on the one those samples were drawn from)"
              if k == "revision" else "") for k in diff if k != "model"]
    return "; ".join(parts) if parts else "the model"


def check_settings(out_dir: Path, config: dict, overwrite: bool):
    """Refuses samples in ``out_dir`` made with settings other than ``config``'s; returns the commit, a function
    that writes the settings file (merged with the old one: other benchmarks' ``n`` stay), after deleting, with
    ``overwrite``, the samples of the benchmarks ``config["n"]`` names. The caller commits once the run is sure to
    write samples (its checks passed, the model loaded): a run that fails before loses no sample (an
    ``--overwrite`` whose model had no weights had deleted hours of samples). Another benchmark's samples made
    with other settings (or beside an unreadable settings file) are a UsageError naming them, never deleted."""
    path = out_dir / SETTINGS_FILE
    asked = {samples_path(out_dir, b) for b in config["n"]}
    existing = sorted(out_dir.glob("samples_*.jsonl"))
    others = [p.name for p in existing if p not in asked]
    if existing and not path.exists() and (others or not overwrite):  # (a resume had appended under other settings)
        found = (f"{out_dir} holds samples ({', '.join(p.name for p in existing)}) but no {SETTINGS_FILE} (the "
                 f"settings they were made with)")
        if others:
            raise UsageError(f"{found}, among them {', '.join(others)}, of benchmarks this run does not ask for "
                             f"(--overwrite deletes only the samples of those asked for): use another --out, or "
                             f"delete them")
        raise UsageError(f"{found}: use another --out, or --overwrite to delete them and start afresh")
    if path.exists() and existing:
        try:
            old = read_json(path, "run settings file")
        except UsageError as e:
            if not overwrite:
                raise
            if others:  # (--overwrite alone with the asked benchmarks' samples starts afresh)
                raise UsageError(f"{e}; --overwrite keeps {', '.join(others)} (benchmarks this run does not ask "
                                 f"for), whose settings it cannot read: use another --out, or delete them") from None
            old = None
        if old is not None:
            diff = setting_differences(old, {**config, "n": {}} if overwrite else config)
            if diff and (not overwrite or others):
                whose = f"another model's ({old.get('model')}), " if "model" in diff else ""
                found = (f"{out_dir} holds samples made with other settings ({whose}{', '.join(diff)} differ: "
                         f"{_values(diff, old, config)}; see {path})")
                if others:  # --overwrite deletes only the asked benchmarks' samples: it cannot help here
                    raise UsageError(f"{found}, among them {', '.join(others)}, of benchmarks this run does not "
                                     f"ask for (--overwrite deletes only the samples of those asked for): use "
                                     f"another --out (or, without --out, another --label: the default --out "
                                     f"follows it), or delete them")
                raise UsageError(f"{found}. Use another --out (or, without --out, another --label: the default --out "
                                 f"follows it), or --overwrite to delete those samples and start afresh.")
            config = {**old, **config, "n": {**old.get("n", {}), **config["n"]},
                      "sources": {**old.get("sources", {}), **config.get("sources", {})}}

    def commit(extra: dict | None = None) -> None:  # (extra: what the run learns once it loads, a prompt_date)
        if overwrite:
            for p in existing:
                if p in asked:
                    p.unlink(missing_ok=True)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps({**config, **(extra or {})}, indent=2) + "\n")

    return commit


def report_time_limit(settings, path: Path) -> tuple[float, str | None]:
    """The verifier's ``--time-limit`` (seconds per response) that ``eval report`` extracts and compares the answers
    of maj@k under, and a note to print, or None: the one the folder's settings (``settings``, read from ``path``)
    record, the run's own (recorded since 2026-12-03); else (a folder from before, no settings file, a value that
    is not a number in (0, MAX_TIME_LIMIT]) the default, with a note saying so where the verifier scored (a
    ``--reward-fn`` without it has no answers to vote with)."""
    value = settings.get("time_limit") if isinstance(settings, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
            and 0 < value <= MAX_TIME_LIMIT:
        return float(value), None
    if isinstance(settings, dict) and settings.get("reward_fn"):
        return DEFAULT_TIME_LIMIT, None
    return DEFAULT_TIME_LIMIT, (f"{path} records no --time-limit (an eval from before it was recorded): maj@k "
                                f"extracts and compares answers under the default {DEFAULT_TIME_LIMIT:g} s per "
                                f"response")


def recorded_sources(out_dir: Path) -> dict[str, str]:
    """The dataset each benchmark of ``out_dir`` was sampled from, as its settings file records it (its
    ``sources``: a shipped name or an absolute path; ``{}`` for a folder without one, or written before they
    were recorded)."""
    try:
        sources = read_json(out_dir / SETTINGS_FILE, "run settings file").get("sources", {})
    except (UsageError, AttributeError):
        return {}
    return sources if isinstance(sources, dict) else {}
