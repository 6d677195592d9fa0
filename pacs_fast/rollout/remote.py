"""Rollout engines on their own processes, driven by the learner over ``torch.distributed``.

Asynchronous runs (``rollout.ranks=R``, ``rollout.max_staleness=K``; :mod:`pacs_fast.trainer.async_loop`)
put the learner on rank 0 and one rollout engine on each of ranks ``1..R`` of a ``torchrun`` launch.
Nothing but torch.distributed point-to-point messages connects them (gloo on CPU; the weights travel
as CPU tensors), in the order they were sent (one tag per kind of message):

- learner -> engine: a request header (``int64 [2]``: kind, payload bytes) and its pickled payload:
  ``generate`` (step, prompt ids, sampling parameters), ``weights`` (policy version, the names /
  shapes / dtypes of the tensors that follow, then the tensors one flat bucket per dtype at a time),
  ``stop``;
- engine -> learner: the completions of a ``generate`` request (header and pickled payload) with
  the policy version that produced them.

The learner never waits on an engine to send: every learner send is ``isend`` and its buffer is kept
until the engine took it, so a weight push costs the learner one copy of the weights, not the
engine's generation time. An engine handles its messages in order, so a ``generate`` request sent
after ``weights`` of version v runs on version v (or newer).

:func:`serve` is an engine rank's whole life; :class:`RemoteEngines` is the learner's side.
"""
from __future__ import annotations

import pickle
from collections import deque

import torch
import torch.distributed as dist

from pacs_fast.rollout.base import Completion, SamplingParams

STOP, GENERATE, WEIGHTS = 0, 1, 2
TAG_HEAD, TAG_BODY, TAG_TENSOR, TAG_REPLY_HEAD, TAG_REPLY_BODY = 11, 12, 13, 14, 15


def _pack(obj) -> tuple[torch.Tensor, torch.Tensor]:
    body = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    return body, torch.tensor([0, body.numel()], dtype=torch.int64)


def _recv_obj(src: int, head_tag: int, body_tag: int) -> tuple[int, object]:
    head = torch.empty(2, dtype=torch.int64)
    dist.recv(head, src=src, tag=head_tag)
    body = torch.empty(int(head[1]), dtype=torch.uint8)
    dist.recv(body, src=src, tag=body_tag)
    return int(head[0]), pickle.loads(body.numpy().tobytes())


class RemoteEngines:
    """The learner's handle on the engine ranks (``ranks``): requests, completions, weight pushes.

    ``generate(step, prompt_ids, params)`` splits the prompts over the engines (contiguous, equal
    shares; seeds offset like the synchronous data-parallel split) and returns at once;
    ``collect(step)`` waits for that step's completions (in prompt order) and returns them with the
    policy version that generated them; ``push_weights(named_tensors, version)`` queues the new
    weights for every engine and returns at once.
    """

    def __init__(self, ranks: list[int], *, bucket_bytes: int = 256 << 20):
        self.ranks = list(ranks)
        self.bucket_bytes = int(bucket_bytes)
        self._pending: deque = deque()  # (work, buffers) of isends not yet taken
        self._asked: dict[int, list[tuple[int, int]]] = {}  # step -> [(rank, number of prompts)]

    def _isend(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        self._pending.append((dist.isend(tensor, dst=dst, tag=tag), tensor))

    def _send_obj(self, kind: int, obj, dst: int) -> None:
        body, head = _pack(obj)
        head[0] = kind
        self._isend(head, dst, TAG_HEAD)
        self._isend(body, dst, TAG_BODY)

    def _prune(self) -> None:
        while self._pending and self._pending[0][0].is_completed():
            self._pending.popleft()

    def setup(self, info: dict) -> None:
        """The engines' start: model folder, tokenizer, engine settings (a blocking send: they wait for it)."""
        for r in self.ranks:
            dist.send_object_list([info], dst=r)

    def generate(self, step: int, prompt_ids: list[list[int]], params: SamplingParams) -> None:
        n, k = len(prompt_ids), len(self.ranks)
        shares = [(i * n // k, (i + 1) * n // k) for i in range(k)]
        self._asked[step] = []
        for r, (a, b) in zip(self.ranks, shares):
            p = dict(vars(params))
            if p.get("seed") is not None:
                p["seed"] = p["seed"] + a * params.n  # a prompt's seed does not depend on the split
            self._send_obj(GENERATE, {"step": step, "prompts": prompt_ids[a:b], "params": p}, r)
            self._asked[step].append((r, b - a))
        self._prune()

    def collect(self, step: int) -> tuple[list[list[Completion]], int]:
        """``(completions per prompt, policy version)`` of ``step`` (the oldest version among the engines)."""
        comps, versions = [], []
        for r, n in self._asked.pop(step):
            _, reply = _recv_obj(r, TAG_REPLY_HEAD, TAG_REPLY_BODY)
            if reply["step"] != step or len(reply["completions"]) != n:
                raise RuntimeError(f"engine rank {r} answered step {reply['step']} with {len(reply['completions'])} "
                                   f"prompts; expected step {step} with {n}")
            comps += [[Completion(**c) for c in cs] for cs in reply["completions"]]
            versions.append(reply["version"])
        self._prune()
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
        for r in self.ranks:
            self._send_obj(WEIGHTS, meta, r)
            for _, flat in buckets:
                self._isend(flat, r, TAG_TENSOR)
        self._prune()

    def close(self, *, wait: bool = True) -> None:
        """Tells every engine to stop and (``wait``) waits until they took every message."""
        for r in self.ranks:
            self._send_obj(STOP, {}, r)
        while wait and self._pending:
            work, _ = self._pending.popleft()
            work.wait()


def serve(build_engine, learner_rank: int = 0) -> int:
    """An engine rank's loop: ``build_engine(info)`` from the learner's setup message, then answer
    requests in order until ``stop``. Returns the number of ``generate`` requests served."""
    box = [None]
    dist.recv_object_list(box, src=learner_rank)
    engine = build_engine(box[0])
    version, served, pending = 0, 0, deque()
    try:
        while True:
            kind, msg = _recv_obj(learner_rank, TAG_HEAD, TAG_BODY)
            if kind == STOP:
                break
            if kind == WEIGHTS:
                named = []
                for names, dtype, numel in msg["buckets"]:
                    flat = torch.empty(numel, dtype=getattr(torch, dtype.split(".")[-1]))
                    dist.recv(flat, src=learner_rank, tag=TAG_TENSOR)
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
                comps = engine.generate(msg["prompts"], SamplingParams(**msg["params"])) if msg["prompts"] else []
                reply = {"step": msg["step"], "version": version,
                         "completions": [[vars(c) for c in cs] for cs in comps]}
                body, head = _pack(reply)
                pending.append((dist.isend(head, dst=learner_rank, tag=TAG_REPLY_HEAD), head))
                pending.append((dist.isend(body, dst=learner_rank, tag=TAG_REPLY_BODY), body))
                served += 1
        for work, _ in pending:
            work.wait()
    finally:
        engine.close()
    return served
