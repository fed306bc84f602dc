"""Staged table rows: a batch's rows of a table wait in ``table-staged`` until that table's merge turn (see the
``segment`` docstring), as one packed array per (table, batch); lookups read them from the sorted copy that
``Cached.staged`` keeps."""

from __future__ import annotations

from typing import Any

import numpy as np

from .cached import Cached
from .store import Store
from .table import rows_in

__all__ = ["Staging"]


def _staged_key(table: int, first_seq: int) -> bytes:
    """(table, first entry of the batch) big-endian: a table's staged blobs are one key range."""
    return table.to_bytes(2, "big") + int(first_seq).to_bytes(8, "big")


class Staging:
    """The staged rows of one store, kept in step with their copy in memory."""

    def __init__(self, store: Store, cached: Cached) -> None:
        self.store = store
        self.cached = cached

    def stage(self, txn: Any, table: int, first_seq: int, keys: np.ndarray, values: np.ndarray) -> None:
        """Stage a batch's rows of one table (keys ascending)."""
        if not len(keys):
            return
        staged = self.cached.staged(txn)  # before the put: a reload from the database must not see this batch
        txn.put(_staged_key(table, first_seq), self.store.tables[table].join_rows(keys, values), db=self.store.staged)
        staged[table] = staged[table].merged(keys, values)
        self.cached.staged_changed()

    def unstage(self, txn: Any, table: int) -> None:
        """Delete every staged blob of a table (its rows' keys share the table's prefix)."""
        prefix = table.to_bytes(2, "big")
        with txn.cursor(self.store.staged) as cursor:
            present = cursor.set_range(prefix)
            while present and cursor.key()[:2] == prefix:
                present = cursor.delete()

    def drop(self, txn: Any, table: int, doomed_keys: np.ndarray, doomed_values: np.ndarray) -> None:
        """Remove the staged rows of a table equal to any of the doomed (key, value) rows."""
        staged = self.cached.staged(txn)
        kept = ~rows_in(staged[table].keys, staged[table].values, doomed_keys, doomed_values)
        if kept.all():
            return
        staged[table] = staged[table].kept(kept)
        self.cached.staged_changed()
        # The table's blobs are rewritten as one: removals are rare next to batches staged.
        self.unstage(txn, table)
        if kept.any():
            rows = staged[table]
            txn.put(
                _staged_key(table, 0), self.store.tables[table].join_rows(rows.keys, rows.values), db=self.store.staged
            )

    def rows_present(self, txn: Any, table: int, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rows among these that ``table`` holds, merged or staged."""
        if not len(keys):
            return keys, values
        unique = np.unique(keys)
        owners, found = self.store.tables[table].read(txn, unique)
        present = rows_in(keys, values, unique[owners], found)
        staged = self.cached.staged(txn)[table]
        if len(staged):
            present |= rows_in(keys, values, staged.keys, staged.values)
        return keys[present], values[present]
