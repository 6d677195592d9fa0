"""A torchrun launch's processes check in before any process group forms (pacs_fast/launch_checkin.py).

A process that failed before the launch connected (a file its node lacks: two torchrun agents, 2026-12-03) left
the others waiting in ``init_process_group`` up to its 30-minute timeout. Here torchrun's agent store is a
``TCPStore`` this test hosts, and the two ranks are played one after the other from this process.
"""
import socket
import threading

import pytest
import torch.distributed as dist

from pacs_fast import launch_checkin
from pacs_fast.launch_checkin import PeerFailed, report_failure, wait_for_peers


@pytest.fixture
def agent_store(monkeypatch):
    """torchrun's environment for rank 0 of 2 with its agent's store, hosted here."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    host = dist.TCPStore("127.0.0.1", port, 3, is_master=True, wait_for_workers=False)
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "RANK": "0",
                 "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0"}.items():
        monkeypatch.setenv(k, v)
    yield host


def test_a_process_that_failed_first_stops_the_waiting_ones(agent_store, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    report_failure("warmup.cache_dir '/x/afile/cache' cannot be created: /x/afile is a file")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(PeerFailed, match=r"rank 1 could not start: warmup.cache_dir '/x/afile/cache' cannot"):
        wait_for_peers()  # (before: waited for rank 1 in init_process_group, 30 minutes)


def test_the_check_in_returns_once_every_process_arrived(agent_store, monkeypatch):
    done = []
    waiter = threading.Thread(target=lambda: done.append(wait_for_peers() or True))
    waiter.start()  # rank 0 arrives and waits for rank 1
    waiter.join(0.5)
    assert not done and waiter.is_alive()
    wait_for_peers()  # rank 1 arrives: both return
    waiter.join(10)
    assert done == [True]


def test_no_check_in_without_torchruns_agent_store(monkeypatch):
    """A plain process, another launcher (rank 0 hosts the store: it may be the one that failed), one process."""
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert launch_checkin._store() is None
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert launch_checkin._store() is None
    wait_for_peers()  # returns at once
    report_failure("x")  # does nothing
