"""Train a policy with PACS (or a baseline) on a verifiable task.

    python -m pacs_fast.train                                   # built-in task, tiny model, CPU, < 10 min
    python -m pacs_fast.train --config my.yaml algo.beta=0.5    # YAML file + dotted overrides
    python -m pacs_fast.train algo.name=grpo rollout.n=16
    python -m pacs_fast.train data.dataset=train.jsonl model.path=/models/Qwen2.5-0.5B
    python -m pacs_fast.train --resume runs/pacs-20260101-120000   # continue a run exactly
    python -m pacs_fast.train --help                            # every key with its default
    torchrun --nproc_per_node 2 -m pacs_fast.train learner.backend=megatron learner.tp_size=2
                                                  # megatron-core learner, tensor parallel over 2 processes
    torchrun --nproc_per_node 2 -m pacs_fast.train rollout.ranks=1 rollout.max_staleness=1
                                                  # asynchronous: an engine process generates ahead of the learner
    torchrun --nproc_per_node 4 -m pacs_fast.train rollout.ranks=2 rollout.engine=vllm rollout.tp_size=2 \
        learner.backend=megatron learner.tp_size=2 rollout.max_staleness=1   # the same, vLLM TP=2 + megatron TP=2

With no arguments: a tiny Qwen2-architecture model with a character tokenizer is made, briefly
fine-tuned on small-integer arithmetic (cached), and trained with PACS to answer in
``\\boxed{}``; the held-out accuracy before and after is printed at the end. The run folder
(``runs/<name>``) gets ``config.yaml``, ``metrics.jsonl``, TensorBoard events (``tb/``),
checkpoints (``checkpoints/step_*``, Hugging Face format) and plots (``plots/*.png``).

A run folder is never overwritten: reusing ``train.run_name`` is refused (continue with
``--resume``). Errors in the config, the files or the data are one line on stderr with exit code 2
(``--debug`` shows the traceback); a non-finite loss or gradient stops the run with exit code 1
before the optimiser step, and nothing non-finite is saved.
"""
from __future__ import annotations

import errno
import os
import signal
import sys
import threading
import time
from pathlib import Path

from pacs_fast import signals
from pacs_fast.openmp import quiet_openmp_waits

quiet_openmp_waits()  # before torch loads: idle OpenMP threads spin briefly, then sleep (pacs_fast/openmp.py)

from pacs_fast.cli_parser import OneLineArgumentParser  # noqa: E402
from pacs_fast.config import help_text, load_config, validate  # noqa: E402
from pacs_fast.gc_heap import freeze_at_start_up  # noqa: E402
from pacs_fast.launch_checkin import PeerFailed, report_failure, wait_for_peers  # noqa: E402
from pacs_fast.trainer.run_claim import claim_run_dir, resume_command  # noqa: E402
from pacs_fast.trainer.run_folder import (check_moved_files, finished_summary, record_absolute_paths,  # noqa: E402
                                         resume_config)


def parse_args(argv: list[str] | None = None):
    parser = OneLineArgumentParser(
        prog="python -m pacs_fast.train", add_help=False,
        description="PACS / GRPO / PPO / RLOO / Dr.GRPO training with verifiable rewards.",
        epilog="Overrides: section.key=value (values parsed as YAML). Precedence: the defaults, then the --config "
               "file, then the overrides in their order (a key given twice: the last one wins); a key nobody sets "
               "that follows another (learner.mini_batch_prompts, algo.clip_*) follows it.")
    parser.add_argument("--config", default=None, help="YAML file with config sections")
    parser.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue the run in RUN_DIR")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    parser.add_argument("-h", "--help", action="store_true", help="list every config key and exit")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_intermixed_args(argv)  # (overrides on both sides of --config / --resume)
    if args.config:  # (--config=~/c.yaml: the shell leaves that ~)
        args.config = os.path.expanduser(args.config)
    if args.help:
        print(parser.format_help())
        print("Config keys (section.key, type, default):\n")
        print(help_text())
        sys.exit(0)
    return args


def _launch_it_needs(cfg, checkpoint) -> tuple[int, bool] | None:
    """When this launch's process count cannot run ``cfg`` (a resume under another torchrun layout):
    ``(processes, recorded)``, the count the run used (its checkpoint's data-parallel groups x
    ``learner.tp_size`` + ``rollout.ranks``: ``recorded`` True), else the smallest that can run it (up to
    1,024); None when the count is not the problem. Only the launch-dependent checks run."""
    from pacs_fast.config.launch_checks import launch_problem, world_size

    if launch_problem(cfg, world_size()) is None:
        return None
    try:  # (trainer_state.pt records the data-parallel groups; a checkpoint from before that does not)
        import torch

        dp = int(torch.load(Path(checkpoint) / "trainer_state.pt", weights_only=False)["data_parallel"])
        used = dp * cfg.learner.tp_size + cfg.rollout.ranks
        if launch_problem(cfg, used) is None:
            return used, True
    except Exception:  # noqa: BLE001 - no checkpoint, an older one, an unreadable one: the smallest count then
        pass
    smallest = next((n for n in range(1, 1025) if launch_problem(cfg, n) is None), None)
    return (smallest, False) if smallest else None


def _check_run_writable(run_dir: Path) -> None:
    """ValueError naming the run folder or file a resume could not write (it had loaded the model, then stopped on a
    traceback): a new file in the folder, tried for real, and the records it appends to."""
    from pacs_fast.config.validation import write_problem

    problem = write_problem(run_dir)
    if problem:
        raise ValueError(f"--resume {run_dir}: the run folder is not writable ({problem})")
    for f in sorted(run_dir.glob("*.jsonl")):
        if not os.access(f, os.W_OK):
            raise ValueError(f"--resume {run_dir}: {f.name} is not writable (the run appends its records there)")


def resolve(args) -> tuple[object, Path]:
    """``(config, run folder)`` of the launch; a ValueError naming the key or file otherwise."""
    if args.resume is not None and not args.resume.strip():  # ('' had started a fresh default run)
        raise ValueError("--resume: give the run folder to continue (it was empty)")
    if args.resume:
        if args.config:
            raise ValueError("--resume uses the run's own config.yaml; drop --config")
        from pacs_fast.trainer.checkpoint import check_resumable, intact_checkpoints
        run_dir = Path(args.resume).expanduser()
        intact = intact_checkpoints(run_dir)
        cfg = resume_config(run_dir, args.overrides, checkpoint=intact[0] if intact else None)
        check_resumable(run_dir, cfg.train.steps)
        _check_run_writable(run_dir)
        check_moved_files(run_dir, cfg, intact[0] if intact else None)
        record_absolute_paths(cfg)  # a moved file's new place, given relative, is recorded whole too
        try:
            validate(cfg, new_run=False)
        except ValueError as e:  # a value the run's own config.yaml holds, which this version refuses
            if any(o.split("=", 1)[0].strip() in str(e) for o in args.overrides):
                raise
            needs = _launch_it_needs(cfg, intact[0]) if intact else None
            if needs:  # not this version's refusal: the run was made for another number of processes
                n, recorded = needs
                how = ("python -m pacs_fast.train" if n == 1 else
                       f"python -m torch.distributed.run --nproc_per_node {n} -m pacs_fast.train")
                plural = "process" + "es" * (n > 1)
                said = (f"it ran with {n} {plural}" if recorded else
                        f"resume the run under the launch it was started with; the smallest its settings allow is "
                        f"{n} {plural}")
                raise ValueError(f"{e} (from {run_dir / 'config.yaml'}: {said}, e.g. {how} --resume "
                                 f"{run_dir})") from None
            where = f"model.path={intact[0]}" if intact else "its command"
            raise ValueError(f"{e} (from {run_dir / 'config.yaml'}, which an earlier pacs_fast accepted; a resume "
                             f"cannot change it: start a new run from the run's weights with {where} and a value "
                             f"this version takes)") from None
        return cfg, run_dir
    else:
        cfg = load_config(args.config, args.overrides)
        validate(cfg)
        if launch_rank() == "0":  # (a recorded default the overrides would change: kept, and said so)
            from pacs_fast.config.loading import kept_file_defaults
            for line in kept_file_defaults(args.config, args.overrides):
                print(f"warning: {line}", file=sys.stderr, flush=True)
        record_absolute_paths(cfg)  # config.yaml names the files wherever --resume runs from
        run_dir = claim_run_dir(cfg)
    validate(cfg, new_run=not args.resume)
    return cfg, run_dir


# torchrun stops every worker as soon as one exits with an error: the other ranks wait this long before
# exiting, so that rank 0, failing alike, prints its line and exits first (a faster rank 1 once had
# rank 0 stopped before it printed: the launch failed with no error line)
PEER_EXIT_DELAY_S = 10.0


def launch_rank() -> str:
    """This process's rank in the torchrun launch ("0" without one). The asynchronous layout gives each role its own
    ``RANK`` / ``WORLD_SIZE`` (pacs_fast/trainer/roles.py) and keeps the launch's in ``PACS_FAST_LAUNCH_*``: the
    engine and the learner were both rank 0, and both printed a line meant to print once."""
    return os.environ.get("PACS_FAST_LAUNCH_RANK", os.environ.get("RANK", "0"))


def fail(message: str, code: int, *, alike: bool = True) -> None:
    """Prints ``error: message`` once per launch and exits with ``code``. Under torchrun global rank 0
    prints; the other ranks exit :data:`PEER_EXIT_DELAY_S` later (or are stopped by torchrun once rank 0
    has exited). ``alike=False``: a stop that may be this rank's alone (a user function failing on its
    share of the step, while rank 0 waits in a collective; a setup step failing on one node only): a rank
    other than 0 still alive after the delay prints ``error: rank R: message`` before it exits (when every
    rank fails alike, rank 0's exit has made torchrun stop it by then, on another node too, and nothing is
    printed twice)."""
    signals.default_stop_signals()  # torchrun's stop of the waiting ranks ends them quietly
    rank = launch_rank()
    if rank == "0":
        print(f"error: {message}", file=sys.stderr, flush=True)
    else:
        time.sleep(PEER_EXIT_DELAY_S)
        if not alike:
            print(f"error: rank {rank}: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def other_node() -> str | None:
    """torchrun's node rank (``GROUP_RANK``) when this process is the first of a node other than the first in a
    launch of several nodes (``LOCAL_RANK`` 0, ``GROUP_RANK`` > 0), else None."""
    group = os.environ.get("GROUP_RANK", "0")
    return group if os.environ.get("LOCAL_RANK") == "0" and group not in ("", "0") else None


def stopped(signum: int, run_dir: Path) -> None:
    """One line (global rank 0, and the first process of each other node: a signal may reach one node's agent alone,
    whose output had no line while rank 0 said that another rank stopped) and exit status 128 + the signal (130 for
    Ctrl-C, 143 for SIGTERM); a second signal during the exit ends it at once
    (:func:`pacs_fast.signals.exit_at_next_signal`)."""
    if __name__ == "__main__":  # (the command line's process; a caller keeps its handlers)
        signals.exit_at_next_signal()
    node = other_node()
    if launch_rank() == "0" or node is not None:
        then = (f"continue with {resume_command(run_dir)} (from its last checkpoint)"
                if (run_dir / "config.yaml").is_file()
                else "it stopped before its setup finished (nothing to resume): run the same command again")
        where = f" (node {node})" if node is not None else ""
        print(f"\nstopped by {signals.name(signum)}{where}: {then}", file=sys.stderr, flush=True)
    sys.exit(signals.exit_status(signum))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    try:
        cfg, run_dir = resolve(args)
    except ValueError as e:  # (alike=False: a file one node lacks, e.g. its mount of the run folder, is its alone)
        if args.debug:
            raise
        report_failure(str(e))  # (the others of a torchrun launch stop too, instead of waiting to connect)
        fail(str(e), 2, alike=False)
    try:
        wait_for_peers()  # every process of the launch resolved its settings (pacs_fast/launch_checkin.py)
    except PeerFailed as e:
        if args.debug:
            raise
        fail(str(e), 2)
    done = finished_summary(run_dir, cfg) if args.resume else None
    if done is not None:  # nothing to train, evaluate or repair: the run's records stay as they are
        if launch_rank() == "0":
            print(f"{run_dir} has finished its {cfg.train.steps} steps (summary.json): nothing to do and nothing was "
                  f"changed; give train.steps=N (more) to train on", flush=True)
        return done
    from pacs_fast.trainer.loop import SetupError, TrainingStopped, train  # heavy imports after the config is good
    if __name__ == "__main__":  # the imports live as long as the process: no collection walks them
        freeze_at_start_up()  # (pacs_fast/gc_heap.py; a caller's own process is left alone)
    try:
        if __name__ == "__main__":  # the command line, not a caller's process (inside the try: a signal that
            signals.raise_on_stop_signals()  # comes at once is the one line too)
            signals.die_with_launcher()
            quiet_full_disk_in_threads()
        if cfg.rollout.ranks:  # asynchronous: ranks 0..R-1 generate, the rest learn (pacs_fast/trainer/async_loop.py)
            from pacs_fast.trainer.async_loop import run
            return run(cfg, run_dir, resume=bool(args.resume))
        return train(cfg, run_dir, resume=bool(args.resume))
    except SetupError as e:  # (may be one node's alone: its warm-up, its copy of the model; it said nothing)
        if args.debug:
            raise
        fail(str(e), 2, alike=False)
    except TrainingStopped as e:
        if args.debug:
            raise
        fail(str(e), 1, alike=False)
    except KeyboardInterrupt:
        if args.debug:
            raise
        stopped(signal.SIGINT, run_dir)
    except signals.Stopped as e:
        if args.debug:
            raise
        if any(peer_lost(c) for c in _unwound(e)):  # torchrun's stop came while this rank's loss of another unwound
            peer_lost_exit(run_dir)  # (its clean-up): that loss is what happened, not a stop of the user's
        stopped(e.signum, run_dir)
    except OSError as e:  # a full disk outside a checkpoint (metrics, samples, TensorBoard, plots)
        if args.debug or e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        signals.default_stop_signals()  # (torchrun's stop of this exiting rank ends it quietly)
        then = (f"continue with {resume_command(run_dir)} (from its last checkpoint)"
                if (run_dir / "config.yaml").is_file()
                else "run the same command again (the run had not started: there is nothing to resume)")
        print(f"error: no space left on device writing {e.filename or 'into ' + str(run_dir)}; free some and {then}",
              file=sys.stderr)
        sys.exit(1)
    except RuntimeError as e:  # (gloo's DistBackendError too)
        if args.debug or not peer_lost(e):
            raise
        peer_lost_exit(run_dir)


def peer_lost_exit(run_dir: Path) -> None:
    """Another rank stopped (its own line says why) while this one waited for it: one line, not gloo's traceback, and
    exit status 1."""
    # torchrun stops this rank too once it sees the other's end: during this rank's exit (its engines' and pools'
    # clean-up), that SIGTERM raised Stopped in a finaliser and printed "Exception ignored in ..." with a traceback
    signals.default_stop_signals()
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1") or 1)  # (torchrun's number of nodes)
    where = ", in its node's output," if nodes > 1 else ""
    print(f"error: rank {launch_rank()}: another rank of this launch stopped while this one waited "
          f"for it (that rank's error line{where} says why); continue with {resume_command(run_dir)} (from its "
          f"last checkpoint)", file=sys.stderr, flush=True)
    sys.exit(1)


def _unwound(error: BaseException):
    """The exceptions ``error`` was raised while handling (``__context__``, newest first)."""
    seen = set()
    error = error.__context__
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__context__


def quiet_full_disk_in_threads() -> None:
    """A thread that fails on a full disk ends without its traceback: TensorBoard's event writer thread hands its error
    to the main thread at the next write or flush, whose ``OSError`` handler prints the one line (a run started on an
    almost full disk printed that line, then ~40 lines of "Exception in thread Thread-1" from the writer's thread).
    Every other error of a thread is printed as before."""
    default = threading.excepthook

    def hook(args) -> None:
        if isinstance(args.exc_value, OSError) and args.exc_value.errno in (errno.ENOSPC, errno.EDQUOT):
            return
        default(args)

    threading.excepthook = hook


def peer_lost(error: BaseException) -> bool:
    """Whether ``error`` is a collective's failure because another process of a torchrun launch went away
    (gloo: "Connection closed by peer" / "Connection reset by peer")."""
    from pacs_fast.config.launch_checks import world_size

    text = str(error)
    return world_size() > 1 and ("Connection closed by peer" in text or "Connection reset by peer" in text)


if __name__ == "__main__":
    main()
