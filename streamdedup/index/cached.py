"""What the index holds in memory of its LMDB state, and the one rule that keeps it true.

Three copies are kept: the staged rows of every table (sorted, so that lookups need not read ``table-staged``), a
writer's mirror of an entry-valued index's merged tables with the records it read lately (``mirror.py``), and a
writer's key filter (``key_filter.py``). Each names the state it was made from by a counter in ``meta`` that
every change to what it copies moves, in the same write transaction:

- the staged rows by ``staged_generation``, which a batch moves when it stages, merges or drops staged rows;
- the mirror and the key filter by ``keyed_writes``, which every write that adds table keys moves: the merged
  tables of an entry-valued index change only in such a write (a merge, or a sweep inside one), and the key
  filter only ever gains keys (a removed row's bit stays set, which only sends a key on to LMDB).

The rule: a copy is used only while its counter in the transaction's view equals the one it names, and a copy
that does not match is read again from LMDB (the staged rows, the key filter) or dropped (the mirror). A write
transaction works on its own copies, started from the current ones, and publishes them only once it commits, so
a batch that aborts leaves nothing of itself behind; the key filter is the exception, as bits a failed batch set
only send keys on to LMDB. A batch of another process moves the counters and so makes the copies stale.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from .key_filter import KeyFilter
from .keys import table_rows
from .mirror import TableMirror
from .sorted_rows import SortedRows
from .store import (
    META_COUNT,
    META_KEY_FILTER_TOKEN,
    META_KEYED_WRITES,
    META_STAGED_GENERATION,
    Store,
    id_hashes,
    keys_of_ids,
)

__all__ = ["KEY_FILTER_FILE", "Cached"]

log = logging.getLogger(__name__)

KEY_FILTER_FILE = "key-filter.npz"
_FILTER_BUILD_ROWS = 65_536
# Table keys set at a time when a filter is filled from the tables: 8 MiB of keys.
_FILTER_BUILD_KEYS = 1 << 20


class _Transaction(threading.local):
    """The calling thread's write transaction, as the copies see it."""

    def __init__(self) -> None:
        self.reset(writing=False)

    def reset(self, *, writing: bool) -> None:
        self.writing = writing
        # The staged rows as this transaction changes them (None: not read yet), and whether it changed them.
        self.staged: list[SortedRows] | None = None
        self.changed = False
        self.generation: int | None = None
        # (filter, keyed-writes count before) for each batch whose keys went into that filter in this transaction.
        self.filtered: list[tuple[KeyFilter, int]] = []
        # The merged tables' copy as this transaction changes them.
        self.mirror: TableMirror | None = None
        # Entries this transaction added (keys, times, payloads) and removed, for the cache of times and payloads.
        self.added: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.removed: list[np.ndarray] = []


class Cached:
    """The copies of one open index, per the module's rule. Per thread, like LMDB's transactions."""

    def __init__(self, store: Store, path: Path, *, readonly: bool, mirror_bytes: int) -> None:
        self.store = store
        self.path = path
        self.readonly = readonly
        self.mirror_bytes = mirror_bytes
        self._txn = _Transaction()
        self._staged: tuple[int, list[SortedRows]] | None = None
        self.mirror: TableMirror | None = None
        self.key_filter: KeyFilter | None = None
        self._key_filter_pointless = False  # the index outgrew what a filter can serve: none is kept

    # ----------------------------------------------------------------- write transactions

    @property
    def writing(self) -> bool:
        return self._txn.writing

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Around one write transaction: copies it changes stay its own until :meth:`publish`."""
        self._txn.reset(writing=True)
        try:
            yield
        finally:
            self._txn.reset(writing=False)

    def seal(self, txn: Any) -> None:
        """Just before the commit: move the staged generation if this transaction changed the staged rows (so
        that other processes reload them)."""
        state = self._txn
        if not state.changed:
            return
        state.generation = self.store.counter(txn, META_STAGED_GENERATION) + 1
        self.store.put_counter(txn, META_STAGED_GENERATION, state.generation)

    def publish(self) -> None:
        """Once the transaction committed: its copies become the current ones."""
        state = self._txn
        if state.generation is not None and state.staged is not None:
            self._staged = (state.generation, state.staged)
        for key_filter, keyed_before in state.filtered:
            if key_filter.covers == keyed_before:
                key_filter.covers = keyed_before + 1
        if state.mirror is not None:
            self.mirror = state.mirror
            # New entries are the likeliest candidates of the next batches: held now, they cost no LMDB read.
            # Removals come after, as they may take entries this very transaction added.
            for entries, times, payloads in state.added:
                state.mirror.records.hold(entries, times, payloads)
            for entries in state.removed:
                state.mirror.records.forget(entries)

    # ----------------------------------------------------------------- staged rows

    def staged(self, txn: Any) -> list[SortedRows]:
        """Per table, the staged rows as ``txn`` sees them; a write transaction may change its list in place (then
        it calls :meth:`staged_changed`)."""
        state = self._txn
        if state.staged is not None:
            return state.staged
        generation = self.store.counter(txn, META_STAGED_GENERATION)
        cached = self._staged
        if cached is None or cached[0] != generation:
            cached = self._staged = (generation, self._load_staged(txn))
        if not state.writing:
            return cached[1]
        state.staged = list(cached[1])
        return state.staged

    def staged_changed(self) -> None:
        self._txn.changed = True

    def _load_staged(self, txn: Any) -> list[SortedRows]:
        tables = self.store.tables
        blobs: list[list[bytes]] = [[] for _ in tables]
        if self.store.staged is not None:
            with txn.cursor(self.store.staged) as cursor:
                for key, blob in cursor:
                    blobs[int.from_bytes(key[:2], "big")].append(blob)
        staged = []
        for table, parts in enumerate(blobs):
            keys, values = tables[table].split_rows(b"".join(parts))
            order = np.argsort(keys, kind="stable")
            staged.append(SortedRows(keys[order], values[order], tables[table].key_bits))
        return staged

    # ----------------------------------------------------------------- merged tables in memory

    def table_mirror(self, txn: Any) -> TableMirror | None:
        """The merged tables' copy in memory as ``txn`` sees them (``mirror.py``), or None: only an entry-valued
        index's writer keeps one. A write transaction starts from the copy made at its keyed-batch count, or from
        an empty one, and merges fill it in table by table."""
        if not self.store.fmt.entry_valued or self.readonly or not self.mirror_bytes:
            return None
        state = self._txn
        if state.writing and state.mirror is not None:
            return state.mirror
        keyed = self.store.counter(txn, META_KEYED_WRITES)
        current = self.mirror
        if current is None or current.covers != keyed:
            if not state.writing:
                return None
            current = TableMirror.empty(
                keyed,
                len(self.store.tables),
                self.mirror_bytes,
                self.store.fmt.payload_bytes,
                max(table.key_bits for table in self.store.tables),
            )
            # A table nothing was merged into yet is copied now (empty): its lookups then skip LMDB.
            for table in range(len(self.store.tables)):
                stored_table = self.store.entry_table(table)
                if not stored_table.row_count(txn):
                    current = current.with_table(table, SortedRows(*stored_table.rows(txn), stored_table.key_bits))
        if state.writing:
            state.mirror = current
        return current

    def read_mirror(self, txn: Any) -> TableMirror | None:
        """The mirror for reading records' times and payloads: a write transaction's view may hold what it then
        aborts, so only read transactions go through the cached ones."""
        return None if self._txn.writing else self.table_mirror(txn)

    def mirror_inserted(self, txn: Any, table: int, keys: np.ndarray, values: np.ndarray) -> None:
        """Bring a table's copy in memory up to rows just merged into it (keys ascending; every value above the
        stored ones, as entry keys only grow); with no copy yet, make one from the whole table if it fits."""
        mirror = self.table_mirror(txn)
        if mirror is None:
            return
        stored_table = self.store.entry_table(table)
        current = mirror.tables[table]
        if current is not None:
            rows = current.merged(keys, values)
        elif mirror.fits(stored_table.row_count(txn)):
            rows = SortedRows(*stored_table.rows(txn), stored_table.key_bits)
        else:
            return
        self._txn.mirror = mirror.with_table(table, rows)

    def mirror_replaced(self, txn: Any, table: int, rows: SortedRows) -> None:
        """A table's copy after the table was rewritten with ``rows``."""
        mirror = self.table_mirror(txn)
        if mirror is not None:
            self._txn.mirror = mirror.with_table(table, rows)

    def entries_added(self, entries: np.ndarray, times: np.ndarray, payloads: np.ndarray) -> None:
        """Entries the write transaction stored: the cache of times and payloads holds them once it commits."""
        self._txn.added.append((entries, times, payloads))

    def entries_removed(self, txn: Any, entries: np.ndarray) -> None:
        mirror = self.table_mirror(txn)
        if mirror is not None:
            mirror.records.forget(entries)
            self._txn.removed.append(entries)

    # ----------------------------------------------------------------- key filter

    def keys_added(self, txn: Any, keys: np.ndarray, id_keys: list[bytes]) -> int:
        """Count a write that adds entries (their table keys (tables, n) and the keys of their ids), which a saved
        key filter then lacks, and mark them in the writer's filter; returns the count of such writes before it."""
        self.table_mirror(txn)  # taken up at the count before this write moves it
        keyed = self.store.counter(txn, META_KEYED_WRITES)
        self.store.put_counter(txn, META_KEYED_WRITES, keyed + 1)
        txn.delete(META_KEY_FILTER_TOKEN, db=self.store.meta)
        if self.key_filter is not None:
            # Bits set now stay set if the write aborts: harmless, a set bit only sends a key on to LMDB.
            self.key_filter.add(keys, id_hashes(id_keys))
            self.key_filter.prepare(self.store.counter(txn, META_COUNT))
            self._txn.filtered.append((self.key_filter, keyed))
        if self._txn.mirror is not None:
            self._txn.mirror = self._txn.mirror.advanced(keyed + 1)
        return keyed

    def trusted_key_filter(self, txn: Any) -> KeyFilter | None:
        """The key filter, if it holds every key ``txn`` sees; rebuilt when it does not and ``txn`` is a read
        transaction (doubled when it holds them all but has outgrown its capacity). A writer's own lookups
        repeat, so only writers keep one."""
        if self.readonly or self._key_filter_pointless:
            return None
        keyed, entries = self.store.counter(txn, META_KEYED_WRITES), self.store.counter(txn, META_COUNT)
        current = self.key_filter
        if current is not None and not current.useful(entries):
            # Every key has a bit set by now (short keys, or more entries than the largest bitmaps serve).
            self.key_filter, self._key_filter_pointless = None, True
            return None
        if current is not None and current.covers == keyed:
            if self._txn.writing or not current.outgrown(entries):
                return current
            # Outgrown: doubled, it serves on without reading every stored entry again.
            while current is not None and current.outgrown(entries):
                current = current.doubled()
            if current is not None:
                self.key_filter = current
                return current
        if self._txn.writing:
            # A write transaction's view may hold changes it then aborts: a filter built from it could miss
            # rows that stay committed. Look up without one.
            return None
        key_bits = self.store.fmt.plan.key_bits
        token = txn.get(META_KEY_FILTER_TOKEN, db=self.store.meta)
        saved = None if token is None else KeyFilter.load(self.path / KEY_FILTER_FILE, token, key_bits, keyed)
        if saved is not None and saved.useful(entries) and not saved.outgrown(entries):
            self.key_filter = saved
            return saved
        self.key_filter = KeyFilter(key_bits, 2 * entries, keyed)
        if not self.key_filter.useful(entries):
            self.key_filter, self._key_filter_pointless = None, True
            return None
        self.fill_key_filter(txn, self.key_filter)
        return self.key_filter

    def fill_key_filter(self, txn: Any, key_filter: KeyFilter) -> None:
        """Set the bits of every stored entry's id and keys. On an entry-valued index, of every key the tables
        hold rows of instead: a removed entry's rows stay until its table's sweep, and count where a key's rows
        are counted (``dedup.key_capacity``, the candidates a lookup ranks), so a filter without their keys would
        have lookups find other rows than one kept since those rows were added."""
        fmt = self.store.fmt
        tables = len(self.store.tables)
        with txn.cursor(self.store.entries) as cursor:
            records = cursor.iternext(keys=False, values=True)
            while chunk := list(islice(records, _FILTER_BUILD_ROWS)):
                head, ids = fmt.records.decode(chunk)
                if fmt.entry_valued:
                    keys = np.zeros((tables, 0), dtype=np.uint64)
                else:
                    keys, _, _ = table_rows(fmt.plan, head["fp"].reshape(len(head), fmt.words).astype(np.uint64))
                key_filter.add(keys, id_hashes(keys_of_ids(ids.encoded())))
        if fmt.entry_valued:
            staged = self.staged(txn)
            for table in range(tables):
                for keys in self.store.entry_table(table).key_chunks(txn, _FILTER_BUILD_KEYS):
                    key_filter.add_table(table, keys)
                key_filter.add_table(table, staged[table].keys)

    def save_key_filter(self) -> None:
        """Save a trusted key filter for the next writer to open this index, so it need not rebuild it."""
        key_filter = self.key_filter
        if self.readonly or key_filter is None:
            return
        token = os.urandom(16)
        try:
            key_filter.save(self.path / KEY_FILTER_FILE, token)
            with self.store.env.begin(write=True) as txn:
                # Only for the state it covers: a batch committed meanwhile by another writer leaves it unnamed.
                if self.store.counter(txn, META_KEYED_WRITES) == key_filter.covers:
                    txn.put(META_KEY_FILTER_TOKEN, token, db=self.store.meta)
        except (OSError, lmdb.Error) as exc:
            log.warning("key filter not saved (the next start rebuilds it): %s", exc)
