"""Executors for item-parallel stages.

A stage's work is a list of item ids and a picklable *compute* callable that turns a batch of
ids into results.  Each worker writes its items itself (atomic writes, its own ledger), so
killing a worker loses at most the items it was computing, and re-running the same command
computes only what is missing.  Shards are deterministic: item ``i`` belongs to shard
``int(sha256(id)[:8], 16) mod N``, so ``--shard I/N`` tasks write disjoint items.

Executors (one interface, :class:`Executor`: batches in, per-item outcomes out):

``local``
    joblib/loky processes (in-process for one job); the reference behaviour.
``slurm``
    inside one task of a SLURM job array: compute this task's shard (``--shard I/N``, by
    default ``SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT``) with the local executor.
    ``featpipe submit --backend slurm`` writes and submits the array script.
``dask``
    batches go to the workers of a ``distributed`` scheduler (``--scheduler ADDRESS``); each
    worker writes its items and its own ledger exactly like a local worker.

Every failure belongs to its own item: when a batch's compute raises, each of its items is
computed alone, so one bad item never fails (or is blamed for) its neighbours.  A write that
fails for the store itself (disk full, read-only: :class:`~featpipe.errors.WriteError`) is no
item's fault: the run stops there, keeping every item already recorded.

``--jobs N`` (:func:`resolve_jobs`): ``-1`` is every core this process may use; ``N`` above
that count is capped to it with a warning; ``0`` and other negatives are a usage error.
Local worker processes exit when their parent dies, even by SIGKILL (:func:`worker_init`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from featpipe.backend import available_cores
from featpipe.errors import (
    FeatpipeError,
    ParameterError,
    WriteError,
    describe_error,
)
from featpipe.fileio import first_line, shard_of
from featpipe.flags import flag_of
from featpipe.manifest import needs_row_fix
from featpipe.settings import node_checks_deferred
from featpipe.store import Stage
from featpipe.store.batches import COMMIT_ITEMS, commits_in_batches, is_small
from featpipe.store.index import COMPACT_EVERY_S

log = logging.getLogger("featpipe")

ON_ERROR = ("fail", "skip")


@dataclass
class ItemOutput:
    """What a compute callable returns for one item: the array and optional sidecars."""

    array: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)


#: what a compute returns for an item it wrote and recorded itself (streamed to disk)
WRITTEN = "written"

#: compute(batch of ids) -> one ItemOutput, WRITTEN or Exception per id, in order.
Compute = Callable[[Sequence[str]], Sequence["ItemOutput | str | BaseException"]]


@dataclass
class RunSummary:
    """Counts of one stage run: items done now, skipped (already complete) and failed."""

    done: int = 0
    skipped: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    not_in_shard: int = 0

    def line(self) -> str:
        text = f"{self.done} done, {self.skipped} skipped (already complete), " \
               f"{len(self.failed)} failed"
        if self.not_in_shard:
            text += f", {self.not_in_shard} in other shards"
        return text


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``'I/N'`` -> ``(I, N)``; ``None`` falls back to SLURM_ARRAY_TASK_ID/COUNT when set."""
    if text is None:
        task, count = os.environ.get("SLURM_ARRAY_TASK_ID"), os.environ.get(
            "SLURM_ARRAY_TASK_COUNT")
        if task is None or count is None:
            return None
        text = f"{task}/{count}"
    try:
        index, total = (int(x) for x in text.split("/"))
    except ValueError:
        raise FeatpipeError(f"--shard must look like I/N (e.g. 0/4), got {text!r}") from None
    if total < 1 or not 0 <= index < total:
        raise FeatpipeError(f"--shard {text}: need 0 <= I < N")
    return index, total


def resolve_jobs(jobs: int, option: str = "jobs") -> int:
    """Worker count for ``--jobs``: ``-1`` = every available core; ``N >= 1`` capped at the
    available cores (with a warning: more processes than cores only compete for them; not
    when the check is for a cluster task, whose node has its own cores:
    :func:`~featpipe.settings.node_checks_deferred`); ``0`` or another negative value is a
    :class:`ParameterError`."""
    jobs = int(jobs)
    cores = available_cores()
    if jobs == -1:
        return cores
    if jobs < 1:
        raise ParameterError(option, f"must be a positive number of processes or -1 (one per "
                                     f"core), got {jobs}")
    if jobs > cores and not node_checks_deferred():  # else checked on the node
        log.warning("%s %d is more than the %d core(s) available to this process; using %d",
                    flag_of(option), jobs, cores, cores)
        return cores
    return jobs


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def worker_init(parent: int) -> None:
    """Runs first in every local worker process: exit as soon as ``parent`` is gone.

    On Linux the kernel sends SIGKILL when the parent dies (``PR_SET_PDEATHSIG``), even while
    the worker is busy in compiled code; elsewhere a daemon thread polls the parent.  Without
    this, loky workers of a SIGKILLed command outlive it until their idle timeout (minutes).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # 1 = PR_SET_PDEATHSIG
            raise OSError(ctypes.get_errno(), "prctl")
    except (OSError, AttributeError):
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    if os.getppid() != parent:  # the parent died before the death signal was armed
        os._exit(1)


def worker_pool(n_jobs: int, **kwargs):
    """A joblib/loky ``Parallel`` whose workers exit with their parent (:func:`worker_init`)."""
    from joblib import Parallel

    return Parallel(n_jobs=n_jobs, backend="loky", initializer=worker_init,
                    initargs=(os.getpid(),), **kwargs)


def plan(stage: Stage, ids: Sequence[str], force: bool = False,
         shard: tuple[int, int] | None = None) -> tuple[list[str], RunSummary]:
    """The ids this process must compute, and a summary pre-filled with skipped counts.

    A done item whose file is cut short (:meth:`~featpipe.store.Stage.truncated_ids`) is
    computed again, as ``cache verify`` says."""
    summary = RunSummary()
    mine = [i for i in ids if shard is None or shard_of(i, shard[1]) == shard[0]]
    done = set() if force else stage.done_ids().intersection(mine)
    done -= stage.truncated_ids(done)
    todo = []
    for item_id in mine:
        if item_id in done:
            summary.skipped += 1
        else:
            todo.append(item_id)
    summary.not_in_shard = len(ids) - len(mine)
    return todo, summary


def compute_each(compute: Compute, ids: Sequence[str]) -> list:
    """``compute(ids)``; when it raises for a batch, each item is computed alone, so the
    exception is recorded against the item that raised it and the others complete."""
    try:
        results = list(compute(ids))
        if len(results) != len(ids):
            raise RuntimeError(f"compute returned {len(results)} results for {len(ids)} items")
        return results
    except WriteError:
        raise
    except Exception as err:
        if len(ids) == 1:
            return [err]
    return [compute_each(compute, [item_id])[0] for item_id in ids]


def process_batch(stage: Stage, compute: Compute, ids: Sequence[str],
                  compute_size: int | None = None) -> list[tuple[str, str | None]]:
    """Compute a chunk of items ``compute_size`` at a time (all at once by default), write
    each result, record each outcome; returns (id, error or None).

    In a stage that commits small items in batches (:mod:`featpipe.store.batches`) the chunk's
    small items and failures are committed together at its end (one file, one ledger
    write); other results are written as they come.  A :class:`WriteError` (the store cannot
    be written) propagates: it is no item's fault.
    """
    group = stage.batch_writer()
    outcomes = []
    for part in batches(ids, compute_size or len(ids)):
        started = time.perf_counter()
        results = compute_each(compute, part)
        seconds = (time.perf_counter() - started) / max(len(part), 1)
        for item_id, result in zip(part, results, strict=True):
            error = None
            if isinstance(result, WriteError):  # caught per item by its compute: still the
                raise result                     # store's fault, never the item's
            if isinstance(result, BaseException):
                error = describe_error(result)
            elif result is not WRITTEN:
                try:
                    if group is not None and is_small(result.array, result.extras):
                        group.add(item_id, result.array, result.extras, seconds)
                    else:
                        stage.write_item(item_id, result.array, result.extras,
                                         seconds=seconds)
                except WriteError:
                    raise
                except Exception as err:
                    error = describe_error(err)
            if error is not None:
                if group is not None:
                    group.fail(item_id, seconds, error)
                else:
                    stage.record(item_id, "failed", seconds=seconds, error=error)
            outcomes.append((item_id, error))
    if group is not None:
        group.commit()
    return outcomes


def batches(ids: Sequence[str], size: int) -> list[list[str]]:
    size = max(1, int(size))
    return [list(ids[i:i + size]) for i in range(0, len(ids), size)]


Outcomes = list[tuple[str, str | None]]


class Executor:
    """Runs batches of item ids through :func:`process_batch`; yields each batch's outcomes.

    Workers write items and ledgers themselves, so the caller only counts outcomes.  Closing
    the generator early (``on_error='fail'``) must stop handing out new batches.
    """

    name = "base"

    def outcomes(self, stage: Stage, compute: Compute, chunks: list[list[str]],
                 compute_size: int | None = None) -> Iterator[Outcomes]:
        """Each chunk's outcomes (:func:`process_batch`, ``compute_size`` ids a call)."""
        raise NotImplementedError

    def check_shard(self, shard: tuple[int, int] | None) -> None:
        """Refuse a shard setting this executor cannot honour (default: any is fine)."""


def _process_batch_in(folder: str, *args) -> list[tuple[str, str | None]]:
    """:func:`process_batch` in a local worker, from ``folder``, the working folder of the
    process that sent the work: loky reuses its workers, and one started by an earlier run
    in another folder (a library user's ``os.chdir``) would read a relative store path
    from there."""
    os.chdir(folder)
    return process_batch(*args)


class LocalExecutor(Executor):
    """joblib/loky worker processes on this machine; one job runs in-process."""

    name = "local"

    def __init__(self, jobs: int = 1):
        self.jobs = resolve_jobs(jobs)

    def outcomes(self, stage, compute, chunks, compute_size=None):
        if self.jobs == 1 or len(chunks) <= 1:
            for chunk in chunks:
                yield process_batch(stage, compute, chunk, compute_size)
            return
        from joblib import delayed
        from joblib.externals.loky.process_executor import TerminatedWorkerError

        parallel = worker_pool(self.jobs, return_as="generator_unordered")
        folder = os.getcwd()
        results = parallel(delayed(_process_batch_in)(folder, stage, compute, chunk,
                                                      compute_size) for chunk in chunks)
        try:
            yield from results
        except TerminatedWorkerError:
            raise FeatpipeError(
                f"a worker process of stage {stage.name} died (killed, out of memory or "
                "crashed); items already written are kept: re-run the same command to compute "
                "the rest") from None
        finally:
            results.close()


class SlurmExecutor(LocalExecutor):
    """One task of a SLURM job array: computes its own shard with local processes."""

    name = "slurm"

    def check_shard(self, shard):
        if shard is None:
            raise FeatpipeError(
                "--executor slurm computes one shard of a SLURM job array: run it inside an "
                "array task (SLURM_ARRAY_TASK_ID/COUNT set) or give --shard I/N; "
                "`featpipe submit --backend slurm -- COMMAND` writes and submits the array")


class DaskExecutor(Executor):
    """Batches go to the workers of a ``distributed`` scheduler at ``scheduler``.

    The compute is scattered once to every worker (so a per-worker cache, such as a built
    encoder, survives between batches); every batch is one task running
    :func:`process_batch` on a worker, which writes its items and its own ledger.
    """

    name = "dask"

    def __init__(self, scheduler: str | None, timeout: float = 30.0):
        if not scheduler:
            raise FeatpipeError("--executor dask needs --scheduler ADDRESS of a running "
                                "dask.distributed scheduler (e.g. tcp://10.0.0.5:8786)")
        self.scheduler = scheduler
        self.timeout = timeout

    def outcomes(self, stage, compute, chunks, compute_size=None):
        if not chunks:
            return
        try:
            from distributed import Client, as_completed
        except ImportError:
            raise FeatpipeError("--executor dask needs the 'distributed' package "
                                "(pip install 'featpipe[cluster]')") from None
        try:
            client = Client(self.scheduler, timeout=self.timeout, set_as_default=False)
        except (OSError, TimeoutError) as err:
            raise FeatpipeError(f"cannot reach the dask scheduler at {self.scheduler}: "
                                f"{first_line(err)}") from None
        futures = []
        try:
            shared = client.scatter(compute, broadcast=True, hash=False)
            futures = [client.submit(process_batch, stage, shared, chunk, compute_size,
                                     pure=False,
                                     key=f"featpipe-{stage.name}-batch-{i}-{uuid.uuid4().hex}")
                       for i, chunk in enumerate(chunks)]
            for future in as_completed(futures, loop=client.loop):
                try:
                    yield future.result()
                except Exception as err:  # KilledWorker, lost connection: the batch is unknown
                    raise FeatpipeError(
                        f"dask batch of stage {stage.name} failed ({first_line(err)}); items "
                        "already written are kept: re-run the same command to compute the rest"
                    ) from None
        finally:
            if futures:
                client.cancel(futures)
            client.close()


EXECUTORS = ("local", "dask", "slurm")


def make_executor(name: str, jobs: int = 1, scheduler: str | None = None) -> Executor:
    """The executor called ``name`` (``local``, ``dask`` or ``slurm``)."""
    if name == "local":
        return LocalExecutor(jobs)
    if name == "slurm":
        return SlurmExecutor(jobs)
    if name == "dask":
        return DaskExecutor(scheduler)
    raise FeatpipeError(f"--executor must be one of {EXECUTORS}, got {name!r}")



def run_items(
    stage: Stage,
    ids: Sequence[str],
    compute: Compute,
    *,
    jobs: int = 1,
    on_error: str = "fail",
    force: bool = False,
    shard: tuple[int, int] | None = None,
    batch_size: int = 1,
    executor: str | Executor = "local",
    scheduler: str | None = None,
    progress: Callable[[list[str]], None] | None = None,
) -> RunSummary:
    """Compute the missing items of ``stage`` and write them; returns the run's summary.

    ``executor`` is ``local``, ``slurm`` (this array task's shard) or ``dask`` (with
    ``scheduler``), or an :class:`Executor`.  ``on_error='fail'`` stops at the first failed
    item (already written items stay) and raises a :class:`FeatpipeError` naming it;
    ``'skip'`` records failures in the ledger and goes on.  ``progress`` is called with the
    ids of each chunk's items as they end (done or failed).
    """
    if on_error not in ON_ERROR:
        raise FeatpipeError(f"--on-error must be one of {ON_ERROR}, got {on_error!r}")
    if isinstance(executor, str):
        executor = make_executor(executor, jobs=jobs, scheduler=scheduler)
    executor.check_shard(shard)
    todo, summary = plan(stage, ids, force=force, shard=shard)
    chunk = batch_size
    if commits_in_batches(stage.n_items):  # a chunk is a batch: COMMIT_ITEMS at least
        chunk = batch_size * max(1, -(-COMMIT_ITEMS // batch_size))
    chunks = batches(todo, chunk)
    outcomes = executor.outcomes(stage, compute, chunks, batch_size)
    compacted = time.monotonic()
    try:
        try:
            for chunk_outcomes in outcomes:
                if time.monotonic() - compacted > COMPACT_EVERY_S:
                    stage.compact_index()  # status stays O(ledgers) while a long run goes
                    compacted = time.monotonic()
                for item_id, error in chunk_outcomes:
                    if error is None:
                        summary.done += 1
                    else:
                        summary.failed[item_id] = error
                if progress is not None:
                    progress([item_id for item_id, _ in chunk_outcomes])
                if summary.failed and on_error == "fail":
                    item_id, error = next(iter(summary.failed.items()))
                    raise FeatpipeError(f"{error} (stage {stage.name}; {summary.line()}; "
                                        f"{resume_advice(error)})", item=item_id)
        finally:
            outcomes.close()  # the workers stop: what they wrote is counted below
            stage.compact_index()  # writes only what the index lacks
    except WriteError as err:
        raise store_stopped(err, stage, todo, summary.skipped) from None
    return summary


def resume_advice(error: str) -> str:
    """How a run stopped by an item's failure ``error`` goes on: a re-run resumes it, or
    ``--on-error skip``; not for an item whose file is missing
    (:func:`featpipe.manifest.needs_row_fix`): as it is, a re-run fails it again, and the
    fixed manifest is a new stage (the key holds the content of every item's file)."""
    if needs_row_fix(error):
        return ("with the row fixed the command makes a new stage, its key holding every "
                "file's content; --on-error skip computes the other items now")
    return "re-run to resume, or use --on-error skip"


def store_stopped(err: WriteError, stage: Stage, todo: Sequence[str], skipped: int
                  ) -> WriteError:
    """The one error of a run the store stopped (disk full, read-only): what is kept, counted
    from the ledger and the files (workers may have written items not reported yet), of
    the ``todo`` items this run had to compute and the ``skipped`` ones done before it."""
    kept = len(stage.done_ids() & set(todo)) + skipped
    return WriteError(f"{err} (stage {stage.name}: {kept} of {len(todo) + skipped} item(s) "
                      "are done and kept, none is marked failed for this; re-run the same "
                      "command once the store can be written)")
