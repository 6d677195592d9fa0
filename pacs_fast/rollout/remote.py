"""Rollout engines on their own processes, driven by the learner over ``torch.distributed``.

Asynchronous runs (``rollout.ranks=R``, ``rollout.max_staleness=K``; :mod:`pacs_fast.trainer.async_loop`)
put one rollout engine on each group of ``rollout.tp_size`` consecutive processes among ``0..R-1``
(an HF engine per process, or a vLLM engine per tensor-parallel group) and the learner on the rest.
Nothing but point-to-point messages on the *bridge* process group (:mod:`pacs_fast.trainer.roles`)
connects the learner's first process (the driver) with the engines, in the order they were sent
(one tag per kind of message):

- driver -> every process of an engine: a request header (``int64 [2]``: kind, payload bytes) and
  its pickled payload: ``setup`` (model folder, engine settings), ``generate`` (step, prompt ids,
  sampling parameters), ``weights`` (policy version, the names / shapes / dtypes of the tensors that
  follow, then the tensors one flat bucket per dtype at a time), ``stop``;
- the first process of an engine -> driver: the completions of a ``generate`` request (header and
  pickled payload) with the policy version that produced them.

The driver never waits on an engine to send: every driver send is queued (``isend``-like) and its
buffer is kept until the engine took it, so a weight push costs the learner one copy of the weights,
not the engine's generation time. An engine handles its messages in order, so a ``generate`` request
sent after ``weights`` of version v runs on version v (or newer); the processes of a
tensor-parallel engine get the same messages and call the engine's collectives together.

When the engine took a send is known from that order, not asked of the send: a gloo send reports itself
complete only once ``wait()`` was called on it, so polling ``is_completed()`` freed nothing and the driver
kept every push (one CPU copy of the weights per step: 1.6 MB a step for the tiny model, its RSS 0.5 ->
3.3 GB over 1,837 steps; a sweep of long runs). The reply to a ``generate`` request means its engine's
processes took every message sent them up to that request: those sends are waited on (at once) and
freed then. An engine keeps its own replies' buffers likewise until the driver took them: it waits on
the oldest once more than ``replies_ahead`` (setup; the driver's staleness bound + 3) are outstanding,
which a driver within its bound never reaches.

:func:`serve` is an engine process's whole life; :class:`RemoteEngines` is the driver's side.
"""
from __future__ import annotations

import pickle
import sys
from collections import deque

import torch
import torch.distributed as dist

from pacs_fast.rollout.base import Completion, SamplingParams

STOP, GENERATE, WEIGHTS, SETUP = 0, 1, 2, 3
TAG_HEAD, TAG_BODY, TAG_TENSOR, TAG_REPLY_HEAD, TAG_REPLY_BODY = 11, 12, 13, 14, 15


def _pack(obj) -> tuple[torch.Tensor, torch.Tensor]:
    body = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    return body, torch.tensor([0, body.numel()], dtype=torch.int64)


def _recv_obj(bridge: dist.ProcessGroup, src: int, head_tag: int, body_tag: int) -> tuple[int, object]:
    head = torch.empty(2, dtype=torch.int64)
    bridge.recv([head], src, head_tag).wait()
    body = torch.empty(int(head[1]), dtype=torch.uint8)
    bridge.recv([body], src, body_tag).wait()
    return int(head[0]), pickle.loads(body.numpy().tobytes())


class RemoteEngines:
    """The driver's handle on the engines: requests, completions, weight pushes.

    ``engines``: the bridge ranks of each engine's processes (one list per engine, its first process
    answers). ``generate(step, prompt_ids, params)`` splits the prompts over the engines
    (contiguous, equal shares; seeds offset like the synchronous data-parallel split) and returns at
    once; ``collect(step)`` waits for that step's completions (in prompt order) and returns them with
    the policy version that generated them; ``push_weights(named_tensors, version)`` queues the new
    weights for every engine process and returns at once.
    """

    def __init__(self, bridge: dist.ProcessGroup, engines: list[list[int]], *, bucket_bytes: int = 256 << 20):
        self.bridge = bridge
        self.engines = [list(e) for e in engines]
        self.bucket_bytes = int(bucket_bytes)
        self._pending: dict[int, deque] = {}  # destination rank -> (sequence number, work, buffer) not yet freed
        self._sent = 0  # sequence number of the last send
        self._asked: dict[int, list[tuple[int, int]]] = {}  # step -> [(answering rank, number of prompts)]
        self._marks: dict[tuple[int, int], tuple[list[int], int]] = {}  # (rank, step) -> (engine, its last send)
        self._early: dict[tuple[int, int], dict] = {}  # (rank, step) -> a reply received while waiting for another
        self._warned_versions = False

    def _isend(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        self._sent += 1
        self._pending.setdefault(dst, deque()).append((self._sent, self.bridge.send([tensor], dst, tag), tensor))

    def pending_sends(self) -> int:
        """Sends whose buffers are still kept (those an engine may not have taken yet)."""
        return sum(len(q) for q in self._pending.values())

    def _release(self, engine: list[int], upto: int) -> None:
        """Frees the sends to ``engine``'s processes up to sequence number ``upto``: its reply to a later request
        says they were taken (``wait`` returns at once; gloo marks a send complete only there)."""
        for dst in engine:
            q = self._pending.get(dst)
            while q and q[0][0] <= upto:
                q.popleft()[1].wait()

    def _send_obj(self, kind: int, obj, engine: list[int]) -> None:
        body, head = _pack(obj)
        head[0] = kind
        for dst in engine:
            self._isend(head, dst, TAG_HEAD)
            self._isend(body, dst, TAG_BODY)

    def setup(self, info: dict) -> None:
        """The engines' start: model folder, tokenizer, engine settings (they wait for it)."""
        for e in self.engines:
            self._send_obj(SETUP, info, e)

    def generate(self, step: int, prompt_ids: list[list[int]], params: SamplingParams) -> None:
        n, k = len(prompt_ids), len(self.engines)
        shares = [(i * n // k, (i + 1) * n // k) for i in range(k)]
        self._asked[step] = []
        for e, (a, b) in zip(self.engines, shares):
            p = dict(vars(params))
            if p.get("seed") is not None:
                p["seed"] = p["seed"] + a * params.n  # a prompt's seed does not depend on the split
            self._send_obj(GENERATE, {"step": step, "prompts": prompt_ids[a:b], "params": p}, e)
            self._asked[step].append((e[0], b - a))
            self._marks[(e[0], step)] = (e, self._sent)

    def _reply(self, rank: int, step: int) -> dict:
        """Engine ``rank``'s reply to request ``step``: an engine answers in the order it was asked, so the
        replies to earlier requests that come first are kept for their own :meth:`collect`."""
        while (rank, step) not in self._early:
            _, reply = _recv_obj(self.bridge, rank, TAG_REPLY_HEAD, TAG_REPLY_BODY)
            if reply["step"] not in self._asked and reply["step"] != step:
                raise RuntimeError(f"engine rank {rank} answered step {reply['step']}, which was not asked")
            self._early[(rank, reply["step"])] = reply
            engine, upto = self._marks.pop((rank, reply["step"]), (None, 0))
            if engine:
                self._release(engine, upto)
        return self._early.pop((rank, step))

    def collect(self, step: int) -> tuple[list[list[Completion]], int]:
        """``(completions per prompt, policy version)`` of ``step`` (the oldest version among the engines).
        Requests may be collected in any order (an evaluation's before the batches in flight). Every engine gets
        the weight pushes and requests in one order, so they answer a step at one version: engines that did not
        are a warning line, once (the oldest is recorded; the staleness bound holds for it)."""
        comps, versions = [], []
        asked = self._asked.pop(step)
        for r, n in asked:
            reply = self._reply(r, step)
            if len(reply["completions"]) != n:
                raise RuntimeError(f"engine rank {r} answered step {reply['step']} with {len(reply['completions'])} "
                                   f"prompts; expected step {step} with {n}")
            comps += [[Completion(**c) for c in cs] for cs in reply["completions"]]
            versions.append(reply["version"])
        if len(set(versions)) > 1 and not self._warned_versions:
            self._warned_versions = True
            ranks = ", ".join(f"rank {r}: {v}" for (r, _), v in zip(asked, versions))
            print(f"warning: the engines answered step {step} at different policy versions ({ranks}), which they "
                  f"never should: the oldest is recorded (please report this)", file=sys.stderr)
        return comps, min(versions)

    def push_weights(self, named_tensors, version: int) -> None:
        """Queues ``named_tensors`` (HF names) as policy ``version`` for every engine, one flat bucket
        (<= ``bucket_bytes``, one dtype) at a time; the tensors are copied to CPU first."""
        buckets: list[tuple[list, torch.Tensor]] = []
        cur, cur_bytes, cur_dtype = [], 0, None
        items = [(n, t.detach()) for n, t in named_tensors]

        def flush():
            if cur:
                flat = torch.cat([t.reshape(-1).to("cpu") for _, t in cur])
                buckets.append(([(n, tuple(t.shape)) for n, t in cur], flat))

        for name, t in items:
            nbytes = t.numel() * t.element_size()
            if cur and (t.dtype != cur_dtype or cur_bytes + nbytes > self.bucket_bytes):
                flush()
                cur, cur_bytes = [], 0
            cur.append((name, t))
            cur_bytes += nbytes
            cur_dtype = t.dtype
        flush()
        meta = {"version": version, "buckets": [(names, str(flat.dtype), flat.numel()) for names, flat in buckets]}
        for e in self.engines:
            self._send_obj(WEIGHTS, meta, e)
            for dst in e:
                for _, flat in buckets:
                    self._isend(flat, dst, TAG_TENSOR)

    def close(self, *, wait: bool = True) -> None:
        """Tells every engine to stop and (``wait``) waits until they took every message. Without ``wait`` (the
        learner stops on an error) the engines do not wait for it to take their last replies either: one waiting
        until the learner's exit broke the connection printed a second, misleading error line ("another rank
        stopped ... continue with --resume") after the learner's own."""
        for e in self.engines:
            self._send_obj(STOP, {"abandon": not wait}, e)
        if wait:
            for e in self.engines:
                self._release(e, self._sent)


def serve(build_engine, bridge: dist.ProcessGroup, driver: int, *, answers: bool = True) -> int:
    """An engine process's loop: ``build_engine(info)`` from the driver's setup message, then handle
    requests in order until ``stop``; ``answers``: this is its engine's first process (it sends the
    completions). Returns the number of ``generate`` requests served."""
    kind, info = _recv_obj(bridge, driver, TAG_HEAD, TAG_BODY)
    if kind == STOP:  # the learner stopped before its setup was done
        return 0
    engine = build_engine(info)
    version, served, pending = 0, 0, deque()  # pending: (work, buffer) of this engine's replies, 2 sends each
    ahead = max(1, int(info.get("replies_ahead", 4)))
    try:
        while True:
            kind, msg = _recv_obj(bridge, driver, TAG_HEAD, TAG_BODY)
            if kind == STOP:
                if msg.get("abandon"):  # the learner will not take the replies still pending (see RemoteEngines.close)
                    pending.clear()
                break
            if kind == WEIGHTS:
                named = []
                for names, dtype, numel in msg["buckets"]:
                    flat = torch.empty(numel, dtype=getattr(torch, dtype.split(".")[-1]))
                    bridge.recv([flat], driver, TAG_TENSOR).wait()
                    at = 0
                    for name, shape in names:
                        size = 1
                        for d in shape:
                            size *= d
                        named.append((name, flat[at:at + size].view(shape)))
                        at += size
                engine.sync_weights(named)
                version = msg["version"]
            elif kind == GENERATE:
                comps = engine.generate(msg["prompts"], SamplingParams(**msg["params"]))
                if answers:
                    reply = {"step": msg["step"], "version": version,
                             "completions": [[vars(c) for c in cs] for cs in comps]}
                    body, head = _pack(reply)
                    pending.append((bridge.send([head], driver, TAG_REPLY_HEAD), head))
                    pending.append((bridge.send([body], driver, TAG_REPLY_BODY), body))
                    while len(pending) > 2 * ahead:  # the driver took the older ones (see the module docstring)
                        pending.popleft()[0].wait()
                served += 1
        for work, _ in pending:
            work.wait()
    finally:
        engine.close()
    return served
