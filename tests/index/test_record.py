from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdedup.features import FeatureBatch, mix64
from streamdedup.index import SegmentIndex
from streamdedup.index.record import (
    BYTES_PAYLOAD,
    FIXED_RECORDS,
    NO_TOPIC,
    PACKED_RECORDS,
    SKETCH_PAYLOAD,
    RecordLayout,
)
from streamdedup.minhash import EMPTY_SLOT, SKETCH_BITS, BottomK


def head_dtype(words: int, payload_bytes: int) -> np.dtype:
    return np.dtype(
        [
            ("fp", "<u8", (words,)),
            ("time", "<f8"),
            ("topic", "<u4"),
            ("partition", "<i4"),
            ("offset", "<i8"),
            ("payload", "u1", (payload_bytes,)),
        ]
    )


def random_heads(rng: np.random.Generator, n: int, words: int, payload: np.ndarray) -> np.ndarray:
    heads = np.zeros(n, dtype=head_dtype(words, payload.shape[1]))
    lanes = rng.integers(0, 2**32, size=(n, 2 * words), dtype=np.uint64).astype(np.uint32)
    # Most lanes zero, some rows all zero, some none.
    lanes[rng.random(lanes.shape) < rng.random((n, 1))] = 0
    heads["fp"] = lanes.view("<u8")
    heads["time"] = rng.normal(1.7e9, 1e6, n)
    heads["topic"] = np.where(rng.random(n) < 0.5, NO_TOPIC, rng.integers(0, 5, n))
    with_origin = heads["topic"] != NO_TOPIC
    heads["partition"][with_origin] = rng.integers(0, 2**31, int(with_origin.sum()))
    heads["offset"][with_origin] = rng.integers(0, 2**62, int(with_origin.sum()))
    heads["payload"] = payload
    return heads


def sketches_of(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """Bottom-k sketches of random sets of 0 to 4k members: padded, full, and empty ones."""
    sizes = rng.integers(0, 4 * k, n)
    sizes[: min(n, 2)] = 0
    documents = np.repeat(np.arange(n), sizes)
    hashes = rng.integers(0, 2**63, len(documents), dtype=np.uint64)
    # Identities ascend within each document, as the extractor gives them.
    order = np.lexsort((mix64(hashes), documents))
    hashes = hashes[order]
    identities = mix64(hashes) >> np.uint64(20)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    batch = FeatureBatch(hashes, np.ones(len(hashes)), offsets, hashes[:, None], identities)
    return BottomK(k).sketch(batch)


ids_strategy = st.lists(st.text(min_size=1, max_size=30), min_size=0, max_size=40)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), words=st.sampled_from([1, 2, 16]), ids=ids_strategy)
@pytest.mark.parametrize("layout", [FIXED_RECORDS, PACKED_RECORDS])
def test_records_of_bytes_payloads_read_back_exactly(layout: str, seed: int, words: int, ids: list[str]) -> None:
    rng = np.random.default_rng(seed)
    payload = rng.integers(0, 256, size=(len(ids), 5), dtype=np.uint8)
    heads = random_heads(rng, len(ids), words, payload)
    records = RecordLayout(heads.dtype, layout, BYTES_PAYLOAD)
    encoded = records.encode(heads, [x.encode() for x in ids])
    assert all(record.endswith(x.encode()) for record, x in zip(encoded, ids, strict=True))
    decoded, decoded_ids = records.decode(encoded)
    assert decoded.tobytes() == heads.tobytes()
    assert list(decoded_ids) == ids
    assert decoded_ids.encoded() == [x.encode() for x in ids]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), k=st.sampled_from([8, 64, 1024]), n=st.integers(0, 30))
def test_packed_sketches_keep_their_significant_bits_and_every_estimate(seed: int, k: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    sketches = sketches_of(rng, n, k)
    heads = random_heads(rng, n, 16, sketches.view(np.uint8))
    ids = [f"doc-{i}" for i in range(n)]
    records = RecordLayout(heads.dtype, PACKED_RECORDS, SKETCH_PAYLOAD)
    encoded = records.encode(heads, [x.encode() for x in ids])
    decoded, decoded_ids = records.decode(encoded)
    assert list(decoded_ids) == ids
    for name in ("fp", "time", "topic", "partition", "offset"):
        assert decoded[name].tobytes() == heads[name].tobytes()
    stored = decoded["payload"].view(np.uint32)
    real = sketches != EMPTY_SLOT
    assert ((stored == EMPTY_SLOT) == ~real).all()
    # Each value keeps the 24 highest bits from its sketch's largest value on (the largest there can be for a
    # padded sketch): those comparisons read.
    largest = np.where(real[:, -1], sketches[:, -1], 2**SKETCH_BITS - 1)
    cleared = np.array([max(0, int(x).bit_length() - 24) for x in largest], dtype=np.uint32)
    assert (stored[real] == (sketches >> cleared[:, None] << cleared[:, None])[real]).all()
    # Against any query, an estimate from the stored sketch is the one from the sketch it was made from.
    if n:
        queries = sketches_of(rng, n, k)
        queries[::2] = sketches[::2]
        sketcher = BottomK(k)
        assert (sketcher.jaccard(queries, stored) == sketcher.jaccard(queries, sketches)).all()
        assert (sketcher.jaccard(stored, queries) == sketcher.jaccard(sketches, queries)).all()
    # A record is 16 bytes ahead of its non-zero fingerprint lanes, origin, 3-byte sketch values and id.
    lanes = (heads["fp"].view(np.uint32) != 0).sum(axis=1)
    origin = (heads["topic"] != NO_TOPIC) * 16
    sizes = [len(record) for record in encoded]
    assert sizes == (16 + origin + 4 * lanes + 3 * real.sum(axis=1) + [len(x) for x in ids]).tolist()
    # Stored again as read (an undone removal), a record is the same bytes.
    assert records.encode(decoded, [x.encode() for x in ids]) == encoded
    # Read without payloads, the rest is the same.
    bare, bare_ids = records.decode(encoded, payloads=False)
    assert list(bare_ids) == ids
    for name in ("fp", "time", "topic", "partition", "offset"):
        assert bare[name].tobytes() == heads[name].tobytes()


def test_a_sketch_payload_must_be_sketch_values_and_then_pads() -> None:
    records = RecordLayout(head_dtype(1, 8), PACKED_RECORDS, SKETCH_PAYLOAD)
    for values in ([2**SKETCH_BITS, EMPTY_SLOT], [int(EMPTY_SLOT), 5]):
        heads = np.zeros(1, dtype=head_dtype(1, 8))
        heads["payload"] = np.array([values], dtype=np.uint32).view(np.uint8)
        with pytest.raises(ValueError, match="sketch payloads hold 31-bit values, ascending, and then pads only"):
            records.encode(heads, [b"x"])
    with pytest.raises(ValueError, match="whole uint32 values"):
        RecordLayout(head_dtype(1, 6), PACKED_RECORDS, SKETCH_PAYLOAD)
    with pytest.raises(ValueError, match="unknown record layout"):
        RecordLayout(head_dtype(1, 8), "zipped", SKETCH_PAYLOAD)


def test_an_unknown_payload_kind_is_refused_and_records_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="payload_kind must be one of"):
        SegmentIndex(tmp_path / "idx", 64, 3, payload_bytes=8, payload_kind="zipped")
    with SegmentIndex(tmp_path / "idx", 64, 3, payload_bytes=8) as index:
        assert (index.stats()["payload_kind"], index.stats()["record_layout"]) == (BYTES_PAYLOAD, PACKED_RECORDS)
