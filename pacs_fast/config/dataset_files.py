"""Where a dataset's rows live: one file, a folder of shards, or a glob (what :mod:`.model_files` is to a model
folder: the run's settings are checked with it before anything loads; :mod:`pacs_fast.data.datasets` reads them).

What a user has after ``huggingface-cli download --repo-type dataset ORG/NAME --local-dir DIR`` is a folder:
``DIR/data/train-00000-of-00004.parquet`` ... (often beside ``test-*`` shards, and sometimes one folder per
subset: GSM8K's ``main/`` and ``socratic/``). ``Dataset.save_to_disk`` writes ``.arrow`` shards with
``state.json`` / ``dataset_info.json``, and a ``DatasetDict`` one such folder per split.

:func:`dataset_files` turns ``data.dataset`` (or eval's ``--benchmarks`` entry) into the files to read, in
order, and refuses a folder whose files are not one set of rows: several splits (``train-*`` and
``test-*``), several folders (two subsets), or several formats. The error names the folder and what to give
instead (a split's folder, or a glob such as ``DIR/data/train-*.parquet``).
"""
from __future__ import annotations

import fnmatch
import glob
import os
import re
from pathlib import Path

# how a name ends -> its format (the order matters: ".jsonl.gz" before ".json")
SUFFIXES = (".jsonl.gz", ".jsonl", ".json.gz", ".json", ".parquet", ".arrow")
# what Dataset.save_to_disk / DatasetDict.save_to_disk write beside the rows, and the hub's older dataset_infos.json
# (JSON, but not rows)
METADATA_FILES = frozenset({"state.json", "dataset_info.json", "dataset_dict.json", "dataset_infos.json"})
# the split names the hub's file naming uses (datasets' data_files patterns); each word is a split of its own
# (a folder with test.jsonl and eval.jsonl holds two sets of rows, whatever either is called)
SPLIT_WORDS = frozenset({"train", "training", "test", "testing", "eval", "evaluation", "validation", "valid", "val",
                         "dev"})
GLOB_CHARS = re.compile(r"[*?\[]")


def data_format(path: str | Path) -> str | None:
    """The format of a data file by its name (``".parquet"``, ``".jsonl.gz"``, ...), or None."""
    name = Path(path).name.lower()
    return next((s for s in SUFFIXES if name.endswith(s)), None)


def is_glob(text: str) -> bool:
    return bool(GLOB_CHARS.search(text))


def _split_of(rel: Path) -> str | None:
    """The split a shard belongs to by the hub's naming (``train-00000-of-00002.parquet``, ``test.jsonl``,
    ``train/data-00000-of-00001.arrow``), or None when its path names none."""
    words = [w for part in rel.parts[:-1] for w in re.split(r"[-_.]", part.lower())]
    name = rel.name.lower()
    fmt = data_format(name) or ""
    words += re.split(r"[-_.]", name[: len(name) - len(fmt)])
    return next((w for w in words if w in SPLIT_WORDS), None)


def _folder_files(folder: Path) -> list[Path]:
    """The data files under ``folder`` (hidden files and folders, and save_to_disk's metadata, left out; a
    linked subfolder is searched, once)."""
    out, seen = [], set()
    for root, dirs, files in os.walk(folder, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:  # a link back up the tree
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        out += [Path(root) / f for f in sorted(files)
                if not f.startswith(".") and f not in METADATA_FILES and data_format(f)]
    return out


def _check_one_set(where: str, files: list[Path], root: Path) -> None:
    """``files`` are one set of rows: one format, one split, one folder; else a ValueError naming ``where``."""
    formats = sorted({data_format(f) for f in files})
    if len(formats) > 1:
        raise ValueError(f"{where} holds data files of several formats ({', '.join(formats)}); give one of "
                         f"them as a glob (e.g. '{root / ('*' + formats[0])}')")
    split_of = {f: _split_of(f.relative_to(root)) for f in files}
    splits = sorted({s for s in split_of.values() if s})
    unnamed = [f for f in files if split_of[f] is None]
    if len(splits) > 1 or (splits and unnamed):  # each split's files, to choose from
        choices = []
        for split in splits:
            example = next(f for f in files if split_of[f] == split)
            prefix = _split_prefix(example)  # "train" of the hub's "train-00000-of-00002"; "" when a folder names it
            # a glob in quotes, so that a shell passes it on as it is
            choices.append(f"'{example.parent / (prefix + '*' + formats[0])}'" if prefix else str(example.parent))
        what = ", ".join(splits) + (f" and files that name none, such as {unnamed[0].name}" if unnamed else "")
        if len(unnamed) == 1:
            choices.append(str(unnamed[0]))
        elif unnamed:  # no glob takes only them: a folder of their own
            choices.append(f"a folder holding only the {len(unnamed)} files that name no split")
        raise ValueError(f"{where} holds several splits ({what}); give one split's files: {' or '.join(choices)}")
    parents = sorted({f.parent for f in files})
    if len(parents) > 1:
        names = ", ".join(str(p.relative_to(root)) + "/" for p in parents[:4])
        raise ValueError(f"{where} holds data files in several folders ({names}{' ...' * (len(parents) > 4)}): "
                         f"subsets or splits of the dataset; give one folder")


# a numbered shard as the hub and ``save_to_disk`` name them: ``train-00001-of-00004.parquet``,
# ``data-00000-of-00003.arrow``, the hub's older ``train-00000-of-00001-243207c6c994e1bd.parquet``
_SHARD_RE = re.compile(r"(?P<head>.*?)(?P<index>\d+)-of-(?P<total>\d+)(?P<tail>(?:-[0-9a-f]+)?)$")


def _missing_shards(files: list[Path], pattern: str | None = None) -> list[tuple[Path, int, str]]:
    """The numbered shards (``<name>-0000i-of-0000n``, counted from 0) that ``files`` lack, as ``(an existing shard
    of the set, how many shards the set has, the name of the first missing one)`` per set. A set whose numbers do
    not count from 0 to n - 1 (another naming) is not checked. With a glob's ``pattern``, only shards the glob would
    have matched are missing (``train-0000[01]-of-00004.parquet`` asks for two of four)."""
    sets: dict[tuple, dict[int, Path]] = {}
    for f in files:
        fmt = data_format(f.name) or ""
        m = _SHARD_RE.fullmatch(f.name[: len(f.name) - len(fmt)])
        if m:
            key = (f.parent, m["head"], m["total"], m["tail"] and "-", fmt, len(m["index"]))
            sets.setdefault(key, {})[int(m["index"])] = f
    out = []
    for (parent, head, total_text, _, fmt, width), shards in sets.items():
        total = int(total_text)
        if not total or any(i >= total for i in shards):  # (not counted from 0 to n - 1: another naming)
            continue
        example = next(iter(shards.values()))
        tail = _SHARD_RE.fullmatch(example.name[: len(example.name) - len(fmt)])["tail"]
        missing = [i for i in range(total) if i not in shards]
        if pattern is not None:  # (a hash-named shard's own hash is unknown: the example's stands in)
            missing = [i for i in missing
                       if fnmatch.fnmatchcase(str(parent / f"{head}{i:0{width}d}-of-{total_text}{tail}{fmt}"), pattern)]
        if missing:
            name = f"{head}{missing[0]:0{width}d}-of-{total_text}{'-*' if tail else ''}{fmt}"
            out.append((example, total, name + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")))
    return out


def _check_complete(where: str, files: list[Path], pattern: str | None = None) -> None:
    """A ValueError naming ``where`` when a set of numbered shards in ``files`` lacks one (an interrupted or partial
    download: the rows of the shards present were read as the whole dataset, without a word)."""
    for example, total, missing in _missing_shards(files, pattern):
        raise ValueError(f"{where} lacks shards of a set of {total} ({missing}, beside {example.name}): an "
                         f"interrupted or partial download? download the missing shards (their rows would be left "
                         f"out without a word), or give the shards you mean as a glob that names them")


def unlike_shards(files: list[Path]) -> list[str]:
    """The names of ``files`` when they are not shards of one set (their names, digits aside, differ:
    ``gsm_hard.jsonl`` and ``svamp.jsonl``, not ``train-00000-of-00002`` and ``train-00001-of-00002``), else []."""
    if len({re.sub(r"\d+", "#", f.name) for f in files}) <= 1:
        return []
    return [f.name for f in files]


def _split_prefix(path: Path) -> str:
    """``train`` of ``train-00000-of-00002.parquet``: the name up to and including its split word."""
    m = re.match(r"(.*?(?:^|[-_.]))(" + "|".join(SPLIT_WORDS) + r")(?=[-_.]|$)", path.name.lower())
    return path.name[: m.end()] if m else ""


def dataset_files(spec: str | Path) -> list[Path]:
    """The files holding the rows of ``spec``, in reading order: ``[spec]`` for a file; a folder's data files
    (searched through its subfolders, in name order: shards ``-00000-of-N`` first to last); a glob's matching
    data files in name order. ``~`` is expanded.

    Raises:
        FileNotFoundError: nothing there (a glob that matches no data file).
        ValueError: a folder (or glob) whose files are not one set of rows: several formats, several splits
            (``train-*`` and ``test-*``) or several folders (a dataset's subsets); the message says what to give.
    """
    path = Path(os.path.expanduser(str(spec)))  # (a name that holds "[" or "*" is itself first)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = _folder_files(path)
        if not files:
            raise FileNotFoundError(f"dataset folder {path} holds no data file ({', '.join(SUFFIXES)})")
        _check_one_set(f"dataset folder {path}", files, path)
        _check_complete(f"dataset folder {path}", files)
        return files
    if is_glob(str(spec)):
        text = absolute_spec(str(spec))
        files = sorted(Path(p) for p in glob.glob(text, recursive=True)
                       if os.path.isfile(p) and data_format(p) and Path(p).name not in METADATA_FILES)
        if not files:
            raise FileNotFoundError(f"no dataset file matches {text} ({', '.join(SUFFIXES)})")
        root = Path(os.path.commonpath([str(f.parent) for f in files]))
        _check_one_set(f"dataset glob {text}", files, root)
        _check_complete(f"dataset glob {text}", files, text)
        return files
    hint = ""
    if re.fullmatch(r"[\w.-]+/[\w.-]+", str(spec)) and not str(spec).startswith(".") and not data_format(spec):
        hint = (f" (a hub dataset? download it first: huggingface-cli download --repo-type dataset {spec} "
                f"--local-dir DIR, then give DIR)")
    if path.exists():  # a device, a pipe, a socket (/dev/null)
        raise FileNotFoundError(f"dataset {path} is not a regular file or folder")
    raise FileNotFoundError(f"dataset file not found: {path}{hint}")


def absolute_spec(spec: str) -> str:
    """``spec`` as an absolute path (``~`` expanded), a glob staying the same glob: the folder joined onto a
    relative one is escaped (a run started in ``proj[v2]/`` read ``[v2]`` as a character class)."""
    if not is_glob(spec) or os.path.exists(os.path.expanduser(spec)):  # (a file whose name holds "[" is a file)
        return os.path.abspath(os.path.expanduser(spec))
    path = os.path.join(os.getcwd(), os.path.expanduser(spec))  # (an absolute one stays itself)
    parts = Path(path).parts
    for i in range(len(parts) - 1, 0, -1):  # the longest leading folder that exists as written is no pattern
        head = os.path.join(*parts[:i])
        if os.path.isdir(head):
            return os.path.join(glob.escape(head), *parts[i:])
    return path


def dataset_exists(spec: str | Path) -> bool:
    """A file, a folder, or a glob that matches something (what a run records and a resume looks for)."""
    if is_glob(str(spec)) and not os.path.exists(os.path.expanduser(str(spec))):
        return bool(glob.glob(absolute_spec(str(spec)), recursive=True))
    return os.path.exists(os.path.expanduser(str(spec)))
