"""A verification past one process: the term stream sharded over ``torch.distributed`` ranks.

Under ``torchrun --nproc-per-node N tcircuits verify …`` (NCCL on GPUs, gloo on CPUs) every rank
builds the same expansion, evaluates a disjoint share of it, and the ranks meet once at the end:
the sums of the terms are added (``all_reduce``), the largest term taken (``MAX``), and every rank's
term results (norms, errors, verdicts) gathered, so that each rank holds the whole report and its
worst errors (rank 0 prints it). Before they split the work they check that they verify the same
thing (:func:`~numeric_check.verification.verify.verify_logits`). No process pool of our own: the processes are torchrun's.

The share is by units of work that keep shared work on one rank, assigned largest first, each to the
least loaded rank by terms (:meth:`Shard.assign`), the same on every rank since the expansion is. With
the grouped evaluation a unit is a group of prefixes (one pass of check 2's copies of it) with every
group that extends it, or a direct term; through the shared trie (:meth:`Shard.select`) it is a
*prefix*: terms that start with the same source and first head (at order 2 of GPT-2 small 1,094
prefixes), which share the trie's work and the isolation pass's copies; when there are too few
prefixes for the ranks (a small model), the first two heads make the prefix.

A rank that dies or stops answering makes the others' next collective fail (at once when its
connection closes; after ``timeout`` when it hangs): they raise a one-line
:class:`~numeric_check.errors.VerifyError` and no report is written.

>>> from derivations.architecture import Architecture
>>> from derivations.paths import expand_logits
>>> terms = list(expand_logits(Architecture(2, 2), 2))
>>> shares = [Shard(rank, 2).select(terms) for rank in range(2)]
>>> sorted(shares[0] + shares[1]) == list(range(len(terms))), set(shares[0]) & set(shares[1])
(True, set())
"""

from __future__ import annotations

import hashlib
import heapq
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from tensoralg.escape import terminal_safe

from numeric_check.errors import VerifyError

PREFIXES_PER_RANK = 8  # fewer prefixes of one head than this per rank: prefixes of two heads
DEFAULT_TIMEOUT_S = 1800.0  # how long a rank waits for the others at a collective


@dataclass(frozen=True)
class Shard:
    """This process's share of a verification: rank ``rank`` of ``world`` (``group``: the
    ``torch.distributed`` process group, ``None`` for the default one or for a plan made without one)."""

    rank: int
    world: int
    group: Any = None

    @classmethod
    def current(cls, distributed: bool | None) -> "Shard | None":
        """The shard of this process: ``None`` when ``distributed`` is False, or when it is ``None`` and
        ``torch.distributed`` is not initialised with more than one rank; a :class:`VerifyError` when
        ``distributed`` is True and it is not initialised."""
        if distributed is False:
            return None
        dist = torch.distributed
        ready = dist.is_available() and dist.is_initialized()
        if not ready:
            if distributed:
                raise VerifyError("distributed=True needs torch.distributed initialised (run under torchrun, or call "
                                  "torch.distributed.init_process_group first)")
            return None
        world = dist.get_world_size()
        return cls(dist.get_rank(), world) if world > 1 or distributed else None

    def select(self, terms: Sequence, prefix: Callable[[Any, int], tuple] | None = None) -> list[int]:
        """The indices (ascending) of the terms this rank evaluates: whole prefixes (``prefix(term,
        depth)``, by default the term's source and first ``depth`` heads), largest first to the least
        loaded rank."""
        prefix = _logit_prefix if prefix is None else prefix
        depth = 1
        keys = [prefix(t, depth) for t in terms]
        if len(set(keys)) < PREFIXES_PER_RANK * self.world:
            depth = 2
            keys = [prefix(t, depth) for t in terms]
        members: dict[tuple, list[int]] = {}
        for i, key in enumerate(keys):
            members.setdefault(key, []).append(i)
        groups = list(members.values())
        return sorted(i for g in self.assign([len(g) for g in groups]) for i in groups[g])

    def assign(self, weights: Sequence[int]) -> list[int]:
        """The indices (ascending) of the units of work (``weights``: each one's terms) this rank takes: the
        largest first, each to the least loaded rank (the same on every rank, given the same weights).

        >>> [Shard(r, 2).assign([5, 1, 3, 3]) for r in range(2)]
        [[0, 1], [2, 3]]
        """
        loads = [(0, r) for r in range(self.world)]  # (terms, rank): a heap
        mine: list[int] = []
        for unit in sorted(range(len(weights)), key=lambda u: (-weights[u], u)):
            load, rank = heapq.heappop(loads)
            if rank == self.rank:
                mine.append(unit)
            heapq.heappush(loads, (load + weights[unit], rank))
        return sorted(mine)

    def agree(self, n_terms: int, rec, scale: float) -> None:
        """Before the ranks split the work: a one-line :class:`VerifyError` on every rank unless all verify the
        same thing (the same number of terms, the same tokens, the same model's output: its largest entry;
        ``rec``: the recording of the model's forward pass)."""
        tokens = hashlib.sha256(rec.tokens.detach().to("cpu", torch.int64).contiguous().numpy().tobytes()).hexdigest()
        theirs = self.gather((n_terms, tuple(rec.final.shape), tokens, float(scale)), "agreeing on what to verify")
        differ = [r for r, t in enumerate(theirs) if t != theirs[0]]
        if differ:
            n, shape, _, top = theirs[differ[0]]
            what = "tokens" if theirs[differ[0]][2] != theirs[0][2] else "model or options"
            raise VerifyError(f"the {self.world} ranks were not given the same verification (their {what} differ): rank "
                              f"{differ[0]} has {n:,} terms, activations {list(shape)} and largest output {top:.6g}, rank 0 "
                              f"{theirs[0][0]:,}, {list(theirs[0][1])} and {theirs[0][3]:.6g}; give every rank the same model, "
                              "tokens and options")

    def gathered(self, mine: Sequence[int], results: Sequence, n: int) -> list:
        """Every rank's term results (``results[k]`` that of term ``mine[k]``), in the expansion's order."""
        out: list = [None] * n
        for indices, theirs in self.gather((list(mine), list(results)), "gathering the term results"):
            for i, r in zip(indices, theirs):
                out[i] = r
        self._all_had_a_rank([i for i, r in enumerate(out) if r is None])
        return out

    def gathered_table(self, table, mine: np.ndarray):
        """Every rank's rows of a :class:`~numeric_check.verification.results.TermTable` (``mine``: the rows
        this rank filled) put into ``table``, which is returned."""
        covered = np.zeros(len(table), bool)
        for rows, part in self.gather((mine, table.take(mine)), "gathering the term results"):
            table.put(rows, part)
            covered[rows] = True
        self._all_had_a_rank(np.flatnonzero(~covered).tolist())
        return table

    def _all_had_a_rank(self, missing: list[int]) -> None:
        if missing:
            raise VerifyError(f"rank {self.rank} of {self.world}: {len(missing):,} terms had no rank (e.g. term {missing[0]}); "
                              "every rank must build the same expansion")

    # -- collectives: each a one-line VerifyError when another rank is gone ---------------------------
    def sum_(self, tensor: Tensor, what: str) -> Tensor:
        """``tensor`` summed over the ranks, in place."""
        return self._call(lambda: torch.distributed.all_reduce(tensor, group=self.group), what, tensor)

    def max(self, value: float, what: str, like: Tensor) -> float:
        """The largest ``value`` of any rank (sent as a tensor made like ``like``)."""
        t = torch.tensor([value], dtype=torch.float64, device=like.device)
        self._call(lambda: torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=self.group), what)
        return float(t)

    def gather(self, obj: Any, what: str) -> list:
        """Every rank's ``obj``, in rank order (pickled)."""
        out: list = [None] * self.world
        self._call(lambda: torch.distributed.all_gather_object(out, obj, group=self.group), what)
        return out

    def _call(self, collective: Callable[[], Any], what: str, result: Any = None) -> Any:
        try:
            collective()
        except (RuntimeError, ValueError) as error:  # DistBackendError and gloo's connection errors are RuntimeErrors
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise VerifyError(f"rank {self.rank} of {self.world}: another rank stopped or did not answer while "
                              f"{what} ({first[:200]}); no report written") from None
        return result


def _logit_prefix(term, depth: int) -> tuple:
    """A logits term's prefix: its source and its first ``depth`` heads."""
    return (term.source.input_key, term.heads[:depth])


def qk_prefix(term, depth: int) -> tuple:
    """A QK term's prefix: its query side's source and first ``depth`` heads, then its key side's source."""
    return (term.query.source.input_key, term.query.heads[:depth], term.key.source.input_key)


#: How long a rank waits to meet the others when it starts (the rendezvous), at most: a master that
#: cannot be reached is one line after this long, not a silent wait of ``--rank-timeout``.
JOIN_TIMEOUT_S = 300.0
_MAX_WORLD = 1 << 20


@dataclass(frozen=True)
class Torchrun:
    """What torchrun put in the environment for this process, read and checked: ``WORLD_SIZE`` ranks,
    this one ``RANK`` (``LOCAL_RANK`` on its machine), meeting at ``MASTER_ADDR:MASTER_PORT``."""

    world: int
    rank: int
    local: int
    address: str
    port: int

    @classmethod
    def from_environment(cls, environ=None) -> "Torchrun | None":
        """The torchrun environment, or None when ``WORLD_SIZE`` is unset or 1; a variable that is set
        but unusable (``WORLD_SIZE=abc``, ``MASTER_PORT=99999``, ``RANK`` not below ``WORLD_SIZE``) is
        one :class:`VerifyError` line naming it.

        >>> Torchrun.from_environment({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
        Torchrun(world=2, rank=1, local=0, address='10.0.0.1', port=29500)
        >>> Torchrun.from_environment({"WORLD_SIZE": "abc"})
        Traceback (most recent call last):
        ...
        numeric_check.errors.VerifyError: the environment variable WORLD_SIZE='abc' is not a whole number (torchrun sets it to the number of ranks)
        """
        import os

        env = os.environ if environ is None else environ
        world = _env_int(env, "WORLD_SIZE", 1, _MAX_WORLD, "the number of ranks", default=1)
        if world <= 1:
            return None
        rank = _env_int(env, "RANK", 0, world - 1, f"this rank's number, 0 to {world - 1}")
        local = _env_int(env, "LOCAL_RANK", 0, world - 1, "this rank's number on its machine", default=0)
        port = _env_int(env, "MASTER_PORT", 1, 65535, "the port the ranks meet at, 1 to 65535")
        address = env.get("MASTER_ADDR")
        if address is None or not address.strip():
            raise VerifyError(f"WORLD_SIZE={world} but MASTER_ADDR is not set: start the ranks with torchrun, which sets "
                              "where they meet")
        if len(address) > 253 or not all(ch.isascii() and (ch.isalnum() or ch in ".-_:[]%") for ch in address):
            raise VerifyError(f"the environment variable MASTER_ADDR={terminal_safe(repr(address[:80]))} is not a host "
                              "name or an IP address")
        return cls(world, rank, local, address, port)


def _env_int(env, name: str, low: int, high: int, what: str, default: int | None = None) -> int:
    text = env.get(name)
    if text is None or (text == "" and default is not None):
        if default is None:
            raise VerifyError(f"WORLD_SIZE={env.get('WORLD_SIZE', '').strip()} but {name} is not set (torchrun sets it to "
                              f"{what})")  # WORLD_SIZE is read first: its digits alone
        return default
    stripped = text.strip()
    if not (stripped.isascii() and stripped.isdigit() and len(stripped) <= 9):
        raise VerifyError(f"the environment variable {name}={terminal_safe(repr(text[:80]))} is not a whole number "
                          f"(torchrun sets it to {what})")
    value = int(stripped)
    if not low <= value <= high:
        raise VerifyError(f"the environment variable {name}={value} is outside {low}..{high} (torchrun sets it to {what})")
    return value


def init_from_environment(device: torch.device, timeout_s: float = DEFAULT_TIMEOUT_S,
                          join_timeout_s: float = JOIN_TIMEOUT_S) -> torch.device:
    """Under torchrun (``WORLD_SIZE`` > 1 in the environment, read by :meth:`Torchrun.from_environment`):
    initialise the default process group (NCCL for a CUDA ``device``, gloo otherwise) and return this
    rank's device (``cuda:LOCAL_RANK`` for CUDA, one card per rank); otherwise ``device`` unchanged.
    Meeting the others waits at most ``join_timeout_s`` (or ``timeout_s`` when shorter): past it, one
    :class:`VerifyError` line, or — when the library does not return — one line and exit status 2;
    then every collective waits at most ``timeout_s``."""
    for name, value in (("timeout", timeout_s), ("join timeout (--join-timeout)", join_timeout_s)):
        if not value > 0:
            raise VerifyError(f"the ranks' {name} must be a number of seconds > 0, got {value!r}")
    run = Torchrun.from_environment()
    if run is None or torch.distributed.is_initialized():
        return device
    if device.type == "cuda":
        if run.local >= torch.cuda.device_count():
            raise VerifyError(f"rank {run.rank} of {run.world} would use cuda:{run.local}, but this machine has "
                              f"{torch.cuda.device_count()} CUDA devices; start at most that many ranks per machine "
                              "(torchrun --nproc-per-node), or use --device cpu")
        device = torch.device("cuda", run.local)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    join = min(join_timeout_s, timeout_s)
    where = f"rank {run.rank} of {run.world} could not meet the others at {run.address}:{run.port} ({backend})"
    try:
        with _bounded_join(join, where):
            torch.distributed.init_process_group(backend, timeout=timedelta(seconds=join),
                                                 **({"device_id": device} if backend == "nccl" else {}))
    except (RuntimeError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise VerifyError(f"{where}: {first[:200]}") from None
    set_timeout = getattr(torch.distributed.distributed_c10d, "_set_pg_timeout", None)
    if set_timeout is not None and join != timeout_s:
        set_timeout(timedelta(seconds=timeout_s))  # the rendezvous was bounded by the join; collectives by this
    _stop_on_sigterm(run.rank, run.world)
    return device


@contextmanager
def _bounded_join(seconds: float, where: str):
    """The block within ``seconds`` (and a little for the library's own retries): past it, the line
    ``where`` (waited N s) on standard error and exit status 2, since a rendezvous that retries inside
    the library never returns to Python; meanwhile the library's own messages (C++ warnings, stack
    frames) go to a file instead of the terminal, and are dropped."""
    import os
    import sys
    import tempfile
    import threading

    done = threading.Event()
    sys.stderr.flush()
    saved = os.dup(2)
    quiet = tempfile.TemporaryFile()
    os.dup2(quiet.fileno(), 2)

    def watch() -> None:
        if not done.wait(seconds + JOIN_GRACE_S):
            os.write(saved, terminal_safe(f"tcircuits verify: error: {where}: no answer within {seconds:.0f} s\n").encode())
            os._exit(2)

    threading.Thread(target=watch, daemon=True, name="tcircuits-join-bound").start()
    try:
        yield
    finally:
        done.set()
        os.dup2(saved, 2)
        os.close(saved)
        quiet.close()


JOIN_GRACE_S = 15.0  # beyond the join timeout, for the library to give up by itself


def is_first_rank() -> bool:
    """Whether this process prints: rank 0, or the only process."""
    return not (torch.distributed.is_available() and torch.distributed.is_initialized()) or torch.distributed.get_rank() == 0


def _stop_on_sigterm(rank: int, world: int) -> None:
    """torchrun ends the other ranks with SIGTERM when one fails: end this one with a one-line error."""
    import signal

    def stop(signum, frame):
        raise VerifyError(f"rank {rank} of {world}: stopped by torchrun (another rank failed); no report written")

    signal.signal(signal.SIGTERM, stop)


def finish() -> None:
    """Leave the process group made by :func:`init_from_environment` (if any)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
