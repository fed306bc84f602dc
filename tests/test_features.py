from __future__ import annotations

import hashlib
import unicodedata

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streamdedup.features import MAX_DOCUMENTS, FeatureBatch, FeatureExtractor
from streamdedup.settings import FeatureSettings

ALPHABET = "abc дж 12 東京タ ,.! 😀🎉 "
NOSPACE_LETTERS = "東京タ"


def features_of(batch: FeatureBatch, document: int) -> dict[int, float]:
    start, stop = batch.offsets[document], batch.offsets[document + 1]
    return dict(zip(batch.hashes[start:stop].tolist(), batch.weights[start:stop].tolist(), strict=True))


def expected(extractor: FeatureExtractor, texts: dict[str, float] | list[str]) -> dict[int, float]:
    weights = texts if isinstance(texts, dict) else dict.fromkeys(texts, 1.0)
    hashes = extractor.hash_features(list(weights)).tolist()
    return dict(zip(hashes, weights.values(), strict=True))


def kind(char: str) -> str:
    if char in NOSPACE_LETTERS:
        return "nospace"
    if char.isalnum():
        return "word"
    return "space" if char.isspace() else "solid"


def runs(text: str, wanted: str) -> list[str]:
    found, current = [], ""
    for char in text + " ":
        if kind(char) == wanted:
            current += char
        elif current:
            found.append(current)
            current = ""
    return found


def windows(text: str, size: int, *, whole_if_shorter: bool) -> list[str]:
    if 0 < len(text) < size:
        return [text] if whole_if_shorter else []
    return [text[i : i + size] for i in range(len(text) - size + 1)]


def oracle(text: str, settings: FeatureSettings) -> set[str]:
    """The feature texts of one (already normalised) text, by the rules in features.py, the slow way."""
    tokens = runs(text, "word")
    found: set[str] = set()
    for size in settings.word_ngrams:
        grams = [" ".join(tokens[i : i + size]) for i in range(len(tokens) - size + 1)]
        if not grams and tokens and size == settings.word_ngrams[0]:
            grams = [" ".join(tokens)]
        found.update(grams)
    for run in runs(text, "nospace"):
        found.update(windows(run, settings.cjk_char_ngram, whole_if_shorter=True))
    reading = text if settings.char_ngram_spaces else "".join(char for char in text if kind(char) != "space")
    for size in settings.char_ngrams:
        found.update(windows(reading, size, whole_if_shorter=size == settings.char_ngrams[0]))
    if not tokens and not runs(text, "nospace"):
        solid = "".join(char for char in text if kind(char) == "solid")
        found.update(windows(solid, settings.cjk_char_ngram, whole_if_shorter=True))
    return found


@settings(max_examples=150, deadline=None)
@given(
    texts=st.lists(st.text(alphabet=ALPHABET, max_size=25), min_size=1, max_size=5),
    word_ngrams=st.lists(st.integers(1, 3), max_size=2),
    char_ngrams=st.lists(st.integers(1, 4), max_size=2),
    cjk=st.integers(1, 3),
    spaces=st.booleans(),
)
def test_features_match_a_brute_force_oracle(
    texts: list[str], word_ngrams: list[int], char_ngrams: list[int], cjk: int, spaces: bool
) -> None:
    feature_settings = FeatureSettings(
        word_ngrams=word_ngrams, char_ngrams=char_ngrams, cjk_char_ngram=cjk, char_ngram_spaces=spaces
    )
    extractor = FeatureExtractor(feature_settings)
    batch = extractor.extract(texts)
    assert len(batch) == len(texts)
    for index, text in enumerate(texts):
        assert features_of(batch, index) == expected(extractor, sorted(oracle(text, feature_settings)))


def test_word_tokens_and_ngrams() -> None:
    extractor = FeatureExtractor(FeatureSettings(word_ngrams=[1, 2]))
    batch = extractor.extract(["twitter is littered with spam", "one"])
    words = ["twitter", "is", "littered", "with", "spam"]
    pairs = ["twitter is", "is littered", "littered with", "with spam"]
    assert features_of(batch, 0) == expected(extractor, words + pairs)
    # A one-word document has its word; no 2-gram is made up (1 is the smallest size).
    assert features_of(batch, 1) == expected(extractor, ["one"])
    only_pairs = FeatureExtractor(FeatureSettings(word_ngrams=[2]))
    assert features_of(only_pairs.extract(["one"]), 0) == expected(only_pairs, ["one"])


def test_character_ngrams_count_code_points_not_bytes() -> None:
    extractor = FeatureExtractor(FeatureSettings(word_ngrams=[], char_ngrams=[3]))
    batch = extractor.extract(["héllo", "a😀b"])
    assert features_of(batch, 0) == expected(extractor, ["hél", "éll", "llo"])
    assert features_of(batch, 1) == expected(extractor, ["a😀b"])


def test_text_without_spaces_gets_character_ngrams_automatically() -> None:
    extractor = FeatureExtractor(FeatureSettings())
    batch = extractor.extract(["東京タワーへ行く", "iphone发布了"])
    assert features_of(batch, 0) == expected(extractor, ["東京", "京タ", "タワ", "ワー", "ーへ", "へ行", "行く"])
    assert features_of(batch, 1) == expected(extractor, ["iphone", "发布", "布了"])
    thai = extractor.extract(["ภาษาไทย"])
    assert len(features_of(thai, 0)) == 6


def test_text_without_word_characters_falls_back_to_its_symbols() -> None:
    extractor = FeatureExtractor(FeatureSettings())
    batch = extractor.extract(["😀😀 🎉", "🎉😀😀", "😀", "", "   "])
    assert features_of(batch, 0) == expected(extractor, ["😀😀", "😀🎉"])
    assert features_of(batch, 1) == expected(extractor, ["🎉😀", "😀😀"])
    assert features_of(batch, 2) == expected(extractor, ["😀"])
    assert batch.counts.tolist()[3:] == [0, 0]


def test_weighting_vocabulary_excludes_and_frequency_limits() -> None:
    tf = FeatureExtractor(FeatureSettings(weighting="tf"))
    assert features_of(tf.extract(["a a b a"]), 0) == expected(tf, {"a": 3.0, "b": 1.0})
    binary = FeatureExtractor(FeatureSettings())
    assert features_of(binary.extract(["a a b a"]), 0) == expected(binary, {"a": 1.0, "b": 1.0})
    weighted = FeatureExtractor(FeatureSettings(weighting="tf", vocabulary={"a": 0.5, "new york": 4.0}))
    got = features_of(weighted.extract(["a a new york"]), 0)
    assert got == expected(weighted, {"a": 1.0, "new": 1.0, "york": 1.0})
    grams = FeatureExtractor(FeatureSettings(word_ngrams=[2], vocabulary={"new york": 4.0}))
    assert features_of(grams.extract(["in new york"]), 0) == expected(grams, {"in new": 1.0, "new york": 4.0})
    # An excluded token is removed before n-grams are formed.
    excluding = FeatureExtractor(FeatureSettings(word_ngrams=[1, 2], excludes=["the"]))
    assert features_of(excluding.extract(["a the b"]), 0) == expected(excluding, ["a", "b", "a b"])
    floor = FeatureExtractor(FeatureSettings(frequency_floor=2))
    assert features_of(floor.extract(["a a b"]), 0) == expected(floor, ["a"])
    ceiling = FeatureExtractor(FeatureSettings(frequency_ceiling=1))
    assert features_of(ceiling.extract(["a a b"]), 0) == expected(ceiling, ["b"])


def test_md5_and_shake256_hash_the_utf8_text() -> None:
    md5 = FeatureExtractor(hash_name="md5", width=256)
    batch = md5.extract(["twitter"])
    digest = hashlib.md5(b"twitter").digest()
    assert batch.hashes.tolist() == [int.from_bytes(digest[:8], "big")]
    assert batch.digests[0, :2].tolist() == [int.from_bytes(digest[:8], "big"), int.from_bytes(digest[8:], "big")]
    assert batch.digests.shape == (1, 4)
    shake = FeatureExtractor(hash_name="shake256", width=320)
    batch = shake.extract(["σίσυφος"])
    digest = hashlib.shake_256("σίσυφος".encode()).digest(40)
    assert batch.digests[0].tolist() == [int.from_bytes(digest[i : i + 8], "big") for i in range(0, 40, 8)]
    seeded = FeatureExtractor(hash_name="md5", seed=7)
    assert seeded.hash_features(["twitter"]).tolist() != md5.hash_features(["twitter"]).tolist()


def test_fast_hash_widths_and_seed() -> None:
    wide = FeatureExtractor(width=256).extract(["alpha beta"])
    assert wide.digests.shape == (2, 4)
    assert (wide.digests[:, 0] == wide.hashes).all()
    assert len(set(wide.digests.ravel().tolist())) == 8
    narrow = FeatureExtractor().extract(["alpha beta"])
    assert narrow.hashes.tolist() == wide.hashes.tolist()
    reseeded = FeatureExtractor(seed=1).extract(["alpha beta"])
    assert set(reseeded.hashes.tolist()).isdisjoint(narrow.hashes.tolist())


def test_fast_feature_hash_bits_are_balanced() -> None:
    extractor = FeatureExtractor(width=128)
    words = [f"w{i}" for i in range(20000)]
    digests = extractor.extract([" ".join(words)]).digests
    bits = np.unpackbits(digests.astype(">u8").view(np.uint8), axis=1)
    assert np.abs(bits.mean(axis=0) - 0.5).max() < 0.02


def first_features(batch: FeatureBatch, document: int, count: int) -> list[tuple[int, int, float, list[int]]]:
    """(identity, hash, weight, digest words) of a document's first ``count`` features."""
    start = batch.offsets[document]
    stop = min(batch.offsets[document + 1], start + count)
    return list(
        zip(
            batch.identities[start:stop].tolist(),
            batch.hashes[start:stop].tolist(),
            batch.weights[start:stop].tolist(),
            batch.digests[start:stop].tolist(),
            strict=True,
        )
    )


@settings(max_examples=120, deadline=None)
@given(
    texts=st.lists(
        st.one_of(
            st.text(alphabet=ALPHABET, max_size=120),
            # Few distinct features among many occurrences: the first identity bound leaves these short.
            st.builds(
                lambda unit, times: unit * times, st.text(alphabet="ab 東", min_size=1, max_size=4), st.integers(1, 60)
            ),
        ),
        min_size=1,
        max_size=6,
    ),
    least=st.sampled_from([0, 1, 3, 8, 30]),
    routes_and_least=st.sampled_from([(1, 0), (2, 1), (3, 1), (3, 3), (32, 1)]),
    hash_name=st.sampled_from(["fast", "md5"]),
    options=st.sampled_from(
        [{}, {"weighting": "tf"}, {"frequency_floor": 2}, {"frequency_ceiling": 1}, {"excludes": ["ab", "дж"]}]
    ),
)
# The route bounds keep features of higher identity than the document's own bound: not its least ones.
@example(
    texts=[" 2 11 11 112a1a 2 a1221211a2111a   1222"], least=3, routes_and_least=(2, 1), hash_name="fast", options={}
)
def test_least_keeps_exactly_the_features_of_least_identity_of_each_document_and_route(
    texts: list[str], least: int, routes_and_least: tuple[int, int], hash_name: str, options: dict[str, object]
) -> None:
    routes, least_per_route = routes_and_least
    feature_settings = FeatureSettings(word_ngrams=[1], char_ngrams=[3], **options)
    everything = FeatureExtractor(feature_settings, hash_name, width=128).extract(texts)  # type: ignore[arg-type]
    extractor = FeatureExtractor(
        feature_settings,
        hash_name,  # type: ignore[arg-type]
        width=128,
        least=least,
        routes=routes,
        least_per_route=least_per_route,
    )
    fewest = extractor.extract(texts)
    wanted = least or least_per_route
    for index in range(len(texts)):
        features = first_features(everything, index, everything.counts[index])
        if wanted:
            # The oracle: a document's features are in identity order; count each route's as they come.
            seen = [0] * routes
            kept = []
            for rank, feature in enumerate(features):
                route = feature[0] * routes >> 44
                if rank < least or seen[route] < least_per_route:
                    kept.append(feature)
                seen[route] += 1
            features = kept
        assert first_features(fewest, index, fewest.counts[index]) == features


def test_the_last_document_of_a_full_extraction_keeps_its_features() -> None:
    # Its (document, identity) keys sit at the top of the uint64 range, just under those of the windows that
    # straddle two documents (filed under document + 1).
    long_text = " ".join(f"word{i}" for i in range(200))
    texts = ["a"] * (MAX_DOCUMENTS - 1) + [long_text]
    words_and_grams = FeatureSettings(word_ngrams=[1], char_ngrams=[3], char_ngram_spaces=False)
    alone = FeatureExtractor(words_and_grams).extract([long_text]).counts[0]
    assert alone > 200
    for least in (0, 8):
        batch = FeatureExtractor(words_and_grams, least=least).extract(texts)
        # "a" is both a word and the one window of a text shorter than 3: the same feature.
        assert batch.counts[:3].tolist() == [1, 1, 1]
        assert batch.counts[-1] == (8 if least else alone)
        assert batch.offsets[-1] == len(batch.hashes)
        assert sorted(batch.identities[-batch.counts[-1] :].tolist()) == batch.identities[-batch.counts[-1] :].tolist()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet=ALPHABET, max_size=20), min_size=1, max_size=6))
def test_a_document_has_the_same_features_in_any_batch(texts: list[str]) -> None:
    extractor = FeatureExtractor(FeatureSettings(word_ngrams=[1, 2], char_ngrams=[3]), "md5")
    together = extractor.extract(texts)
    for index, text in enumerate(texts):
        assert features_of(together, index) == features_of(extractor.extract([text]), 0)


def test_unicode_normal_forms_are_the_callers_business() -> None:
    extractor = FeatureExtractor()
    composed, decomposed = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    batch = extractor.extract([composed, decomposed])
    assert features_of(batch, 0) != features_of(batch, 1)
    assert features_of(batch, 1) == expected(extractor, [decomposed])  # the accent stays in its word


def test_bad_options() -> None:
    with pytest.raises(ValueError, match="hash must be"):
        FeatureExtractor(hash_name="sha1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="multiple of 64"):
        FeatureExtractor(width=100)
    with pytest.raises(ValueError, match="least and least_per_route must be >= 0"):
        FeatureExtractor(least=-1)
    with pytest.raises(ValueError, match="least and least_per_route must be >= 0"):
        FeatureExtractor(least_per_route=-1)
    with pytest.raises(ValueError, match="routes must be between 1 and"):
        FeatureExtractor(routes=0)
