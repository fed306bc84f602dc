"""Worker processes for the decision core: spawned, bound to their parent, stopped only by it.

aiokafka and the decision core are both CPU-heavy Python; in one process they share one interpreter lock, so
the service and the offline mode hand signing and deciding to worker processes and keep both cores busy.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

__all__ = ["worker_pool"]

_PR_SET_PDEATHSIG = 1


def worker_pool(workers: int, initializer: Callable[..., None], initargs: tuple[Any, ...]) -> ProcessPoolExecutor:
    """A process pool whose workers run ``initializer(*initargs)`` once, ignore SIGINT/SIGTERM and die with
    their parent.

    Processes are spawned, never forked: the parent has threads and an event loop a fork would copy in an
    unusable state. A Ctrl-C or a SIGTERM sent to the whole process group must not kill a worker under a
    batch the parent is finishing; the parent stops the pool. A parent killed outright (kill -9) takes the
    workers with it (Linux: PR_SET_PDEATHSIG), so none goes on writing after a successor started. The death
    signal follows the thread that spawned the worker: submit the first task from a long-lived thread.
    """
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_start,
        initargs=(os.getpid(), initializer, initargs),
    )


def _start(parent: int, initializer: Callable[..., None], initargs: tuple[Any, ...]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the death signal was armed
            os._exit(1)
    initializer(*initargs)
