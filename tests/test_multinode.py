"""A launch of several nodes (``torchrun --nnodes 2 ... --rdzv_backend c10d``) as one of its processes sees it.

Every other multi-process test runs one torchrun agent: there the first process of the node is global rank 0.
Here the process is the first of the second node: ``LOCAL_RANK=0 RANK=1 WORLD_SIZE=2 LOCAL_WORLD_SIZE=1
GROUP_RANK=1 GROUP_WORLD_SIZE=2`` (what torchrun gives it). Found with two agents on one machine (audit of
2026-12-03): a 2-node launch whose warm-up cache was empty failed on the second node, and a SIGTERM that reached
one node's agent alone left that node's output without a line.
"""
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from pacs_fast.config import load_config

SECOND_NODE = {"LOCAL_RANK": "0", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "1",
               "GROUP_WORLD_SIZE": "2"}


@pytest.fixture
def second_node(monkeypatch):
    """The environment of the second node's first process, and torch.distributed initialised with this process
    at rank 1 (as transformers asks it: ``is_initialized`` / ``get_rank``; no real group, nothing collective
    runs in what is tested)."""
    for k, v in SECOND_NODE.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)


def test_the_second_nodes_first_process_builds_a_whole_warm_up_model(second_node, tmp_path):
    """find_model's first process of each node builds the warm-up; transformers 5's save_pretrained writes nothing
    on a process whose global rank is not 0, so node 1's folder held only the tokenizer and the launch stopped with
    "Unrecognized model in .../.build-<key>-<token>" (a 2-node launch, shared or node-local cache alike). The
    folder now holds every file, and loads."""
    from transformers import AutoModelForCausalLM

    from pacs_fast.trainer.parallel import World
    from pacs_fast.trainer.problems import load_problems
    from pacs_fast.trainer.session import find_model
    from pacs_fast.trainer.warmup import MODEL_FILES

    cfg = load_config(None, [f"warmup.cache_dir={tmp_path}", "warmup.steps=2", "warmup.batch_size=4",
                             "model.tiny_hidden_size=32", "model.tiny_num_layers=1", "data.arith_train_size=50",
                             "data.eval_size=4"])

    class SecondNode(World):
        def barrier(self) -> None:  # (node 0's process would meet it here; nothing to wait for in this test)
            pass

    path, _ = find_model(cfg, load_problems(cfg)[0], SecondNode(rank=1, size=2), log=lambda *a: None)
    assert path.parent == tmp_path / "warmup" and all((path / name).is_file() for name in MODEL_FILES)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left beside it
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert model.config.hidden_size == 32


def test_a_stop_signal_on_one_node_is_said_in_that_nodes_output(second_node, monkeypatch, capsys):
    """A SIGTERM that reaches node 1's agent alone: node 0's rank 0 said "another rank of this launch stopped
    ... (that rank's error line says why)", and node 1's output had no line. Its first process now says it;
    the node's other processes, and global rank 0's (one node: the only line), as before."""
    import signal

    from pacs_fast import train as tr

    run = Path("/nowhere")
    for local_rank, group, printed in (("0", "1", "stopped by SIGTERM (node 1): "), ("1", "1", None),
                                       ("1", "0", None)):
        monkeypatch.setenv("LOCAL_RANK", local_rank)
        monkeypatch.setenv("GROUP_RANK", group)
        with pytest.raises(SystemExit) as e:
            tr.stopped(signal.SIGTERM, run)
        err = capsys.readouterr().err
        assert e.value.code == 143
        assert (err.strip().startswith(printed) if printed else err == ""), (local_rank, group, err)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("GROUP_RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(SystemExit):
        tr.stopped(signal.SIGTERM, run)
    assert capsys.readouterr().err.strip().startswith("stopped by SIGTERM: ")


def test_other_ranks_show_no_progress_bars(monkeypatch):
    """Every rank's "Loading weights" bar repeated rank 0's (two agents: each node's output had its own);
    the other ranks switch transformers' bars off with their warnings."""
    import warnings

    from transformers.utils import logging as hf_logging

    from pacs_fast.trainer.parallel import quiet_warnings

    cfg = load_config(None, [])
    with warnings.catch_warnings():
        try:
            quiet_warnings(cfg, is_main=True)
            assert hf_logging.is_progress_bar_enabled()
            quiet_warnings(cfg, is_main=False)
            assert not hf_logging.is_progress_bar_enabled()
        finally:
            hf_logging.enable_progress_bar()


@pytest.mark.parametrize("launch_rank, local_rank, learners_here", [(1, 1, 1), (2, 0, 2), (3, 1, 2)])
def test_the_cpu_memory_check_counts_the_learners_of_this_node(monkeypatch, launch_rank, local_rank,
                                                               learners_here):
    """2 nodes x 2 processes, ``rollout.ranks=1``: launch rank 0 (node 0) is the engine, ranks 1-3 the megatron
    learner. Each host's memory is shared by its own learner processes: 1 on node 0, 2 on node 1. The count took
    ``LOCAL_WORLD_SIZE - rollout.ranks`` on every node (1 on node 1: each of its 2 processes was given the whole
    host's memory). The roles' own RANK / WORLD_SIZE (roles.py) are set as the learner sees them."""
    from pacs_fast.trainer import memory_model

    cfg = load_config(None, ["learner.backend=megatron", "rollout.ranks=1", "rollout.max_staleness=1",
                             "learner.tp_size=1", "train.prompts_per_step=6", "learner.mini_batch_prompts=6",
                             "learner.micro_batch_prompts=1"])
    monkeypatch.setenv("PACS_FAST_LAUNCH_RANK", str(launch_rank))
    monkeypatch.setenv("PACS_FAST_LAUNCH_WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", str(launch_rank - 1))
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert memory_model.learner_layout(cfg) == (3, learners_here)


def test_a_setup_error_of_one_node_alone_is_said_there(second_node, monkeypatch, tmp_path, capsys):
    """A setup step that fails on one node only (its warm-up build, its copy of the model) while rank 0 goes on:
    that rank exited with status 2 and no line at all (the error of a failure every rank shares is rank 0's to
    print), and rank 0 said that another rank stopped, "(that rank's error line says why)". Still alive after
    the delay (torchrun had stopped it if rank 0 had failed alike), it now says why."""
    import pacs_fast.trainer.loop as loop
    from pacs_fast import train as tr

    def setup_fails(*args, **kwargs):
        raise loop.SetupError("the warmed-up tiny model was written without config.json (/cache/.build-x)")

    monkeypatch.setattr(loop, "train", setup_fails)
    monkeypatch.setattr(tr.time, "sleep", lambda s: None)  # (PEER_EXIT_DELAY_S: torchrun did not stop this rank)
    with pytest.raises(SystemExit) as e:
        tr.main(["learner.backend=megatron", "learner.tp_size=2", f"train.out_dir={tmp_path}", "train.run_name=run",
                 f"warmup.cache_dir={tmp_path}"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: rank 1: the warmed-up tiny model was written without config.json (/cache/.build-x)")
