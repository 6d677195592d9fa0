"""The experiment runner's command line: ``--seeds``, ``--arms`` / ``--arm``, ``--timeout`` and the
keys the runner sets itself, each checked before any run starts (a ValueError naming the flag)."""
from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from pacs_fast.cli_parser import OneLineArgumentParser

PRESETS = {
    "pacs": ["algo.name=pacs"],
    "pacs_noweight": ["algo.name=pacs", "algo.weight=none"],
    "grpo": ["algo.name=grpo"],
    "rloo": ["algo.name=rloo"],
    "dr_grpo": ["algo.name=dr_grpo"],
    "ppo": ["algo.name=ppo"],
    "gspo": ["algo.name=gspo"],
    "cispo": ["algo.name=cispo"],
    "clip_cov": ["algo.name=clip_cov"],
    "kl_cov": ["algo.name=kl_cov"],
    "gmpo": ["algo.name=gmpo"],
    "sapo": ["algo.name=sapo"],
    "dppo_tv": ["algo.name=dppo_tv"],
    "dppo_kl": ["algo.name=dppo_kl"],
    "gpg": ["algo.name=gpg"],
    "vespo": ["algo.name=vespo"],
    "luspo": ["algo.name=gspo", "algo.loss_agg=seq-mean-token-sum"],  # (TRL's loss_type=luspo: GSPO, each sequence's
    # term scaled by its length)
    "dro": ["algo.name=dro", "algo.dro_beta=0.05"],  # (verl's dro_beta has no default; Tinker's docs use 0.05)
    "reinforce_pp": ["algo.name=reinforce_plus_plus"],
    "reinforce_pp_baseline": ["algo.name=reinforce_plus_plus_baseline"],
}
# Keys the runner sets in every run, and the flag that sets them: given anywhere else, they would
# be replaced without a word (the runner's come last), so they are refused.
RUNNER_KEYS = {"train.seed": "--seeds", "warmup.seed": "--seeds", "train.out_dir": "--out",
               "train.run_name": "--out", "train.threads": "--threads", "train.tracker_group": "--arm"}
ARM_FORM = ("NAME:section.key=value,section.key=value (a comma inside brackets or a quoted value does not "
            "split: learner.betas=[0.9,0.95])")
MAX_SEEDS = 1000  # runs of one experiment; more is a typo (each seed is len(arms) training runs)


@dataclass
class Arm:
    name: str
    overrides: list[str]


def parse_seeds(text: str) -> list[int]:
    """``"0-4"`` -> [0, 1, 2, 3, 4]; ``"0,3,7"`` -> [0, 3, 7]. Seeds are integers >= 0, at most
    :data:`MAX_SEEDS` of them; anything else is a ValueError naming ``--seeds``."""
    usage = f"--seeds {text!r}: give distinct integers >= 0 as a range or a list (e.g. 0-4 or 0,1,2)"
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        if not lo.strip().isdigit() or (dash and not hi.strip().isdigit()):
            raise ValueError(usage)
        a, b = int(lo), int(hi) if dash else int(lo)
        if b < a:
            raise ValueError(f"{usage}; {part!r} runs backwards")
        if len(out) + b - a + 1 > MAX_SEEDS:
            raise ValueError(f"--seeds {text!r} asks for more than {MAX_SEEDS} seeds")
        out.extend(range(a, b + 1))
    if not out or len(set(out)) != len(out):
        raise ValueError(usage)
    return out


def split_overrides(text: str) -> list[str]:
    """``"a.b=[1,2],c.d=3"`` -> ``["a.b=[1,2]", "c.d=3"]``: splits on the commas outside brackets
    (``[]``, ``{}``) and outside a quoted value (one that starts with ``'`` or ``"`` right after
    ``=``); ValueError (saying what is open) for unbalanced brackets or an unclosed quote."""
    def starts_value(before: str) -> bool:  # the override so far is ``key=``
        return before.rstrip().endswith("=") and before.count("=") == 1

    parts, current, depth, quote = [], [], 0, ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"" and depth == 0 and starts_value("".join(current)):
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
            if depth < 0:
                raise ValueError(f"a {ch!r} closes no bracket")
        elif ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    if quote or depth:
        raise ValueError(f"a {quote} quote is not closed" if quote else "a bracket is not closed")
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def parse_arm(text: str) -> Arm:
    """A preset name, or ``NAME:section.key=value,section.key=value`` (see :func:`split_overrides`; a preset's
    NAME starts from that preset, the given keys after it: ``grpo:learner.lr=2e-5`` is GRPO, as its name says); a
    ValueError naming ``text`` and the expected form otherwise."""
    name, sep, rest = text.partition(":")
    name = name.strip()
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"arm {text!r}: the name must be letters, digits, '_' or '-'; give a preset "
                         f"({', '.join(PRESETS)}) or {ARM_FORM}")
    if not sep:
        if name not in PRESETS:
            raise ValueError(f"arm {text!r} is not a preset ({', '.join(PRESETS)}); give {ARM_FORM}")
        return Arm(name, list(PRESETS[name]))
    try:
        overrides = split_overrides(rest)
    except ValueError as e:
        raise ValueError(f"arm {text!r}: {e}; give {ARM_FORM}") from None
    for o in overrides:
        if "=" not in o:
            raise ValueError(f"arm {text!r}: {o!r} must look like section.key=value; give {ARM_FORM}")
        glued = _glued_override(o)
        if glued:  # (a text key took "p learner.lr=2e-5" as its value: the lr was never set)
            raise ValueError(f"arm {text!r}: {o!r} holds {glued!r} after a space: separate an arm's overrides "
                             f"with commas; give {ARM_FORM}")
    # (a preset's name with keys had dropped the preset: `grpo:learner.lr=2e-5` trained PACS under the name grpo)
    return Arm(name, list(PRESETS.get(name, [])) + overrides)


def _glued_override(override: str) -> str | None:
    """The ``section.key=`` of a config key inside ``override``'s value after whitespace (two overrides written with
    a space between them), else None."""
    import re

    from pacs_fast.config import all_keys

    value = override.partition("=")[2]
    keys = set(all_keys())
    for m in re.finditer(r"\s([a-z_]+\.[a-z_0-9]+)=", value):
        if m.group(1) in keys:
            return m.group(1) + "="
    return None


def check_runner_keys(overrides: list[str], where: str) -> None:
    """ValueError for a key of :data:`RUNNER_KEYS` among ``overrides`` (``where`` names them)."""
    for text in overrides:
        key = text.partition("=")[0].strip()
        if key in RUNNER_KEYS:
            flag = RUNNER_KEYS[key]
            raise ValueError(f"{where}: {text!r}: the runner owns {key} (it sets it in every run from {flag}); "
                             f"use {flag} instead")


def check_timeout(value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"--timeout {value:g}: give a positive number of seconds (leave --timeout out for no limit)")


def spec_defaults(args, arms: list[Arm]) -> None:
    """For ``--report`` with ``arms`` given: ``<out>/spec.json``'s seeds and baseline (when it is one of ``arms``)
    where the command line gives none (the default seeds 0-4 reported seeds never asked for as unfinished, and the
    recorded baseline was dropped); nothing when the spec cannot be read (the defaults then)."""
    try:
        spec = json.loads((Path(args.out) / "spec.json").read_text())
    except (OSError, ValueError):
        return
    if not isinstance(spec, dict):
        return
    seeds = spec.get("seeds")
    if args.seeds is None and isinstance(seeds, list) and seeds and all(type(s) is int for s in seeds):
        args.seeds = ",".join(str(s) for s in seeds)
    if args.baseline is None and spec.get("baseline") in {arm.name for arm in arms}:  # (one of these arms only: a
        args.baseline = spec["baseline"]  # recorded baseline left out of --arms had emptied every difference column)


def settings_from_spec(args) -> list[Arm]:
    """For ``--report`` without ``--arms`` / ``--arm``: the arms of ``<out>/spec.json`` (what the runner
    recorded), and its seeds, config, overrides and baseline where the command line gives none
    (``args`` is updated). A ValueError naming ``--out`` when there is no readable spec."""
    path = Path(args.out) / "spec.json"
    try:
        spec = json.loads(path.read_text())
        arms = [Arm(str(name), [str(o) for o in overrides]) for name, overrides in spec["arms"].items()]
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as e:
        raise ValueError(f"--report without --arms / --arm reads the arms from {path}, which cannot be read "
                         f"({type(e).__name__}); give --arms / --arm") from None
    if args.seeds is None:
        args.seeds = ",".join(str(s) for s in spec.get("seeds") or [])
    if args.config is None:
        args.config = spec.get("config")
    if not args.overrides:
        args.overrides = list(spec.get("overrides") or [])
    if args.baseline is None:
        args.baseline = spec.get("baseline")
    if args.baseline and args.baseline not in {x.name for x in arms}:
        raise ValueError(f"--baseline {args.baseline!r} is not one of the arms")
    return arms


def parse_arms(args) -> list[Arm]:
    """The arms of ``--arms`` (presets only) and ``--arm``: named uniquely, owning none of
    :data:`RUNNER_KEYS`, with ``--baseline`` among them."""
    arms = []
    for x in args.arms.split(","):
        if x.strip() and (":" in x or "=" in x):
            raise ValueError(f"--arms {args.arms!r}: --arms takes preset names ({', '.join(PRESETS)}); "
                             f"give --arm {ARM_FORM}")
        if x.strip():
            arms.append(parse_arm(x))
    arms += [parse_arm(x) for x in args.arm]
    if not arms:
        raise ValueError("no arms: give --arms and/or --arm")
    if len({x.name for x in arms}) != len(arms):
        raise ValueError("arm names must be distinct")
    for arm in arms:
        check_runner_keys(arm.overrides, f"--arm {arm.name!r}")
    if args.baseline and args.baseline not in {x.name for x in arms}:
        raise ValueError(f"--baseline {args.baseline!r} is not one of the arms")
    return arms


def check_resources(args) -> None:
    if args.workers < 1 or args.threads < 1:
        raise ValueError("--workers and --threads must be >= 1")
    from pacs_fast.reward.batch import usable_cpus
    cpus = usable_cpus()
    if args.threads > cpus:
        raise ValueError(f"--threads {args.threads} (per run) is more than the {cpus} CPUs this process may use")
    check_timeout(args.timeout)
    check_runner_keys(args.overrides, "common override")
    if args.config:
        check_runner_keys([f"{key}=" for key in config_file_keys(args.config)], f"--config {args.config}")


def config_file_keys(path: str | None) -> set[str]:
    """The ``section.key`` names a config file sets (none without a file; a file that cannot be read is left to
    the config's own error)."""
    from pacs_fast.config import read_yaml

    try:
        data = read_yaml(path) if path else {}
    except ValueError:
        return set()
    return {f"{section}.{key}" for section, values in data.items() if isinstance(values, dict) for key in values}


EPILOG = f"""\
arms: a preset ({', '.join(PRESETS)}), or
    NAME:section.key=value,section.key=value on top of the common overrides (a preset's NAME starts
    from that preset: grpo:learner.lr=2e-5 is GRPO); a comma inside brackets or a quoted value does
    not split (learner.betas=[0.9,0.95] is one value).
--timeout stops a run as SIGTERM does (then kills it 30 s later); the run's log and the runner say so.
the runner sets train.seed and warmup.seed (--seeds), train.out_dir and train.run_name (--out),
    train.threads (--threads) and train.tracker_group (the arm's name: W&B / MLflow / trackio runs named
    <arm>-seed<k>) in every run; giving them as overrides is an error.
one runner at a time per --out: a second one (or a live run in one of its run folders) is refused;
    a run folder is deleted only when it is this experiment's own dead run (restarted) or, with
    --restart-mismatched, its own dead run made with other settings.
exit status: 0 every run finished, 1 some run failed (after writing the report) or, with --report,
    none has finished yet (nothing written), 2 bad arguments or a refused folder (nothing started)."""


def parse_args(argv=None, description: str = ""):
    p = OneLineArgumentParser(prog="python -m pacs_fast.experiment", description=description, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="experiment folder (runs/, results.md, results.json, curves.png); "
                                                "one runner at a time")
    p.add_argument("--arms", default="", help=f"comma-separated presets ({', '.join(PRESETS)})")
    p.add_argument("--arm", action="append", default=[],
                   help="NAME:section.key=value,section.key=value (repeatable; list values in brackets; a "
                        "preset's NAME starts from that preset)")
    p.add_argument("--seeds", default=None, help="e.g. 0-4 or 0,2,5 (sets train.seed and warmup.seed; default "
                                                "0-4, with --report alone the recorded ones)")
    p.add_argument("--baseline", default=None, help="arm the others are compared with (paired by seed)")
    p.add_argument("--config", default=None, help="YAML config common to every run")
    p.add_argument("--workers", type=int, default=1, help="runs at a time")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (sets train.threads)")
    p.add_argument("--timeout", type=float, default=None,
                   help="kill a run after this many seconds (> 0; a killed run counts as failed; default: no limit)")
    p.add_argument("--report", action="store_true",
                   help="only write the table and plots from the finished runs of an existing --out (without "
                        "--arms / --arm: the arms, seeds, config and overrides its spec.json recorded)")
    p.add_argument("--restart-mismatched", action="store_true",
                   help="delete and rerun this experiment's run folders made with other settings")
    p.add_argument("--title", default="", help="first line of results.md")
    p.add_argument("overrides", nargs="*", help="section.key=value for every run")
    args = p.parse_args(argv)
    args.out = os.path.expanduser(args.out)  # (--out=~/exp: the shell leaves that ~; the runs' out_dir expands it)
    if args.config:
        args.config = os.path.expanduser(args.config)
    if not args.out.strip():  # ('' had written the experiment into the current folder)
        p.error("--out: give the experiment's folder (it was empty)")
    return args
