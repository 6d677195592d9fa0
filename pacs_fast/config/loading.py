"""A :class:`Config` from and to a dict, a YAML file and ``section.key=value`` overrides; ``--help``."""
from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import re
from pathlib import Path
from typing import Any

import yaml

from pacs_fast.config.schema import (CLIP_C_DEFAULTS, CLIP_DEFAULTS, AlgoConfig, Config, LearnerConfig, field_types,
                                     section_classes)

def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


# YAML 1.1's other booleans: a config file reads them as text (see _UniqueKeyLoader), a bool key takes them
_BOOL_WORDS = {"yes": True, "no": False, "on": True, "off": False, "true": True, "false": False}


def _plain(value: Any) -> Any:
    """A number read from YAML as its plain ``int`` / ``float`` (without its source text), inside lists and
    mappings too (a nested one reached the YAML dump of config.yaml, which cannot write it)."""
    if isinstance(value, _YamlInt):
        return int(value)
    if isinstance(value, _YamlFloat):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    return value


def _coerce(key: str, value: Any, typ) -> Any:
    """Checks ``value`` against the field type (ints are accepted for floats). A number read from YAML
    keeps its text for a ``str`` key (``run_name: 040`` is "040"); an integer YAML 1.1 reads as octal
    (``040`` = 32) or base 60 (``1:30`` = 90) is refused for a number key."""
    text = getattr(value, "yaml_text", None)
    if typ is str and text is not None:
        return text
    if typ in (int, float) and text is not None and (":" in text or isinstance(value, _YamlInt)
                                                      and re.fullmatch(r"[-+]?0[0-9_]+", text)):
        raise ValueError(f"config key {key!r}: {text} reads as {_plain(value)} in YAML 1.1 (octal / base 60); write "
                         "the number without leading zeros or a colon")
    value = _plain(value)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _BOOL_WORDS:  # a config file's yes / no / on / off
            return _BOOL_WORDS[value.lower()]
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # an integer of 400 digits
                raise ValueError(f"config key {key!r}: {value} is beyond a float's range") from None
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
            return [_plain(v) for v in value]
    elif typ is dict:
        if isinstance(value, dict):
            return _plain(dict(value))
    hint = (f" (a list in brackets: {key}=[a,b], or [a] for one)" if typ is list else
            " (true or false)" if typ is bool else
            f" (a mapping in braces: {key}={{name: value}})" if typ is dict else "")
    raise ValueError(f"config key {key!r} expects {getattr(typ, '__name__', typ)}, got "
                     f"{text if text is not None else repr(value)}{hint}")


def _unknown(key: str, valid: list[str]) -> ValueError:
    close = difflib.get_close_matches(key, valid, n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return ValueError(f"unknown config key {key!r}{hint}; see --help for the valid keys")


def all_keys() -> list[str]:
    return [f"{s}.{k}" for s, cls in section_classes().items() for k in field_types(cls)]


def set_value(cfg: Config, dotted: str, value: Any) -> None:
    """Sets ``cfg.<section>.<key> = value`` after checking the key and the value's type."""
    parts = dotted.split(".")
    if len(parts) == 1 and dotted in section_classes():  # (``learner=3``: "unknown key 'learner'" had said)
        raise ValueError(f"config key {dotted!r} is a section, not a key: give {dotted}.KEY=value (see --help)")
    if len(parts) != 2:
        raise _unknown(dotted, all_keys())
    section, key = parts
    sections = section_classes()
    if section not in sections:
        raise _unknown(dotted, all_keys())
    types = field_types(sections[section])
    if key not in types:
        raise _unknown(dotted, all_keys())
    setattr(getattr(cfg, section), key, _coerce(dotted, value, types[key]))


def from_dict(d: dict, cfg: Config | None = None) -> Config:
    """Applies a nested dict (as in the YAML file) onto ``cfg`` (default: a fresh Config)."""
    cfg = cfg if cfg is not None else Config()
    if not isinstance(d, dict):
        raise ValueError(f"config must be a mapping of sections, got {type(d).__name__}")
    for section, values in d.items():
        if section not in section_classes():
            raise _unknown(str(section), list(section_classes()))
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
    try:  # as a config file reads it (_UniqueKeyLoader)
        value = yaml.load(raw, Loader=_UniqueKeyLoader) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def _type_of(dotted: str):
    """The declared type of ``section.key`` (None for an unknown key: set_value reports it)."""
    section, _, key = dotted.partition(".")
    cls = section_classes().get(section)
    return field_types(cls).get(key) if cls is not None else None


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (PyYAML keeps the last one silently:
    ``beta: 1`` then ``beta: 2`` under ``algo:`` ran with 2, and a repeated section dropped the first)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *base``: its keys may be overridden here
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice in one mapping",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# Booleans as YAML 1.2 has them (true / false): YAML 1.1 also reads on / off / yes / no as booleans, so that
# ``packing: on`` in a config file was True for a key whose values are auto / on / off ("expects str, got True").
# A bool key takes those words as text (_coerce).
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers
            if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                       list("tTfF"))
# a float with an exponent and no point (1e-5, 9e-1) as YAML 1.2 reads it: YAML 1.1 made it text, which a float key
# converted but a list of floats (learner.betas=[9e-1,0.999]) kept, and refused
_EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$")
_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789"))


class _Dumper(yaml.SafeDumper):
    """``yaml.SafeDumper`` that quotes a string _UniqueKeyLoader would read as a float (``"1e3"``): YAML 1.1's dumper
    wrote it plain, so a run's config.yaml gave ``rollout.stop: ["1e3"]`` back as [1000.0] (refused at --resume) and
    a chat_template_kwargs text as a number (kept silently), to a --resume and to --config alike."""


_Dumper.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789"))


class _YamlInt(int):
    """An int read from YAML, with its source text (``yaml_text``): see _coerce."""


class _YamlFloat(float):
    """A float read from YAML, with its source text (``yaml_text``)."""


def _number_with_text(kind):
    construct = getattr(yaml.SafeLoader, f"construct_yaml_{'int' if kind is _YamlInt else 'float'}")

    def constructor(loader, node):
        out = kind(construct(loader, node))
        out.yaml_text = str(node.value)
        return out
    return constructor


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _number_with_text(_YamlInt))
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:float", _number_with_text(_YamlFloat))


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
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"config file {str(path)!r}:{where}: YAML syntax error: {what}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {str(path)!r} must hold a mapping of sections, got "
                         f"{type(_plain(data)).__name__}")  # (_plain: "int", not the loader's _YamlInt)
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | tuple = ()) -> Config:
    """Defaults, then the YAML file at ``path`` (if any), then ``section.key=value`` overrides."""
    cfg, _ = _load(path, overrides)
    return cfg


def _load(path, overrides) -> tuple[Config, Config]:
    """load_config's ``(config, the file's config alone before the defaults that follow other keys)``."""
    cfg = Config()
    given: set[str] = set()
    in_file = Config()
    if path:
        path = Path(path)
        if not path.is_file():
            what = ("is a folder" if path.is_dir() else "is not a regular file" if path.exists() else "does not exist")
            raise ValueError(f"config file {str(path)!r} {what}: give a YAML file")
        data = read_yaml(path)
        from_dict(data, cfg)
        given |= {f"{sec}.{k}" for sec, vals in data.items() if isinstance(vals, dict) for k in vals}
        in_file = copy.deepcopy(cfg)
    for text in overrides:
        key, value = parse_override(text)
        set_value(cfg, key, value)
        given.add(key)
    _batch_defaults_follow_prompts(cfg, given)
    _clip_defaults_follow_algorithm(cfg, given)
    return cfg, in_file


# keys whose default follows other keys (load_config), in the order they are derived: the mini-batch before the
# micro-batch that follows it
FOLLOWERS = {"learner.mini_batch_prompts": ("train.prompts_per_step",),
             "learner.micro_batch_prompts": ("learner.mini_batch_prompts",),
             "algo.clip_low": ("algo.name",), "algo.clip_high": ("algo.name",), "algo.clip_c": ("algo.name",)}


def _get(cfg: Config, dotted: str) -> Any:
    section, key = dotted.split(".")
    return getattr(getattr(cfg, section), key)


def kept_file_defaults(path: str | Path | None, overrides: list[str] | tuple = ()) -> list[str]:
    """One line per :data:`FOLLOWERS` key that the config file at ``path`` holds at the default of its own settings
    while an override changes what the key follows: the file's value is kept (a value given is kept), which a fresh
    run with those settings would not take. A run's ``config.yaml`` records such defaults (``algo.clip_low: 0.2``
    for PACS, ``learner.mini_batch_prompts: 4`` for ``train.prompts_per_step: 4``): given back as ``--config``
    with ``algo.name=gspo`` or ``train.prompts_per_step=64`` it trains with a GSPO clip 700x wider than GSPO's,
    or 16 optimiser steps a batch, without a word. ``train`` prints these as warnings."""
    if not path:
        return []
    cfg, in_file = _load(path, overrides)
    data = read_yaml(path)
    file_keys = {f"{sec}.{k}" for sec, vals in data.items() if isinstance(vals, dict) for k in vals}
    overridden = {parse_override(text)[0] for text in overrides}
    alone = copy.deepcopy(in_file)  # the file's config as it loads without overrides
    _batch_defaults_follow_prompts(alone, file_keys)
    _clip_defaults_follow_algorithm(alone, file_keys)
    own = copy.deepcopy(alone)  # the value each follower would have there had the file not set it
    for key in ("clip_low", "clip_high", "clip_c"):
        setattr(own.algo, key, getattr(AlgoConfig(), key))  # (the shared default, where the algorithm has none)
    _clip_defaults_follow_algorithm(own, set())
    own.learner.mini_batch_prompts = _largest_divisor(alone.train.prompts_per_step, LearnerConfig().mini_batch_prompts)
    own.learner.micro_batch_prompts = default_micro_batch_prompts(alone.learner.mini_batch_prompts)
    out = []
    for key, leaders in FOLLOWERS.items():
        changed = [k for k in leaders if _get(cfg, k) != _get(alone, k)]
        if key in file_keys and key not in overridden and _get(alone, key) == _get(own, key) and changed:
            fresh = copy.deepcopy(cfg)
            given = (file_keys | overridden) - {key}
            _batch_defaults_follow_prompts(fresh, given)
            _clip_defaults_follow_algorithm(fresh, given)
            if _get(fresh, key) != _get(cfg, key):
                out.append(f"{key}={_get(cfg, key)!r} comes from {str(path)!r}, where it is the default of its "
                           f"{changed[0]}={_get(alone, changed[0])!r}; with {changed[0]}={_get(cfg, changed[0])!r} "
                           f"the default is {_get(fresh, key)!r}, which a run without that line takes: give {key} "
                           f"to choose (the file's value is kept)")
    return out


def _clip_defaults_follow_algorithm(cfg: Config, given: set[str]) -> None:
    """``algo.clip_low`` / ``algo.clip_high`` / ``algo.clip_c`` that nobody set take ``algo.name``'s own defaults
    where it has some (``CLIP_DEFAULTS``: GSPO's 3e-4 / 4e-4, CISPO's 10 / 0.2, ...; ``CLIP_C_DEFAULTS``: DPPO's
    10000) instead of the shared 0.2 / 0.2 / 3.0; a value that was given is kept. The resolved values are what
    ``config.yaml`` records."""
    defaults = dict(zip(("clip_low", "clip_high"), CLIP_DEFAULTS.get(cfg.algo.name, ())))
    if cfg.algo.name in CLIP_C_DEFAULTS:
        defaults["clip_c"] = CLIP_C_DEFAULTS[cfg.algo.name]
    for key, value in defaults.items():
        if f"algo.{key}" not in given:
            setattr(cfg.algo, key, value)


def _largest_divisor(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0) if n >= 1 else cap


def _batch_defaults_follow_prompts(cfg: Config, given: set[str]) -> None:
    """The mini- and micro-batch sizes nobody set follow ``train.prompts_per_step``: the largest
    divisor of it up to their default (32), so ``train.prompts_per_step=4`` alone is a valid run (and
    a multiple of the data-parallel size wherever 32 is). A prompt count with no divisor near 32 (37:
    a mini-batch of 1) makes many optimiser steps per rollout batch: a hazard warning says so
    (:mod:`pacs_fast.config.hazards`). A value that was given (file or override) is kept as given and validated."""
    default = LearnerConfig().mini_batch_prompts
    if "learner.mini_batch_prompts" not in given:
        cfg.learner.mini_batch_prompts = _largest_divisor(cfg.train.prompts_per_step, default)
    if "learner.micro_batch_prompts" not in given:
        cfg.learner.micro_batch_prompts = default_micro_batch_prompts(cfg.learner.mini_batch_prompts)


def default_micro_batch_prompts(mini_batch_prompts: int) -> int:
    """``learner.micro_batch_prompts`` when nobody sets it: the largest divisor of the mini-batch up to
    the default (32)."""
    return _largest_divisor(mini_batch_prompts, LearnerConfig().micro_batch_prompts)


def save_config(cfg: Config, path: str | Path) -> None:
    """Writes the config as YAML atomically (a temporary file, fsync, then ``os.replace``)."""
    path = Path(path)
    # (before any file: a value YAML cannot write leaves none)
    text = yaml.dump(to_dict(cfg), Dumper=_Dumper, sort_keys=False)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")  # (pacs_fast.files.temporary_name: config imports none)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def help_text() -> str:
    """Every key with its type, default and help (used by ``--help``)."""
    lines = []
    defaults = Config()
    for section, cls in section_classes().items():
        lines.append(f"{section}:")
        for f in dataclasses.fields(cls):
            default = getattr(getattr(defaults, section), f.name)
            typ = field_types(cls)[f.name]
            lines.append(f"  {section}.{f.name} ({typ.__name__}, default {default!r})")
            lines.append(f"      {f.metadata.get('help', '')}")
    return "\n".join(lines)
