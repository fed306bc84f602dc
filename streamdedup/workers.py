"""Worker processes for the decision core: spawned, bound to their parent, stopped only by it.

aiokafka and the decision core are both CPU-heavy Python; in one process they share one interpreter lock, so
the service and the offline mode hand signing and deciding to worker processes and keep both cores busy.

Not ``concurrent.futures.ProcessPoolExecutor``: a worker killed while it writes a result leaves the pool's
reader waiting forever for the rest of the message (the parent holds the pipe's other end too), and a service
must survive that. Here only the worker holds its end of each pipe, so its death reads as end-of-file.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import queue
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any, TypeVar

from .garbage import BATCH_THRESHOLDS

__all__ = ["WorkerDied", "WorkerProcess", "served_together"]

_PR_SET_PDEATHSIG = 1
_STOP_TIMEOUT_SECONDS = 30.0


_Function = TypeVar("_Function", bound=Callable[..., Any])


def served_together(
    together: Callable[[Any, list[tuple[Any, ...]]], list[Any]], most: int
) -> Callable[[_Function], _Function]:
    """Mark a worker function whose calls, when several of them wait in a worker's pipe one after another, are
    served by one call of ``together(state, [args of each call])`` (up to ``most`` calls), which returns each
    call's result in order: work with a cost per call that can be shared, such as a transaction. ``together``
    must do all or nothing: if it raises, the calls are served one by one instead, each with its own result or
    error, as if never grouped."""
    if most < 2:
        raise ValueError(f"most must be at least 2, got {most}")

    def mark(function: _Function) -> _Function:
        function.served_together = (together, most)  # type: ignore[attr-defined]
        return function

    return mark


class WorkerDied(RuntimeError):
    """The worker process is gone (killed, out of memory, or stopped); the call it was serving is lost."""


class WorkerProcess:
    """One spawned process holding ``initializer(*initargs)`` as its state, serving calls in submission order.

    ``submit(function, *args)`` queues ``function(state, *args)`` for the worker and returns a future of its
    result or exception (the initializer's, for the first call, when it failed); the future fails with
    :class:`WorkerDied` when the worker is gone. Calls wait in the worker's pipe, so it starts the next one
    the moment it finishes one: a sender thread writes them (a call larger than the pipe blocks until the
    worker reads it) and a receiver thread resolves the futures in order. ``call`` submits and waits. Calls of a
    function marked :func:`served_together` that wait in the pipe one after another are served as one.

    The worker ignores SIGINT and SIGTERM (a Ctrl-C or a SIGTERM to the whole process group must not kill it
    under a batch the parent is finishing), and a parent killed outright takes it along (Linux:
    PR_SET_PDEATHSIG), so none goes on writing after a successor started. The death signal follows the thread
    that spawned the worker: create it from a long-lived thread. ``niceness`` is added to the worker's
    (``os.nice``): a helper with work queued ahead can yield the cores to the process it feeds. ``stop`` is
    idempotent: the worker finishes the calls already submitted and exits. ``on_death`` is called, from a
    helper thread, the moment the worker ends without being stopped (killed, out of memory, failed to start),
    so that its owner can replace it before another call finds it gone.
    """

    def __init__(
        self,
        initializer: Callable[..., Any],
        initargs: tuple[Any, ...] = (),
        *,
        name: str,
        niceness: int = 0,
        on_death: Callable[[], None] | None = None,
    ) -> None:
        context = multiprocessing.get_context("spawn")
        calls_reader, self._calls = context.Pipe(duplex=False)
        self._results, results_writer = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_serve,
            args=(os.getpid(), calls_reader, results_writer, initializer, initargs, niceness),
            name=name,
            daemon=True,
        )
        self._process.start()
        calls_reader.close()
        results_writer.close()
        self._lock = threading.Lock()
        self._pending: deque[Future[Any]] = deque()
        self._outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._stopped = False
        self._gone = False
        self._on_death = on_death
        self._startup_error: BaseException | None = None
        self._sender = threading.Thread(target=self._send_calls, name=f"{name}-sender", daemon=True)
        self._receiver = threading.Thread(target=self._receive_replies, name=f"{name}-receiver", daemon=True)
        self._sender.start()
        self._receiver.start()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def alive(self) -> bool:
        """False once the worker has ended (stopped, killed, or failed to start)."""
        return not (self._gone or self._stopped)

    def submit(self, function: Callable[..., Any], *args: Any) -> Future[Any]:
        # Pickled here, so an argument that cannot be pickled fails this call alone, in the caller.
        message = bytes(ForkingPickler.dumps((function, args)))
        future: Future[Any] = Future()
        with self._lock:
            if self._stopped:
                raise WorkerDied(f"worker process {self._process.name} is stopped")
            if self._gone:
                future.set_exception(self._death())
                return future
            self._pending.append(future)
            self._outbox.put(message)
        return future

    def call(self, function: Callable[..., Any], *args: Any) -> Any:
        return self.submit(function, *args).result()

    def _send_calls(self) -> None:
        while (message := self._outbox.get()) is not None:
            try:
                self._calls.send_bytes(message)
            except OSError:
                break  # the worker is gone: the receiver fails every pending call
        self._calls.close()

    def _receive_replies(self) -> None:
        startup_error: BaseException | None = None
        try:
            started, value = self._results.recv()
            if not started:
                startup_error = value
            while started:
                succeeded, value = self._results.recv()
                with self._lock:
                    future = self._pending.popleft()
                if succeeded:
                    future.set_result(value)
                else:
                    future.set_exception(value)
        except (EOFError, OSError):
            pass  # the worker exited or was killed
        with self._lock:
            self._gone = True
            self._startup_error = startup_error
            pending, self._pending = self._pending, deque()
            for future in pending:
                future.set_exception(self._death())
            stopped = self._stopped
        if not stopped and self._on_death is not None:
            self._on_death()

    def _death(self) -> BaseException:
        """What a call fails with once the worker is gone: the initializer's error, once, then WorkerDied."""
        error, self._startup_error = self._startup_error, None
        return error or WorkerDied(f"worker process {self._process.name} (pid {self._process.pid}) died")

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self._outbox.put(None)  # the sender closes the calls pipe after what is queued
        self._process.join(_STOP_TIMEOUT_SECONDS)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._sender.join()
        self._receiver.join()
        self._results.close()


def _serve(
    parent: int,
    calls: Connection,
    results: Connection,
    initializer: Callable[..., Any],
    initargs: tuple[Any, ...],
    niceness: int,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the death signal was armed
            os._exit(1)
    if niceness:
        os.nice(niceness)
    gc.set_threshold(*BATCH_THRESHOLDS)  # the process lives to serve batches
    try:
        state = initializer(*initargs)
    except BaseException as exc:
        _send(results, False, exc)
        return
    _send(results, True, None)
    reader = _CallReader(calls)
    waiting: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
    more = True
    while waiting or more:
        messages, more = reader.take(wait=not waiting)
        waiting.extend(ForkingPickler.loads(message) for message in messages)
        if not waiting:
            continue
        function, args = waiting.popleft()
        grouping = getattr(function, "served_together", None)
        run = [args]
        while grouping is not None and waiting and waiting[0][0] is function and len(run) < grouping[1]:
            run.append(waiting.popleft()[1])
        for reply in _serve_run(state, function, run, None if grouping is None else grouping[0]):
            _send(results, *reply)


class _CallReader:
    """Reads a worker's calls in a thread of its own as they come, so that the calls sent while one is served are
    there when it ends (read only then, the next one may still be on its way) and a run of them can be served
    together."""

    def __init__(self, calls: Connection) -> None:
        self._calls = calls
        self._ready: deque[bytes] = deque()
        self._receiving = False
        self._closed = False
        self._changed = threading.Condition()
        threading.Thread(target=self._read, name="calls-reader", daemon=True).start()

    def take(self, *, wait: bool) -> tuple[list[bytes], bool]:
        """The calls read so far and the one being received, if any (with ``wait``, at least one unless the
        pipe is closed); and whether more can come."""
        with self._changed:
            self._changed.wait_for(lambda: not self._receiving and (self._ready or self._closed or not wait))
            ready = list(self._ready)
            self._ready.clear()
            return ready, not self._closed

    def _read(self) -> None:
        calls = self._calls
        try:
            while calls.poll(None):
                with self._changed:
                    self._receiving = True
                message = calls.recv_bytes()
                with self._changed:
                    self._ready.append(message)
                    self._receiving = False
                    self._changed.notify()
        except (EOFError, OSError):
            pass  # the parent closed the pipe (stop) or is gone
        finally:
            with self._changed:
                self._closed, self._receiving = True, False
                self._changed.notify()


def _serve_run(
    state: Any, function: Callable[..., Any], run: list[tuple[Any, ...]], together: Callable[..., list[Any]] | None
) -> list[tuple[bool, Any]]:
    """(succeeded, result or error) of each call of ``function`` in ``run``: one call of ``together`` for all of
    them when there is one, else (or when it fails) one call each."""
    if together is not None and len(run) > 1:
        try:
            return [(True, value) for value in together(state, run)]
        except BaseException:
            pass  # served one by one below: each call gets its own result or error
    replies = []
    for args in run:
        try:
            replies.append((True, function(state, *args)))
        except BaseException as exc:
            replies.append((False, exc))
    return replies


def _send(results: Connection, succeeded: bool, value: Any) -> None:
    try:
        results.send((succeeded, value))
    except Exception as exc:
        # Whatever cannot be pickled (an exotic exception) still reaches the caller as text.
        results.send((False, RuntimeError(f"{value!r} (could not be sent from the worker: {exc})")))
