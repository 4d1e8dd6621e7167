"""The async sampler: a process beside the trainer that samples rounds ahead, lag steps behind.

Parent side (`SamplerProcess`, in the trainer) and child side (`_child_main`), talking over two
queues. Weights go through shared memory, never through disk or a pickle: a ring of L + 1
slots of the trainable tensors (LoRA: the adapter only), made once, before the child starts,
and mapped by both (torch's file-descriptor sharing: no /dev/shm name that could outlive
the job). The trainer publishes a version into the next slot only when a round needs it
(version s = the weights before step s's update, contract.online_async), and tells the child
which slot holds it; the child copies it into its own model before it samples. A slot is
reused only once every round sampled from the version it held has arrived, so after a
restart the ring still holds every version a missing round needs.

Faults: the trainer never waits without a bound (`timeout` per round, with the child's
liveness checked every `POLL` s). A child that dies, or reports an error, is restarted from
the first round the trainer has not received (same prompts, same seeds, same weights: the
same rounds) up to `restarts` times; then the job fails with the child's last error. The
child dies with its parent (PR_SET_PDEATHSIG), and `close` stops and reaps it.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import queue
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch
import torch.multiprocessing as mp

from contract.spec import JobSpec
from trainer.online.rounds import Round

POLL = 0.2  # seconds between liveness checks while waiting
STOP = None


class SamplerError(RuntimeError):
    """The sampler could not deliver a round: it died past its restarts, or timed out."""


@dataclass(frozen=True)
class SamplerJob:
    """What a child needs to start: picklable, no tensors."""

    spec_json: str
    model_dir: str
    total: int
    workdir: str
    threads: int
    first_round: int
    cursor: int
    parent: int


def _die_with_parent(parent: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


def _child_main(job: SamplerJob, ring: list[dict[str, torch.Tensor]], commands, results) -> None:
    """The sampler process: `commands` (a pipe end) brings (version, slot) publications or
    STOP; `results` takes what it reports. Pipes, not queues: no named semaphore to leak."""
    _die_with_parent(job.parent)
    torch.set_num_threads(job.threads)
    # no progress bars, and no process-shared lock for them: tqdm's default one is a named
    # semaphore that a killed sampler could not unlink
    from tqdm import tqdm
    from transformers.utils import logging as hf_logging

    tqdm.set_lock(threading.RLock())
    hf_logging.disable_progress_bar()
    try:
        from trainer.online.producer import RoundProducer

        spec = JobSpec.model_validate_json(job.spec_json)
        producer = RoundProducer(spec, job.model_dir, job.total, job.workdir)
        producer.data.cursor = job.cursor
        for r in range(job.first_round, producer.rounds()):
            need = producer.version_of(r)
            while producer.version < need:
                message = commands.recv()
                if message is STOP:
                    return
                version, slot = message
                if version == need:
                    producer.load_version(version, ring[slot])
                    results.send(("loaded", version))
            new, seconds = producer.produce(r)
            new.behaviour = {row: v.numpy() for row, v in (new.behaviour or {}).items()}
            results.send(("round", r, pickle.dumps(new), seconds))
        results.send(("done",))
        commands.recv()  # until STOP, or the trainer's end of the pipe closes
    except EOFError:
        pass  # the trainer closed the pipe: it is stopping
    except Exception:
        results.send(("error", traceback.format_exc(limit=8)))


def _drain(conn, inbox: queue.Queue) -> None:
    """Move the child's messages into `inbox` until its pipe ends."""
    try:
        while True:
            inbox.put(conn.recv())
    except (EOFError, OSError):
        pass


class SamplerProcess:
    """The trainer's handle on its sampler (see the module docstring)."""

    def __init__(
        self,
        spec: JobSpec,
        model_dir: str,
        total: int,
        workdir: str,
        initial: dict[str, torch.Tensor],
        *,
        version: int,
        first_round: int,
        cursor: int,
        threads: int,
        timeout: float,
        restarts: int,
    ):
        assert spec.online is not None
        self.spec, self.model_dir, self.total, self.workdir = spec, model_dir, total, workdir
        self.lag, self.every = spec.online.resolved_lag, spec.online.sample_every
        self.threads, self.timeout, self.restarts = threads, timeout, restarts
        self.rounds = (total + self.every - 1) // self.every
        # version -> (the first, the last) round it samples
        self.uses: dict[int, tuple[int, int]] = {}
        for r in range(self.rounds):
            v = self.version_of(r)
            self.uses[v] = (self.uses.get(v, (r, r))[0], r)
        self.ring = [
            {k: v.detach().to("cpu", copy=True).share_memory_() for k, v in initial.items()}
            for _ in range(self.lag + 1)
        ]
        self.slot_version: list[int | None] = [None] * len(self.ring)
        self.publications: list[tuple[int, int]] = []  # (version, slot), in order
        self.received: dict[int, Round] = {}
        self.next_round, self.cursor = first_round, cursor  # the first round not yet received
        self.restarted, self.last_error = 0, ""
        self.proc: Any = None
        self.publish(version, initial)
        self._start()

    def version_of(self, r: int) -> int:
        from contract.online_async import sampling_version

        return sampling_version(1 + r * self.every, self.lag)

    # ---- weights ---------------------------------------------------------------------------
    def publish(self, version: int, state: dict[str, torch.Tensor]) -> float:
        """Publish `version` (the weights before step `version`'s update) if a round still
        to be sampled needs it; the seconds it took."""
        first, _ = self.uses.get(version, (-1, -1))
        if first < self.next_round:  # no round still to come is sampled by it
            return 0.0
        t0 = time.perf_counter()
        slot = len(self.publications) % len(self.ring)
        held = self.slot_version[slot]
        if held is not None:  # every round sampled from it must have arrived (they have:
            self.wait_for(self.uses[held][1])  # the trainer has trained them: a formality)
        for k, v in state.items():
            self.ring[slot][k].copy_(v)
        self.slot_version[slot] = version
        self.publications.append((version, slot))
        if self.proc is not None:  # else _start sends it
            self._send((version, slot))
        return time.perf_counter() - t0

    # ---- rounds ----------------------------------------------------------------------------
    def take(self, r: int) -> Round:
        """Round `r`, waiting (bounded) until the sampler has delivered it."""
        self.wait_for(r)
        return self.received.pop(r)

    def wait_for(self, r: int) -> None:
        deadline = time.monotonic() + self.timeout
        while self.next_round <= r:
            try:
                message = self.inbox.get(timeout=POLL)
            except queue.Empty:
                if not self.proc.is_alive():
                    self._restart(f"the sampler process exited with code {self.proc.exitcode}")
                    deadline = time.monotonic() + self.timeout
                elif time.monotonic() > deadline:
                    self._stop()
                    raise SamplerError(
                        f"the sampler delivered no round in {self.timeout:.0f} s (waiting for "
                        f"round {self.next_round}): it cannot keep up, or it is stuck"
                    ) from None
                continue
            kind = message[0]
            if kind == "round" and message[1] == self.next_round:
                new: Round = pickle.loads(message[2])
                sent = new.behaviour or {}
                new.behaviour = {row: torch.from_numpy(v) for row, v in sent.items()}
                self.received[message[1]] = new
                self.next_round, self.cursor = message[1] + 1, new.cursor
            elif kind == "error":
                self._restart(f"the sampler failed:\n{message[1]}")
                deadline = time.monotonic() + self.timeout

    # ---- the process -----------------------------------------------------------------------
    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        commands, self.commands = ctx.Pipe(duplex=False)  # (child reads, trainer writes)
        self.results, results = ctx.Pipe(duplex=False)  # (trainer reads, child writes)
        job = SamplerJob(
            self.spec.model_dump_json(),
            str(self.model_dir),
            self.total,
            str(self.workdir),
            self.threads,
            self.next_round,
            self.cursor,
            os.getpid(),
        )
        self.proc = ctx.Process(
            target=_child_main,
            args=(job, self.ring, commands, results),
            daemon=True,
            name="humanline-sampler",
        )
        self.proc.start()
        commands.close()  # the child's ends: EOF on ours when it dies
        results.close()
        # a reader thread drains the child's pipe as messages come, so the child never blocks
        # on a full pipe while the trainer is busy
        self.inbox: queue.Queue = queue.Queue()
        self.reader = threading.Thread(
            target=_drain, args=(self.results, self.inbox), daemon=True, name="sampler-inbox"
        )
        self.reader.start()
        if self.next_round < self.rounds:  # the versions the rounds still due need
            need = self.version_of(self.next_round)
            for version, slot in self.publications:
                if version >= need:
                    self._send((version, slot))

    def _send(self, message) -> None:
        """To the child; a child that died meanwhile is restarted by the next wait_for (which
        sends it every publication it still needs)."""
        try:
            self.commands.send(message)
        except OSError:
            pass

    def _restart(self, why: str) -> None:
        self.last_error = why
        self._stop()
        if self.restarted >= self.restarts:
            raise SamplerError(
                f"the sampler process failed {self.restarted + 1} times "
                f"(restarts allowed: {self.restarts}); last: {why}"
            )
        self.restarted += 1
        self._start()

    def _stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.is_alive():
            try:
                self.commands.send(STOP)
            except OSError:
                pass
            self.proc.join(2)
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.commands.close()
        self.results.close()  # ends the reader thread
        self.reader.join(5)
        self.proc.close()
        self.proc = None

    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def close(self) -> None:
        self._stop()
        self.ring = []
