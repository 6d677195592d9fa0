"""The user docs name only things that exist.

README.md, docs/*.md and bench/README.md are read the way a newcomer reads them, literally: every config key
(``section.key``, ``section.key=value``), every flag of a ``python -m pacs_fast.train`` / ``eval`` / ``eval
compare`` / ``eval report`` / ``experiment`` command line (and every flag named alone), every metric name
(``reward/mean``, ``learner/grad_norm``, ...), every ``python -m pacs_fast.X`` module and every repo-relative path
in backticks or a link must exist: the keys in the config schema (a value of a key with a fixed set of choices
accepted by the project's own :func:`pacs_fast.config.validate`), the flags in the CLIs' own argparse parsers
(exactly, not as an abbreviation), the metrics in what a tiny training run logs (``metrics.jsonl``) or, for
those only options that are off by default log, as a string literal of the code, the modules importable, the
paths in the checkout. Tokens the patterns catch that are not this project's names (verl's and OpenRLHF's keys
in the integration docs, file names that look like keys, ...) are in the allow-lists below, each with its reason.

The extractors are plain functions of a document's text, so the self-tests at the end show that a typo put
into a copy of README.md's text is caught.
"""
from __future__ import annotations

import argparse
import ast
import fnmatch
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

from pacs_fast.config import Config, all_keys, parse_override, set_value, validate
from pacs_fast.config.schema import section_classes

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")), "bench/README.md"]
SECTIONS = tuple(section_classes())  # model, data, warmup, rollout, algo, learner, train, reward, correction

# -- allow-lists: tokens the patterns catch that are not pacs_fast names, each for the documents it is in --------
I, T, B = "docs/INTEGRATIONS.md", "docs/TRACKERS.md", "bench/README.md"

#: dotted tokens with a section's name in front that are not config keys
NOT_CONFIG_KEYS = {
    "model.generate": (("README.md", B), "transformers' generate method (the HF engine's sampler option)"),
    "learner.update": ((B,), "the learner object's update method that bench_learner_memory.py times"),
    "data.train_batch_size": ((I,), "verl's own config key (its data section), in the verl adapter's notes"),
    "train.micro_batch_size": ((I,), "OpenRLHF's own argument (args.train.micro_batch_size)"),
    "algo.kl.init_coef": ((I,), "OpenRLHF's own argument (args.algo.kl.init_coef)"),
    "algo.advantage.is_correction_level": ((I,), "OpenRLHF 0.11.2's own argument"),
    "algo.advantage.is_correction_enable": ((I,), "OpenRLHF 0.11.0's own argument"),
    "reward.stop_properly_penalty_coef": ((I,), "OpenRLHF's own argument"),
}
#: a key's last part that makes it a file name (``learner.pt``, ``model.safetensors``), not a key
FILE_SUFFIXES = {"py", "md", "pt", "json", "jsonl", "yaml", "png", "sh", "txt", "safetensors", "tgz"}

#: metric-looking tokens that are not names a pacs_fast run logs
NOT_OUR_METRICS = {
    "perf/throughput": ((T,), "verl's name, in the table's column of verl's nearest metrics"),
    "eval/eval/acc": ((T,), "the name TensorBoard wrote before 2026-11-29 (the doc says so)"),
    "eval/pass_at_n": ((T,), "MLflow's spelling of eval/pass@n (it writes @ as _at_; the doc says so)"),
}

#: repo-relative paths that are not in the checkout
NOT_REPO_PATHS = {
    "bench/results/pacs_loss_*.json": ((B,), "what bench_pacs_loss.py writes (bench/results/* is git-ignored)"),
}

#: flags named alone (a backticked ``--flag ...``) that belong to other tools' command lines
OTHER_TOOLS_FLAGS = {
    "--start-method": (("README.md",), "torchrun's `--start-method fork --run-path` (tests/forked_torchrun.py)"),
}


def allowed(table: dict, token: str, doc: str) -> bool:
    return doc in table.get(token, ((),))[0]


# -- the documents ---------------------------------------------------------------------------------------------


def read_docs() -> dict[str, str]:
    return {name: (ROOT / name).read_text(encoding="utf-8") for name in DOCS}


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


@dataclass
class Snippet:
    """A piece of code in a document: one logical line of a fenced block, or one inline code span."""
    line: int
    text: str
    fenced: bool


def snippets(text: str) -> list[Snippet]:
    """Fenced code blocks (one snippet per logical line, ``\\``-continued lines joined) and inline code spans
    (which may run over a line break, as Markdown's do)."""
    out, lines, kept = [], text.split("\n"), []
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith("```"):
            j = i + 1
            logical, first = "", None
            while j < len(lines) and not lines[j].lstrip().startswith("```"):
                part = lines[j]
                first = j + 1 if first is None else first
                if part.rstrip().endswith("\\"):
                    logical += part.rstrip()[:-1] + " "
                else:
                    out.append(Snippet(first, logical + part, True))
                    logical, first = "", None
                j += 1
            if logical:
                out.append(Snippet(first, logical, True))
            kept.extend([""] * (j - i + 1))  # (the block's lines, blanked for the inline spans' line numbers)
            i = j + 1
            continue
        kept.append(lines[i])
        i += 1
    prose = "\n".join(kept)
    for m in re.finditer(r"`([^`]+)`", prose):
        out.append(Snippet(line_of(prose, m.start()), m.group(1), False))
    return out


# -- config keys -----------------------------------------------------------------------------------------------

KEY_RE = re.compile(r"(?<![\w./$-])((?:" + "|".join(SECTIONS) + r")\.[A-Za-z_*][\w*]*(?:\.[A-Za-z_]\w*)*)"
                    r"(=(?:(?!,(?:" + "|".join(SECTIONS) + r")\.)[^\s`])*)?")  # (an --arm's list: key=v,key=v)
SIBLING_RE = re.compile(r"`((?:" + "|".join(SECTIONS) + r")\.\w+)` / `([a-z_]\w*)`")
# a value that stands for one the reader picks: N, K, F, s, <more>, $VAR, ...
PLACEHOLDER = re.compile(r"^(?:[A-Za-z]|<[^>]*>|\$\w+|\.\.\.|[A-Z][A-Z_]*)$")


def _choice_keys() -> dict[str, tuple]:
    """The keys with a fixed set of choices: as validate() checks a default config (every ``_choice`` call)."""
    from pacs_fast.config import validation

    seen, original = {}, validation._choice

    def record(key, value, choices):
        seen[key] = tuple(choices)
        original(key, value, choices)

    with mock.patch.object(validation, "_choice", record):
        validate(Config(), world=1)
    # correction.is_level / rs_level check their choices inline (validation._validate_correction)
    seen["correction.is_level"] = seen["correction.rs_level"] = ()
    return seen


CHOICE_KEYS = _choice_keys()


def _clean_value(raw: str) -> str:
    """A value as the shell hands it on: quotes removed, the prose's closing punctuation dropped."""
    value = raw
    for quote in "\"'":
        if value.count(quote) % 2:  # (the closing quote of an --arm "NAME:key=v,key=v" around the list)
            value = value.replace(quote, "")
    while value and value[-1] in ").,;:" and value.count("(") < value.count(")") + (value[-1] != ")"):
        value = value[:-1]
    try:
        parts = shlex.split(value)
    except ValueError:
        return value
    return parts[0] if len(parts) == 1 else value


def value_problem(key: str, value: str) -> str | None:
    """Why ``key=value`` is refused by the config (its type, or its choices through validate()), else None."""
    if PLACEHOLDER.match(value) or "<" in value or "$" in value:
        return None
    if value.count("[") != value.count("]") or value.count("{") != value.count("}"):
        return None  # (a list or mapping that the prose's line break or a space cut: not the whole value)
    for alternative in value.split("|") if key in CHOICE_KEYS and "|" in value else [value]:
        cfg = Config()
        try:
            k, v = parse_override(f"{key}={alternative}")
            set_value(cfg, k, v)
        except ValueError as e:
            return str(e)
        if key not in CHOICE_KEYS:
            continue
        if key.startswith("correction."):
            cfg.algo.name = "grpo"  # (PACS takes the sequence forms only; the baselines take every level)
        try:
            validate(cfg, world=1)
        except ValueError as e:
            if str(e).startswith(f"{key} must be one of"):
                return str(e)
    return None


def config_problems(text: str, doc: str = "README.md") -> list[str]:
    keys = set(all_keys())
    out = []
    for m in KEY_RE.finditer(text):
        key, raw = m.group(1), (m.group(2) or "")[1:]
        where = f"{doc}:{line_of(text, m.start())}"
        if allowed(NOT_CONFIG_KEYS, key, doc) or key.rsplit(".", 1)[-1] in FILE_SUFFIXES:
            continue
        if "*" in key:
            if not fnmatch.filter(keys, key):
                out.append(f"{where}: {key} matches no config key")
            continue
        if key not in keys:
            out.append(f"{where}: {key} is not a config key")
            continue
        if raw:
            why = value_problem(key, _clean_value(raw))
            if why:
                out.append(f"{where}: {key}={raw}: {why}")
    for m in SIBLING_RE.finditer(text):  # `reward.noise_fp` / `noise_fn`: the second is a key of the same section
        key = f"{m.group(1).split('.')[0]}.{m.group(2)}"
        if key not in keys:
            out.append(f"{doc}:{line_of(text, m.start())}: {key} (`{m.group(2)}` after `{m.group(1)}`) is not a "
                       f"config key")
    return out


# -- command lines ---------------------------------------------------------------------------------------------


class _Captured(BaseException):
    def __init__(self, parser):
        self.parser = parser


def _capture(call) -> argparse.ArgumentParser:
    """The parser a CLI builds, taken when it parses (the CLIs build theirs inside the command's function)."""
    def grab(self, *args, **kwargs):
        raise _Captured(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", grab), \
            mock.patch.object(argparse.ArgumentParser, "parse_intermixed_args", grab):
        try:
            call()
        except _Captured as c:
            return c.parser
    raise AssertionError(f"{call} parsed no arguments")


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from pacs_fast import eval as eval_cli, experiment_args, train
    from pacs_fast.evaluation.compare import compare

    return {"train": _capture(lambda: train.parse_args([])),
            "eval": _capture(lambda: eval_cli.run([])),
            "eval compare": _capture(lambda: compare([])),
            "eval report": _capture(lambda: eval_cli.report([])),
            "experiment": _capture(lambda: experiment_args.parse_args([]))}


PARSERS = _parsers()
SHELL_ENDS = {"&&", "||", ";", "|", ">", ">>", "2>&1", "&"}


def commands(text: str, *, fenced_only: bool = False) -> list[tuple[int, str, list[str]]]:
    """(line, CLI, its arguments) of every ``-m pacs_fast.train|eval|experiment`` in the document's code (in its
    code blocks only: the whole commands, not a prose excerpt)."""
    out = []
    for s in snippets(text):
        if fenced_only and not s.fenced:
            continue
        for m in re.finditer(r"-m pacs_fast\.(train|eval|experiment)\b(?!\.)", s.text):
            rest = s.text[m.end():]
            try:
                tokens = shlex.split(rest, comments=True)
            except ValueError:  # (an unclosed quote in prose: whitespace splits it)
                tokens = rest.split()
            args = []
            for t in tokens:
                if t in SHELL_ENDS:
                    break
                args.append(t)
            cli = m.group(1)
            if cli == "eval" and args and args[0] in ("compare", "report", "run"):
                cli, args = ("eval" if args[0] == "run" else f"eval {args[0]}"), args[1:]
            out.append((s.line, cli, args))
    return out


def flag_value_problem(cli: str, flag: str, value: str | None) -> str | None:
    """Why a value is refused by a flag with a fixed set of choices (argparse's ``choices``; the experiment
    runner's ``--arms``: its presets), else None."""
    if value is None or value.startswith("-") or PLACEHOLDER.match(value) or "$" in value or "<" in value:
        return None
    if cli == "experiment" and flag == "--arms":
        from pacs_fast.experiment_args import PRESETS

        bad = [a for a in value.split(",") if a and a not in PRESETS]
        return f"--arms {value}: no preset {', '.join(bad)}" if bad else None
    choices = PARSERS[cli]._option_string_actions[flag].choices
    if choices is not None and value not in choices:
        return f"{flag} {value}: not one of {', '.join(map(str, choices))}"
    return None


def flag_problems(text: str, doc: str = "README.md") -> list[str]:
    out = []
    for line, cli, args in commands(text):
        known = PARSERS[cli]._option_string_actions
        for i, a in enumerate(args):
            flag, eq, value = a.partition("=")
            if not flag.startswith("-") or re.fullmatch(r"-\d.*", flag):
                continue
            if flag not in known:
                out.append(f"{doc}:{line}: python -m pacs_fast.{cli} has no flag {flag}")
                continue
            takes = known[flag].nargs != 0
            why = flag_value_problem(cli, flag, value if eq else (args[i + 1] if takes and i + 1 < len(args)
                                                                  else None))
            if why:
                out.append(f"{doc}:{line}: python -m pacs_fast.{cli} {why}")
    return out


def whole_command_problems(text: str, doc: str = "README.md") -> list[str]:
    """A command of a code block parses whole, as its CLI's parser reads it (required flags, values' types)."""
    import contextlib
    import io

    out = []
    for line, cli, args in commands(text, fenced_only=True):
        parser = PARSERS[cli]
        try:
            with contextlib.redirect_stderr(io.StringIO()) as err, contextlib.redirect_stdout(io.StringIO()):
                (parser.parse_intermixed_args if cli == "train" else parser.parse_args)(args)
        except (SystemExit, Exception) as e:  # (argparse exits; the eval CLI's parser raises its UsageError)
            why = str(e) if not isinstance(e, SystemExit) else err.getvalue().strip().splitlines()[-1]
            if not (cli == "train" and "--help" in args):
                out.append(f"{doc}:{line}: python -m pacs_fast.{cli} {' '.join(args)}: {why}")
    return out


def _bench_flags() -> set[str]:
    """The flags the benchmark and GPU scripts define (bench/**/*.py argparse, bench/**/*.sh case labels)."""
    flags = set()
    for path in (ROOT / "bench").rglob("*"):
        if path.suffix in (".py", ".sh") and path.is_file():
            flags |= set(re.findall(r"""["'(|\s](--[a-z][\w-]*)""", path.read_text(encoding="utf-8")))
    return flags


BENCH_FLAGS = _bench_flags()


def lone_flag_problems(text: str, doc: str = "README.md") -> list[str]:
    """A backticked span that starts with ``--flag``: a flag of one of the CLIs (or of a benchmark script)."""
    ours = set().union(*(p._option_string_actions for p in PARSERS.values()))
    out = []
    for s in snippets(text):
        m = re.match(r"(--[a-z][\w-]*)(?:[ =](\S+))?", s.text) if not s.fenced else None
        if not m or allowed(OTHER_TOOLS_FLAGS, m.group(1), doc):
            continue
        if m.group(1) not in ours | BENCH_FLAGS:
            out.append(f"{doc}:{s.line}: {m.group(1)} is no flag of pacs_fast's CLIs (nor of a bench script)")
            continue
        for cli, parser in PARSERS.items():  # (a value named with it: one that every CLI with the flag takes)
            if m.group(1) in parser._option_string_actions and m.group(2):
                why = flag_value_problem(cli, m.group(1), m.group(2).strip("'\""))
                if why:
                    out.append(f"{doc}:{s.line}: python -m pacs_fast.{cli} {why}")
    return out


def bench_command_problems(text: str, doc: str = "README.md") -> list[str]:
    """``python bench/X.py --flag`` / ``bash bench/gpu/X.sh --flag``: the script names the flag."""
    out = []
    for s in snippets(text):
        for m in re.finditer(r"(?:python3?|bash)\s+((?:bench|scripts|tests)/[\w/.-]+\.(?:py|sh))", s.text):
            script = ROOT / m.group(1)
            if not script.is_file():
                continue  # (path_problems names it)
            source = script.read_text(encoding="utf-8")
            if script.suffix == ".sh":  # (a shell wrapper hands its flags to the Python script beside it)
                source += "".join(p.read_text(encoding="utf-8") for p in script.parent.glob(script.stem + "*.py"))
            rest = s.text[m.end():]
            try:
                tokens = shlex.split(rest, comments=True)
            except ValueError:
                tokens = rest.split()
            for t in tokens:
                if t in SHELL_ENDS:
                    break
                flag = t.split("=", 1)[0]
                if flag.startswith("--") and not re.search(re.escape(flag) + r"(?![\w-])", source):
                    out.append(f"{doc}:{s.line}: {m.group(1)} has no flag {flag}")
    return out


# -- modules and paths -----------------------------------------------------------------------------------------


def module_problems(text: str, doc: str = "README.md") -> list[str]:
    out = []
    for m in re.finditer(r"-m (pacs_fast(?:\.[A-Za-z_]\w*)*)", text):
        if importlib.util.find_spec(m.group(1)) is None:
            out.append(f"{doc}:{line_of(text, m.start())}: no module {m.group(1)}")
    return out


PATH_RE = re.compile(r"(?<![\w./~$-])((?:scripts|bench|configs|tests|pacs_fast|docs|kernels|requirements|\.ci)"
                     r"/[\w./*@+-]*)")


def path_problems(text: str, doc: str = "README.md") -> list[str]:
    out = []
    for s in snippets(text):
        code = s.text if s.fenced else re.sub(r"/\n\s*", "/\n", s.text)
        for m in PATH_RE.finditer(code):
            path = m.group(1).rstrip(".,:;")
            rest = code[m.end():]
            if rest.startswith("\n") and path.endswith("/"):  # (a path that the prose's line break cut)
                out.append(f"{doc}:{s.line}: {path} is cut by a line break inside its backticks")
                continue
            if rest.startswith(("<", "$", "{")) or not path or allowed(NOT_REPO_PATHS, path, doc):
                continue  # (a placeholder or a shell expansion completes it: runs/<name>, OUT_$x)
            if not (list(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()):
                out.append(f"{doc}:{s.line}: no file or folder {path}")
    for m in re.finditer(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):  # Markdown links: relative to the document
        target = m.group(1)
        if re.match(r"\w+://|mailto:", target):
            continue
        if not (ROOT / doc).parent.joinpath(target).exists():
            out.append(f"{doc}:{line_of(text, m.start())}: the link's target {target} does not exist")
    return out


def _code_text(*folders: str) -> str:
    """The code's text (this file's own left out: its self-tests spell the typos they catch)."""
    return "\n".join(path.read_text(encoding="utf-8") for folder in folders for path in (ROOT / folder).rglob("*")
                     if path.suffix in (".py", ".sh") and path.is_file() and path != Path(__file__).resolve())


CODE_TEXT = _code_text("pacs_fast", "kernels", "bench", "scripts", "tests")
FILE_NAME_RE = re.compile(r"[\w*<>.-]*\w[\w*<>-]*\.(?:json|jsonl|md|png|yaml|pt|tgz|csv|txt|safetensors)")


def file_name_problems(text: str, doc: str = "README.md") -> list[str]:
    """A file named alone in backticks (``metrics.jsonl``, ``results.md``, ``samples_<benchmark>.jsonl``): a file
    the code writes or reads (its name in the code, ``<x>`` a formatted value there) or one in the checkout."""
    tracked = {Path(f).name for f in subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True,
                                                      text=True).stdout.splitlines()}
    out = []
    for s in snippets(text):
        if s.fenced or not FILE_NAME_RE.fullmatch(s.text):
            continue
        pattern = "".join(r"\{[^}]*\}" if part.startswith("<") else r"[^\"'\s]*" if part == "*" else re.escape(part)
                          for part in re.split(r"(<[^>]*>|\*)", s.text))
        if s.text not in tracked and not re.search(r"(?<![\w.-])" + pattern, CODE_TEXT):
            out.append(f"{doc}:{s.line}: no file {s.text} in the checkout, nor that name in the code")
    return out


def env_var_problems(text: str, doc: str = "README.md") -> list[str]:
    return [f"{doc}:{line_of(text, m.start())}: the code reads no {m.group(0)}"
            for m in re.finditer(r"\bPACS_FAST_[A-Z0-9_]+", text)
            if not re.search(re.escape(m.group(0)) + r"\b", CODE_TEXT)]


# -- metrics ---------------------------------------------------------------------------------------------------

#: the first part of every metric name the trainer logs (a tiny run's, and the ones of options off by default)
METRIC_PREFIXES = ("reward", "response", "eval", "learner", "pacs", "rollout", "data", "time", "perf",
                   "correction")
METRIC_RE = re.compile(r"(?<![\w./:$<>-])((?:train/)?(?:" + "|".join(METRIC_PREFIXES) + r")"
                       r"(?:/[\w@<>*.+-]*[\w@>*])+)(?![\w/])")


HOLE = "\x00"  # a formatted value's place in an f-string's template


def _code_literals() -> tuple[set[str], set[str], set[str]]:
    """Every string literal of pacs_fast's code (docstrings left out), those used as a dict's key (``{"k": v}``,
    ``d["k"]``), and every f-string as a template (its formatted values as ``HOLE``)."""
    literals, keys, templates = set(), set(), set()
    for path in (ROOT / "pacs_fast").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)
                and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}  # (docstrings)
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                skip |= {id(v) for v in node.values}
                templates.add("".join(v.value if isinstance(v, ast.Constant) else HOLE for v in node.values))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                literals.add(node.value)
            elif isinstance(node, ast.Dict):
                keys |= {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                keys.add(node.slice.value)
    return literals, keys, templates


def _fills(template: str, name: str) -> bool:
    """Whether an f-string's template gives ``name``, each formatted value one path part or less."""
    return re.fullmatch("[^/]+".join(map(re.escape, template.split(HOLE))), name) is not None


def metric_names(text: str) -> list[tuple[int, str]]:
    """Every metric name, ``learner/forward/packed|shared_prefix|padded`` as its three names."""
    out = []
    for m in METRIC_RE.finditer(text):
        name, line = m.group(1), line_of(text, m.start())
        alternatives = text[m.end():].split("`", 1)[0] if text[m.end():m.end() + 1] == "|" else ""
        head = name.rsplit("/", 1)[0]
        out.append((line, name))
        out.extend((line, f"{head}/{alt}") for alt in alternatives.split("|")[1:])
    for m in re.finditer(r"`((?:" + "|".join(METRIC_PREFIXES) + r")(?:/\w+)*)/\w+` / `([a-z_]\w*)`", text):
        out.append((line_of(text, m.start()), f"{m.group(1)}/{m.group(2)}"))  # `learner/adv_mean` / `adv_abs_mean`
    return out


def metric_problem(name: str, logged: set[str], code: tuple[set[str], set[str], set[str]],
                   doc: str = "README.md") -> str | None:
    """None when ``name`` is logged by the tiny run, or built by the code (``code``: :func:`_code_literals`): a
    literal; an f-string's template whose last part is not only a formatted value (``reward/{name}/mean``); or
    ``prefix/{key}`` with ``key`` a literal dict key (the learner's metrics are its losses' metrics dicts' keys,
    logged as ``learner/{k}``). A ``*`` or ``<name>`` in the doc's name must match one of those."""
    literals, dict_keys, templates = code
    if allowed(NOT_OUR_METRICS, name, doc):
        return None
    if name.startswith("train/"):  # a tracker's name of a train record's metric (docs/TRACKERS.md)
        name = name[len("train/"):]
    glob = re.sub(r"<[^>]*>", "*", name)
    if "*" in glob:
        hole = glob.replace("*", HOLE)
        if fnmatch.filter(logged | literals, glob) or any(t.replace(HOLE, "*") == glob or t == hole
                                                          for t in templates):
            return None
        return f"{name} matches no metric the run logs or the code names"
    if name in logged or name in literals:
        return None
    if any(HOLE not in t.rsplit("/", 1)[-1] and _fills(t, name) for t in templates):
        return None
    prefix, _, key = name.rpartition("/")
    if key in dict_keys and any(_fills(t, name) for t in templates if t.endswith("/" + HOLE)):
        return None
    return f"{name} is neither logged by a run nor named in pacs_fast's code"


# -- the checks ------------------------------------------------------------------------------------------------

TINY = ["data.arith_ops=+", "data.arith_max_digits=1", "data.eval_size=8", "rollout.n=4", "rollout.eval_n=2",
        "rollout.max_new_tokens=6", "train.prompts_per_step=4", "learner.mini_batch_prompts=2",
        "learner.micro_batch_prompts=1", "warmup.steps=30", "warmup.batch_size=32", "model.tiny_hidden_size=64",
        "model.tiny_num_layers=1", "learner.lr=3e-3", "train.progress=false", "train.plots=false",
        "algo.entropy_coef=0.05", "train.eval_every=0", "train.save_every=0", "train.steps=2"]


@pytest.fixture(scope="module")
def logged_metrics(tmp_path_factory) -> set[str]:
    """The metric names of a tiny training run (metrics.jsonl), as the README's defaults log them."""
    tmp = tmp_path_factory.mktemp("docs_truth")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "pacs_fast.train", *TINY, f"train.out_dir={tmp}",
                           f"warmup.cache_dir={tmp / 'warm'}", "train.run_name=run"],
                          capture_output=True, text=True, env=env, cwd=tmp, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    names = set()
    for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines():
        names |= set(json.loads(line))
    return names


@pytest.fixture(scope="module")
def code_literals():
    return _code_literals()


@pytest.mark.parametrize("doc", DOCS)
def test_config_keys_and_values_exist(doc):
    assert config_problems((ROOT / doc).read_text(encoding="utf-8"), doc) == []


@pytest.mark.parametrize("doc", DOCS)
def test_cli_flags_exist(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert flag_problems(text, doc) + lone_flag_problems(text, doc) + bench_command_problems(text, doc) == []
    assert whole_command_problems(text, doc) == []


@pytest.mark.parametrize("doc", DOCS)
def test_modules_and_paths_exist(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert module_problems(text, doc) + path_problems(text, doc) + file_name_problems(text, doc) == []


@pytest.mark.parametrize("doc", DOCS)
def test_environment_variables_exist(doc):
    assert env_var_problems((ROOT / doc).read_text(encoding="utf-8"), doc) == []


def test_metric_names_exist(logged_metrics, code_literals):
    problems = []
    for doc, text in read_docs().items():
        for line, name in metric_names(text):
            why = metric_problem(name, logged_metrics, code_literals, doc)
            if why:
                problems.append(f"{doc}:{line}: {why}")
    assert problems == []


def test_the_extractors_see_the_docs():
    """The patterns find what the docs hold (a pattern that matched nothing would pass every doc)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len({m.group(1) for m in KEY_RE.finditer(text)}) > 100
    clis = {cli for _, cli, _ in commands(text)}
    assert {"train", "eval", "eval compare", "experiment"} <= clis
    assert {"--config", "--resume"} <= {a for _, cli, args in commands(text) if cli == "train" for a in args}
    assert len(metric_names(text)) > 30
    assert len([s for s in snippets(text) if PATH_RE.search(s.text)]) > 50
    assert "algo.name" in CHOICE_KEYS and "learner.packing" in CHOICE_KEYS


# -- self-tests: a typo in a copy of README.md's text is caught ------------------------------------------------

README = (ROOT / "README.md").read_text(encoding="utf-8")


def _typo(old: str, new: str) -> str:
    assert old in README, old
    return README.replace(old, new, 1)


def test_a_misspelt_key_is_caught():
    assert config_problems(README) == []
    problems = config_problems(_typo("`rollout.filter_groups=true`", "`rollout.filter_group=true`"))
    assert len(problems) == 1 and "rollout.filter_group is not a config key" in problems[0]
    problems = config_problems(_typo("`reward.noise_fp` / `noise_fn`", "`reward.noise_fp` / `noise_fnr`"))
    assert len(problems) == 1 and "reward.noise_fnr (`noise_fnr` after `reward.noise_fp`)" in problems[0]


def test_a_bad_choice_is_caught():
    problems = config_problems(_typo("algo.name=gspo|cispo", "algo.name=gspo|cipso"))
    assert len(problems) == 1 and "algo.name must be one of" in problems[0], problems
    problems = config_problems(_typo("learner.packing=auto|on|off", "learner.packing=auto|yes|off"))
    assert len(problems) == 1 and "learner.packing must be one of" in problems[0], problems
    assert value_problem("correction.is_level", "tokens") and not value_problem("correction.is_level", "token")
    assert value_problem("rollout.filter_groups", "maybe")  # (a bool's value)


def test_a_misspelt_flag_is_caught():
    assert flag_problems(README) == [] and lone_flag_problems(README) == []
    problems = flag_problems(_typo("--reward-fields tests,entry_point", "--reward-field tests,entry_point"))
    assert problems == [problems[0]] and "pacs_fast.eval has no flag --reward-field" in problems[0]
    problems = flag_problems(_typo("compare runA/results.json runB/results.json --out passk.png --table",
                                   "compare runA/results.json runB/results.json --out passk.png --tables"))
    assert len(problems) == 1 and "pacs_fast.eval compare has no flag --tables" in problems[0]
    problems = flag_problems(_typo("--arms pacs,grpo --seeds 0-4", "--arms pacs,grpo --seed 0-4"))
    assert len(problems) == 1 and "pacs_fast.experiment has no flag --seed" in problems[0]
    problems = lone_flag_problems(_typo("`--system-prompt`", "`--system-promt`"))
    assert len(problems) == 1 and "--system-promt" in problems[0]


def test_a_bad_flag_value_or_a_broken_command_is_caught():
    assert whole_command_problems(README) == []
    problems = flag_problems(_typo("--model PATH --engine vllm ", "--model PATH --engine vlm "))
    assert len(problems) == 1 and "--engine vlm: not one of hf, vllm, auto" in problems[0], problems
    problems = flag_problems(_typo("--arms pacs,grpo --seeds", "--arms pacs,gpro --seeds"))
    assert len(problems) == 1 and "no preset gpro" in problems[0], problems
    problems = whole_command_problems(_typo("--n 8 --limit 5", "--n 8 --limit five"))
    assert len(problems) == 1 and "--limit: invalid int value" in problems[0], problems
    bench = (ROOT / "bench/README.md").read_text(encoding="utf-8")
    assert bench_command_problems(bench) == []
    problems = bench_command_problems(bench.replace("--trl-short-attention", "--trl-short-attn", 1))
    assert len(problems) == 1 and "bench/bench_train_step.py has no flag --trl-short-attn" in problems[0]


def test_a_misspelt_file_name_or_variable_is_caught():
    assert file_name_problems(README) == [] and env_var_problems(README) == []
    problems = file_name_problems(_typo("(`results.md`, `results.json`", "(`result.md`, `results.json`"))
    assert len(problems) == 1 and "no file result.md" in problems[0]
    problems = env_var_problems(_typo("`PACS_FAST_TEST_SEED=<seed>", "`PACS_FAST_TESTS_SEED=<seed>"))
    assert len(problems) == 1 and "PACS_FAST_TESTS_SEED" in problems[0]


def test_a_missing_module_or_path_is_caught():
    assert module_problems(README) == [] and path_problems(README) == []
    problems = module_problems(_typo("python -m pacs_fast.experiment --out", "python -m pacs_fast.experiments --out"))
    assert len(problems) == 1 and "no module pacs_fast.experiments" in problems[0]
    problems = path_problems(_typo("`tests/test_overlong.py`", "`tests/test_overlong_penalty.py`"))
    assert len(problems) == 1 and "tests/test_overlong_penalty.py" in problems[0]
    problems = path_problems(_typo("(docs/INTEGRATIONS.md)", "(docs/INTEGRATION.md)"))
    assert len(problems) == 1 and "docs/INTEGRATION.md" in problems[0]
    problems = path_problems(_typo("`pacs_fast/learner/megatron/value_head.py`",
                                   "`pacs_fast/learner/megatron/\n  value_head.py`"))
    assert len(problems) == 1 and "is cut by a line break" in problems[0], problems


def test_a_misspelt_metric_is_caught(logged_metrics, code_literals):
    def problems(text):
        return [why for _, name in metric_names(text) if (why := metric_problem(name, logged_metrics, code_literals))]

    assert problems(README) == []
    assert problems(_typo("`reward/overlong_frac`", "`reward/overlong_fraction`"))  # (an option off by default)
    assert problems(_typo("`learner/cov_cut_frac`", "`learner/cov_cut_fraction`"))  # (a learner/{key} one)
    assert problems(_typo("`response/truncated_frac`", "`response/truncated_share`"))  # (a logged one)
    assert problems("`pacs/psy_*`") and not problems("`pacs/psi_*`")
    assert problems(_typo("`learner/adv_mean` / `adv_abs_mean`", "`learner/adv_mean` / `adv_abs_man`"))
    assert problems("`learner/forward/packed|shared_prefix|paded`") and not problems(
        "`learner/forward/packed|shared_prefix|padded`")
