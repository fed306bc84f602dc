"""Read transactions of an index's LMDB environment, which another process may have grown since it was opened."""

from __future__ import annotations

from typing import Any

import lmdb

__all__ = ["begin_read"]


def begin_read(env: Any, *, buffers: bool = False) -> Any:
    """A read transaction of ``env`` (with ``buffers``, its values are views into the map, valid until it ends);
    a map that a writer grew since this process opened it is adopted first."""
    try:
        return env.begin(write=False, buffers=buffers)
    except lmdb.MapResizedError:
        env.set_mapsize(0)
        return env.begin(write=False, buffers=buffers)
