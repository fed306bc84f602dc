"""Worker processes for the decision core: spawned, bound to their parent, stopped only by it.

aiokafka and the decision core are both CPU-heavy Python; in one process they share one interpreter lock, so
the service and the offline mode hand signing and deciding to worker processes and keep both cores busy.

Not ``concurrent.futures.ProcessPoolExecutor``: a worker killed while it writes a result leaves the pool's
reader waiting forever for the rest of the message (the parent holds the pipe's other end too), and a service
must survive that. Here only the worker holds its end of each pipe, so its death reads as end-of-file.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["WorkerDied", "WorkerProcess"]

_PR_SET_PDEATHSIG = 1
_STOP_TIMEOUT_SECONDS = 30.0


class WorkerDied(RuntimeError):
    """The worker process is gone (killed, out of memory, or stopped); the call it was serving is lost."""


class WorkerProcess:
    """One spawned process holding ``initializer(*initargs)`` as its state, serving calls one at a time.

    ``call(function, *args)`` runs ``function(state, *args)`` in the worker and returns its result or raises
    its exception (the initializer's, on the first call, when it failed); :class:`WorkerDied` when the
    worker is gone. Blocking: asyncio callers run it in a thread. The worker ignores SIGINT and SIGTERM (a
    Ctrl-C or a SIGTERM to the whole process group must not kill it under a batch the parent is finishing),
    and a parent killed outright takes it along (Linux: PR_SET_PDEATHSIG), so none goes on writing after a
    successor started. The death signal follows the thread that spawned the worker: create it from a
    long-lived thread. ``stop`` is idempotent: the worker finishes its call and exits.
    """

    def __init__(self, initializer: Callable[..., Any], initargs: tuple[Any, ...] = (), *, name: str) -> None:
        context = multiprocessing.get_context("spawn")
        calls_reader, self._calls = context.Pipe(duplex=False)
        self._results, results_writer = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_serve,
            args=(os.getpid(), calls_reader, results_writer, initializer, initargs),
            name=name,
            daemon=True,
        )
        self._process.start()
        calls_reader.close()
        results_writer.close()
        self._lock = threading.Lock()
        self._started = False
        self._stopped = False

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def call(self, function: Callable[..., Any], *args: Any) -> Any:
        with self._lock:
            if self._stopped:
                raise WorkerDied(f"worker process {self._process.name} is stopped")
            try:
                if not self._started:
                    self._started = True
                    self._reply()
                self._calls.send((function, args))
                return self._reply()
            except (EOFError, OSError) as exc:
                raise WorkerDied(f"worker process {self._process.name} (pid {self._process.pid}) died") from exc

    def _reply(self) -> Any:
        succeeded, value = self._results.recv()
        if not succeeded:
            raise value
        return value

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self._calls.close()
        self._process.join(_STOP_TIMEOUT_SECONDS)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._results.close()


def _serve(
    parent: int,
    calls: Connection,
    results: Connection,
    initializer: Callable[..., Any],
    initargs: tuple[Any, ...],
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the death signal was armed
            os._exit(1)
    try:
        state = initializer(*initargs)
    except BaseException as exc:
        _send(results, False, exc)
        return
    _send(results, True, None)
    while True:
        try:
            function, args = calls.recv()
        except EOFError:
            return
        try:
            reply = (True, function(state, *args))
        except BaseException as exc:
            reply = (False, exc)
        _send(results, *reply)


def _send(results: Connection, succeeded: bool, value: Any) -> None:
    try:
        results.send((succeeded, value))
    except Exception as exc:
        # Whatever cannot be pickled (an exotic exception) still reaches the caller as text.
        results.send((False, RuntimeError(f"{value!r} (could not be sent from the worker: {exc})")))
