from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdedup.cli import main
from streamdedup.features import FeatureBatch, FeatureExtractor, route_of
from streamdedup.fingerprint import Fingerprinter, fingerprint_hex, simhash_from_bits, simhash_from_features
from streamdedup.normalize import CodePointBatch, Normalizer
from streamdedup.settings import FeatureSettings

# Classic Charikar SimHash over word tokens: every feature votes on every bit (the default is segmented).
CLASSIC = {"width": 64, "segments": 1, "segment_sample": 0, "features": FeatureSettings()}


def classic(**options: object) -> Fingerprinter:
    return Fingerprinter(**{**CLASSIC, **options})


def rows(*lines: str) -> np.ndarray:
    return np.array([[int(bit) for bit in line.split()] for line in lines], dtype=np.uint8)


def signed_sums(bits: np.ndarray) -> list[int]:
    return (2 * bits.astype(int) - 1).sum(axis=0).tolist()


def hamming(a: np.ndarray, b: np.ndarray) -> int:
    return int(np.unpackbits((a ^ b).astype(">u8").view(np.uint8)).sum())


# --- the seeds' worked examples, arithmetic checked --------------------------------------------------------


def test_htm_example_without_token_similarity() -> None:
    bits = rows(
        "0 1 0 1 0 1 0 1 1",  # hello
        "0 0 0 1 0 0 1 0 0",  # there
        "1 0 0 1 0 1 0 1 0",  # world
    )
    assert signed_sums(bits) == [-1, -1, -3, 3, -3, 1, -1, 1, -1]
    assert simhash_from_bits(bits, active_bits=3).tolist() == [0, 0, 0, 1, 0, 1, 0, 1, 0]


def test_htm_example_with_token_similarity_uses_its_own_hash_rows() -> None:
    bits = rows(
        "0 1 0 1 0 1 0 1 1",  # hello
        "1 0 1 1 0 1 0 0 1",  # h
        "0 1 0 1 1 0 0 0 1",  # e
        "1 1 0 1 1 0 1 0 0",  # l
        "1 1 0 1 1 0 1 0 0",  # l
        "1 1 1 0 0 0 0 0 0",  # o
        "0 0 0 1 0 0 1 0 0",  # there
        "1 1 1 0 1 0 1 0 1",  # t
        "1 0 1 1 0 1 0 0 1",  # h
        "0 1 0 1 1 0 0 0 1",  # e
        "0 0 0 1 1 0 0 0 0",  # r
        "0 1 0 1 1 0 0 0 1",  # e
        "1 0 0 1 0 1 0 1 0",  # world
        "0 0 0 0 1 1 1 0 1",  # w
        "1 1 1 0 0 0 0 0 0",  # o
        "0 0 1 1 0 0 0 1 1",  # r
        "1 1 0 1 1 0 1 0 0",  # l
        "0 1 0 0 1 0 0 0 0",  # d
    )
    # The page prints [0 2 -6 8 -2 -8 -6 -12 0]; its rows sum to this.
    assert signed_sums(bits) == [0, 4, -6, 8, 2, -8, -6, -12, 0]
    # Four active bits: 8, 4, 2 and then the first of the two zeros (ties go to the lowest index).
    assert simhash_from_bits(bits, active_bits=4).tolist() == [1, 1, 0, 1, 1, 0, 0, 0, 0]


def test_erlang_example() -> None:
    bits = rows("1 0 1 0 1", "1 1 0 0 1", "1 1 0 0 0", "0 1 1 0 0", "0 1 0 0 0")
    # The post says 1 3 -3 -5 1 and 11001; the reader's comment is right.
    assert signed_sums(bits) == [1, 3, -1, -5, -1]
    assert simhash_from_bits(bits).tolist() == [1, 1, 0, 0, 0]


def test_simhash_from_bits_weights_ties_and_empty_input() -> None:
    bits = rows("1 0 1", "0 1 1")
    assert simhash_from_bits(bits).tolist() == [0, 0, 1]  # a sum of 0 is not > 0
    assert simhash_from_bits(bits, weights=[3.0, 1.0]).tolist() == [1, 0, 1]
    assert simhash_from_bits(bits, weights=[0.5, 2.0], active_bits=2).tolist() == [0, 1, 1]
    assert simhash_from_bits(np.zeros((0, 5))).tolist() == [0] * 5
    assert simhash_from_bits(np.zeros((0, 5)), active_bits=2).tolist() == [0] * 5
    with pytest.raises(ValueError, match="one value per feature"):
        simhash_from_bits(bits, weights=[1.0])
    with pytest.raises(ValueError, match="active_bits"):
        simhash_from_bits(bits, active_bits=4)


# --- the batch SimHash equals the definition -------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    counts=st.lists(st.integers(0, 700), min_size=1, max_size=12),
    words=st.sampled_from([1, 2, 3]),
    weighted=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_batch_simhash_matches_simhash_from_bits(counts: list[int], words: int, weighted: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    digests = rng.integers(0, 2**64, size=(offsets[-1], words), dtype=np.uint64, endpoint=False)
    weights = rng.integers(-3, 4, offsets[-1]).astype(float) if weighted else np.ones(offsets[-1])
    batch = FeatureBatch(digests[:, 0].copy(), weights, offsets, digests, digests[:, 0] >> np.uint64(20))
    result = simhash_from_features(batch)
    for document in range(len(counts)):
        own = slice(offsets[document], offsets[document + 1])
        bits = np.unpackbits(digests[own].astype(">u8").view(np.uint8), axis=1)
        expected = np.packbits(simhash_from_bits(bits, weights[own])).view(">u8")
        assert result[document].tolist() == expected.tolist()


def test_one_feature_documents_show_the_bit_order() -> None:
    # With a single feature every sum is +1 or -1, so the fingerprint is that feature's hash: bit i of the
    # width is bit 63 - i % 64 of word i // 64, and the hex reads the MD5 digest left to right.
    fingerprinter = classic(hash="md5", width=128)
    assert fingerprint_hex(fingerprinter.fingerprint(["Twitter"])) == [hashlib.md5(b"twitter").hexdigest()]
    fast = classic()
    assert fast.fingerprint(["twitter"])[0].tolist() == FeatureExtractor().hash_features(["twitter"]).tolist()
    shake = classic(hash="shake256", width=192)
    # Case folding turns the final sigma into a plain one.
    assert fingerprint_hex(shake.fingerprint(["σίσυφος"])) == [hashlib.shake_256("σίσυφοσ".encode()).hexdigest(24)]


# --- Fingerprinter ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("width", [64, 128, 192, 256])
@pytest.mark.parametrize("hash_name", ["fast", "md5", "shake256"])
def test_fingerprint_shape_and_similarity(width: int, hash_name: str) -> None:
    fingerprinter = classic(width=width, hash=hash_name)
    texts = [
        "The quick brown fox jumps over the lazy dog near the river bank this morning",
        "the quick brown fox jumped over the lazy dog near the river bank this morning!",
        "Stock markets fell sharply on Monday as investors worried about interest rates",
    ]
    fingerprints = fingerprinter.fingerprint(texts)
    assert fingerprints.shape == (3, width // 64)
    assert fingerprints.dtype == np.uint64
    near, far = hamming(fingerprints[0], fingerprints[1]), hamming(fingerprints[0], fingerprints[2])
    # One word in fourteen differs: about 12% of the bits are expected to flip, against 50% for unrelated texts.
    assert near <= width // 4 < far


def test_defaults_come_from_the_settings() -> None:
    fingerprinter = Fingerprinter()
    options = fingerprinter.settings
    assert (fingerprinter.width, options.hash, options.seed, options.segments) == (1024, "fast", 0, 32)
    assert options.features.char_ngrams == [4] and not options.features.char_ngram_spaces
    assert Fingerprinter(seed=5).fingerprint(["a b c"]).tolist() != fingerprinter.fingerprint(["a b c"]).tolist()
    with pytest.raises(ValueError, match="multiple of 64"):
        Fingerprinter(width=96)


def test_normalisation_makes_feed_variants_identical() -> None:
    fingerprints = Fingerprinter().fingerprint(
        [
            "Breaking: the bridge is closed",
            "RT @news: BREAKING — the bridge is closed!!! https://t.co/xyz #traffic",
            "ｂｒｅａｋｉｎｇ the bridge is closed…",
        ]
    )
    assert fingerprints[0].tolist() == fingerprints[1].tolist() == fingerprints[2].tolist()


def test_vocabulary_keys_are_normalised_like_texts() -> None:
    plain = classic().fingerprint(["BREAKING news today"])
    weighted = classic(features={"vocabulary": {"Breaking": 0.0}}).fingerprint(["BREAKING news today"])
    without = classic().fingerprint(["news today"])
    assert weighted.tolist() == without.tolist() != plain.tolist()
    excluded = classic(features={"excludes": ["BREAKING"]}).fingerprint(["breaking news today"])
    assert excluded.tolist() == without.tolist()


def test_bad_input_gets_a_defined_fingerprint_or_its_own_error() -> None:
    good = "a perfectly ordinary sentence about the weather"
    huge = "word " * 2_000_000  # 10 MB
    texts = [good, "", "   \n\t", "😀😀🎉", "🎉🎉😀", "a\ud800b", None, b"\xff\xfe", huge, b"bytes are decoded", good]
    batch = Fingerprinter().fingerprint_batch(texts)
    assert batch.fingerprints.shape == (11, 16)
    assert batch.errors[:6] == (None,) * 6
    assert batch.errors[6] == "text must be str, got NoneType"
    assert batch.errors[7] is not None and batch.errors[7].startswith("text is not valid UTF-8")
    assert batch.errors[8:] == (None, None, None)
    assert batch.empty.tolist() == [False, True, True, False, False, False, True, True, False, False, False]
    zero = [0] * 16
    assert [batch.fingerprints[i].tolist() for i in (1, 2, 6, 7)] == [zero] * 4
    # Emoji-only texts get real, distinct fingerprints; lone surrogates and huge texts defined ones.
    assert batch.fingerprints[3].tolist() != zero
    assert batch.fingerprints[3].tolist() != batch.fingerprints[4].tolist()
    assert batch.fingerprints[5].tolist() == Fingerprinter().fingerprint(["a\ud800b"])[0].tolist() != zero
    assert batch.fingerprints[8].tolist() == Fingerprinter().fingerprint(["word " * 200_000])[0].tolist()
    assert batch.fingerprints[9].tolist() == Fingerprinter().fingerprint(["bytes are decoded"])[0].tolist()
    # Bad neighbours change nothing for the good documents.
    assert (
        batch.fingerprints[0].tolist()
        == batch.fingerprints[10].tolist()
        == Fingerprinter().fingerprint([good])[0].tolist()
    )
    assert batch.normalized[0] == good and batch.normalized[6] == ""


class PoisonedNormalizer(Normalizer):
    """Fails on one particular text, as an unforeseen input would: fault injection for the isolation path."""

    def normalize_code_points(self, texts: Sequence[str]) -> CodePointBatch:
        if "poison" in texts:
            raise RuntimeError("cannot digest this")
        return super().normalize_code_points(texts)


def test_a_text_that_breaks_the_batch_path_fails_alone() -> None:
    texts = ["first text here", "poison", "third text there"]
    fingerprinter = Fingerprinter()
    fingerprinter.normalizer = PoisonedNormalizer(fingerprinter.settings.normalize)
    batch = fingerprinter.fingerprint_batch(texts)
    assert batch.errors == (None, "could not fingerprint this text: RuntimeError: cannot digest this", None)
    expected = Fingerprinter().fingerprint(["first text here", "third text there"])
    assert batch.fingerprints[[0, 2]].tolist() == expected.tolist()
    assert batch.fingerprints[1].tolist() == [0] * 16
    assert batch.empty.tolist() == [False, True, False]
    assert batch.normalized == ["first text here", "", "third text there"]


def test_whole_long_texts_are_fingerprinted_up_to_the_limit() -> None:
    text = "lorem ipsum " * 100_000 + "tail"
    capped = Fingerprinter(max_text_chars=24).fingerprint([text, "lorem ipsum lorem ipsum"])
    assert capped[0].tolist() == capped[1].tolist()
    full = Fingerprinter(max_text_chars=2_000_000).fingerprint([text])
    assert full.tolist() != capped[:1].tolist()


def test_batches_spanning_several_chunks_equal_documents_alone() -> None:
    fingerprinter = Fingerprinter(max_text_chars=2_000_000, features={"word_ngrams": [1, 2], "weighting": "tf"})
    texts = [f"document {i} " + " ".join(f"w{(i * j) % 997}" for j in range(120_000)) for i in range(3)]
    texts += ["short one", ""]
    together = fingerprinter.fingerprint(texts)
    alone = np.concatenate([fingerprinter.fingerprint([text]) for text in texts])
    assert together.tolist() == alone.tolist()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet="ab cд東京 ,😀#@:/.", max_size=30), min_size=1, max_size=8), st.integers(1, 8))
def test_fingerprints_do_not_depend_on_batch_boundaries(texts: list[str], split: int) -> None:
    fingerprinter = Fingerprinter(features=FeatureSettings(word_ngrams=[1, 2], char_ngrams=[3]))
    together = fingerprinter.fingerprint(texts)
    parts = np.concatenate([fingerprinter.fingerprint(texts[:split]), fingerprinter.fingerprint(texts[split:])])
    assert together.tolist() == parts.tolist()


def test_a_single_text_is_not_a_batch() -> None:
    with pytest.raises(TypeError, match="not a single text"):
        Fingerprinter().fingerprint("oops")


# --- command line ----------------------------------------------------------------------------------------


def test_cli_prints_the_hex_fingerprint(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fingerprint", "Twitter is littered with spam"]) == 0
    expected = fingerprint_hex(Fingerprinter().fingerprint(["Twitter is littered with spam"]))[0]
    assert capsys.readouterr().out == expected + "\n"


def test_cli_file_prints_one_line_per_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "docs.jsonl"
    lines = [json.dumps({"text": "first text here"}), "not json", json.dumps({"text": "😀😀"})]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["fingerprint", "--file", str(path)]) == 1
    captured = capsys.readouterr()
    expected = fingerprint_hex(Fingerprinter().fingerprint(["first text here", "😀😀"]))
    assert captured.out.splitlines() == [expected[0], "-", expected[1]]
    assert "invalid_json" in captured.err


# --- segmented SimHash ---------------------------------------------------------------------------------------


def brute_segments(
    hashes: list[int],
    identities: list[int],
    segments: int,
    bits: int,
    min_features: int,
    sample: int,
    weight: Callable[[int], float] = lambda h: 1.0,
) -> list[int]:
    """Per segment: the SimHash of the sampled features routed to it (one Python loop per bit: the oracle).

    A feature's route is its identity's range among ``segments`` equal ranges of the 44-bit identities; each
    segment samples its ``sample // segments`` features of least identity."""
    routed = [[] for _ in range(segments)]
    for identity, h in sorted(zip(identities, hashes, strict=False)):
        routed[identity * segments >> 44].append((identity, h))
    members = [[h for _, h in features[: sample // segments or None]] for features in routed]
    values = []
    for group in members:
        votes = [sum(weight(h) if (h >> (63 - i)) & 1 else -weight(h) for h in group) for i in range(bits)]
        values.append(sum(1 << (bits - 1 - i) for i, vote in enumerate(votes) if vote > 0))
    keyed = [len(group) >= min_features for group in members]
    if not any(keyed):
        keyed = [len(group) > 0 for group in members]
    return [value if use else 0 for value, use in zip(values, keyed, strict=False)]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 2**64 - 1), max_size=40, unique=True), min_size=1, max_size=6),
    st.sampled_from([(128, 8), (256, 8), (1024, 32), (512, 64)]),
    st.integers(1, 3),
    st.sampled_from([0, 1, 3]),
    st.booleans(),
)
def test_segmented_simhash_matches_brute_force(
    docs: list[list[int]], shape: tuple[int, int], min_features: int, per_segment: int, weighted: bool
) -> None:
    from streamdedup.fingerprint import segmented_simhash

    width, segments = shape
    sample = per_segment * segments
    bits = width // segments
    # Identities: distinct 44-bit values, ascending within each document as the extractor leaves them.
    identities = [sorted((h * 0x9E3779B97F4A7C15 % 2**64) >> 20 for h in doc) for doc in docs]
    hashes = np.array([h for doc in docs for h in doc], dtype=np.uint64)
    offsets = np.cumsum([0] + [len(doc) for doc in docs])
    flat_identities = np.array([i for doc in identities for i in doc], dtype=np.uint64)
    # Weights other than 1 (a vocabulary, tf) take the weighted sums; each feature's weight follows from its hash.
    weight = (lambda h: 0.5 + h % 7 / 2) if weighted else (lambda h: 1.0)
    weights = np.array([weight(h) for doc in docs for h in doc])
    batch = FeatureBatch(hashes, weights, offsets, hashes[:, None], flat_identities)
    fingerprints = segmented_simhash(batch, width, segments, min_features=min_features, sample=sample)
    for row, doc, doc_identities in zip(fingerprints, docs, identities, strict=False):
        expected = brute_segments(doc, doc_identities, segments, bits, min_features, sample, weight)
        per_word = 64 // bits
        got = [
            (int(row[g // per_word]) >> (bits * (per_word - 1 - g % per_word))) & ((1 << bits) - 1)
            for g in range(segments)
        ]
        assert got == expected


def test_segmented_simhash_of_a_large_batch_equals_its_parts() -> None:
    """A document's fingerprint does not depend on the batch around it, even one of more than 2**16
    (document, segment) groups."""
    from streamdedup.fingerprint import segmented_simhash

    rng = np.random.default_rng(12)
    documents, segments = 2_100, 32
    counts = rng.integers(1, 80, documents)
    hashes = rng.integers(0, 2**63, int(counts.sum()), dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    # Ascending identities within each document, as the extractor leaves them.
    identities = np.concatenate(
        [np.sort(rng.choice(2**44, size=count, replace=False)).astype(np.uint64) for count in counts]
    )

    def part(first: int, last: int) -> np.ndarray:
        low, high = offsets[first], offsets[last]
        batch = FeatureBatch(
            hashes[low:high],
            np.ones(high - low),
            offsets[first : last + 1] - low,
            hashes[low:high, None],
            identities[low:high],
        )
        return segmented_simhash(batch, 1024, segments, min_features=2, sample=96)

    assert documents * segments > 1 << 16
    whole = part(0, documents)
    assert np.array_equal(whole, np.concatenate([part(0, 1_000), part(1_000, documents)]))
    assert np.count_nonzero(whole) > whole.size // 2


def segments32(row: np.ndarray) -> list[int]:
    """The 32-bit segments of a fingerprint row, left to right."""
    return row.astype(">u8").view(">u4").tolist()


def test_a_small_edit_leaves_most_segments_equal() -> None:
    fingerprinter = Fingerprinter()
    text = "Die wahre Vermittlerin ist die Kunst. Über Kunst sprechen heißt die Vermittlerin vermitteln wollen."
    a, b = (segments32(row) for row in fingerprinter.fingerprint([text, text.replace("wahre", "echte")]))
    keyed = [x != 0 for x in a]
    assert sum(keyed) >= 8
    assert sum(x == y for x, y, k in zip(a, b, keyed, strict=False) if k) >= 0.5 * sum(keyed)
    unrelated = segments32(fingerprinter.fingerprint(["Stock markets fell sharply on Monday as investors fretted"])[0])
    assert not any(x == y != 0 for x, y in zip(a, unrelated, strict=False))


def test_sampling_makes_long_documents_as_stable_as_short_ones() -> None:
    long_text = " ".join(f"word{i}" for i in range(3000))
    sampled = Fingerprinter(segment_sample=96)
    batch = sampled.fingerprint_batch([long_text, long_text + " tail"])
    # Only the sample is kept: of the document's more than 96 * 40 features, the 3 of least identity routed to
    # each of the 32 segments.
    everything = FeatureExtractor(sampled.extractor.settings).extract(batch.normalized[:1])
    assert everything.counts[0] > 96 * 40
    assert batch.features.counts.tolist() == [96, 96]
    routed = list(zip(route_of(everything.identities, 32).tolist(), everything.identities.tolist(), strict=False))
    expected = [identity for route in range(32) for identity in [i for r, i in routed if r == route][:3]]
    assert batch.features.identities[:96].tolist() == expected
    # The few features the tail adds can only change the segments they are routed to: every other stays the same.
    tail = set(FeatureExtractor(sampled.extractor.settings).extract(batch.normalized[1:]).identities.tolist())
    touched = set(route_of(np.array(sorted(tail - set(everything.identities.tolist())), dtype=np.uint64), 32).tolist())
    assert 0 < len(touched) <= 4
    changed = {g for g, (x, y) in enumerate(zip(*map(segments32, batch.fingerprints), strict=False)) if x != y}
    assert changed <= touched
    assert sum(x != 0 for x in segments32(batch.fingerprints[0])) >= 16


def test_keep_features_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="keep_features must be >= 0"):
        Fingerprinter(keep_features=-1)


def test_the_sample_must_give_every_segment_an_equal_share() -> None:
    from streamdedup.fingerprint import segmented_simhash

    with pytest.raises(ValueError, match="segment_sample must be a multiple of the 32 segments"):
        Fingerprinter(segments=32, segment_sample=40)
    features = FeatureExtractor().extract(["some words here"])
    with pytest.raises(ValueError, match="sample must be a multiple of the 8 segments"):
        segmented_simhash(features, 256, 8, sample=12)
    assert Fingerprinter(segments=1, width=64, segment_sample=40).fingerprint(["some words here"]).shape == (1, 1)


def test_segments_must_divide_the_width() -> None:
    with pytest.raises(ValueError, match="equal segments"):
        Fingerprinter(width=1024, segments=48)
    with pytest.raises(ValueError, match="equal segments"):
        Fingerprinter(width=256, segments=2)


def test_char_ngrams_can_skip_spaces() -> None:
    spaceless = FeatureExtractor(FeatureSettings(word_ngrams=[], char_ngrams=[4], char_ngram_spaces=False))
    with_spaces = FeatureExtractor(FeatureSettings(word_ngrams=[], char_ngrams=[4]))

    def grams(extractor: FeatureExtractor, text: str) -> list[int]:
        return sorted(extractor.extract([text]).hashes.tolist())

    assert grams(spaceless, "dallaltra parte") == grams(spaceless, "dall altra parte")
    assert grams(with_spaces, "dallaltra parte") != grams(with_spaces, "dall altra parte")
