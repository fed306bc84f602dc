"""The properties htm.core's own tests assert for its SimHashDocumentEncoder, re-tested here."""

from __future__ import annotations

import hashlib
import random
import string

import numpy as np
import pytest

from streamdedup.document_encoder import SimHashDocumentEncoder
from streamdedup.fingerprint import simhash_from_bits


def overlap(a: np.ndarray, b: np.ndarray) -> int:
    return int((a & b).sum())


def random_words(count: int, seed: int, length: tuple[int, int] = (3, 8)) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(*length))) for _ in range(count)]


def test_encoding_is_the_sparse_simhash_of_shake256_token_bits() -> None:
    encoder = SimHashDocumentEncoder(size=100, active_bits=21)
    tokens = ["hello", "there", "world"]
    bits = np.array(
        [
            np.unpackbits(np.frombuffer(hashlib.shake_256(token.encode()).digest(13), dtype=np.uint8))[:100]
            for token in tokens
        ]
    )
    assert encoder.encode("Hello there  world").tolist() == simhash_from_bits(bits, active_bits=21).tolist()


def test_deterministic_and_exactly_active_bits() -> None:
    encoder = SimHashDocumentEncoder(size=400, sparsity=0.33)
    first = encoder.encode("the quick brown fox")
    assert first.tolist() == SimHashDocumentEncoder(size=400, sparsity=0.33).encode("the quick brown fox").tolist()
    assert first.sum() == encoder.active_bits == 132
    assert SimHashDocumentEncoder(size=1000, active_bits=7).encode(["a", "b"]).sum() == 7


def test_empty_input_gives_all_zeros() -> None:
    encoder = SimHashDocumentEncoder(size=64, active_bits=8)
    assert encoder.encode("").sum() == 0
    assert encoder.encode("   ").sum() == 0
    assert encoder.encode([]).sum() == 0


def test_excludes_equal_removing_those_tokens() -> None:
    plain = SimHashDocumentEncoder(size=400, active_bits=40)
    excluding = SimHashDocumentEncoder(size=400, active_bits=40, excludes=["Brown", "dog"])
    assert (
        excluding.encode("the quick brown fox likes the dog").tolist()
        == plain.encode("the quick fox likes the").tolist()
    )


def test_case_sensitivity() -> None:
    insensitive = SimHashDocumentEncoder(size=400, active_bits=40)
    assert insensitive.encode("Hello WORLD").tolist() == insensitive.encode("hello world").tolist()
    sensitive = SimHashDocumentEncoder(size=400, active_bits=40, case_sensitivity=True)
    assert sensitive.encode("Hello WORLD").tolist() != sensitive.encode("hello world").tolist()


def test_token_similarity_raises_the_overlap_of_tokens_that_differ_by_a_suffix() -> None:
    documents = [" ".join(random_words(4, seed, (6, 9))) for seed in range(60)]
    suffixed = [" ".join(word + "s" for word in document.split()) for document in documents]
    means = []
    for similar in (False, True):
        encoder = SimHashDocumentEncoder(size=400, active_bits=40, token_similarity=similar)
        a, b = encoder.encode_batch(documents), encoder.encode_batch(suffixed)
        means.append(np.mean([overlap(x, y) for x, y in zip(a, b, strict=True)]))
    assert means[1] > means[0] + 8


def test_heavier_shared_tokens_dominate_the_overlap() -> None:
    words = random_words(400, 7)
    pairs = [
        (" ".join([*words[i * 20 : i * 20 + 5], "shared"]), " ".join([*words[i * 20 + 10 : i * 20 + 15], "shared"]))
        for i in range(19)
    ]
    means = []
    for weight in (0, 1, 3):
        encoder = SimHashDocumentEncoder(size=400, active_bits=40, vocabulary={"shared": weight}, encode_orphans=True)
        means.append(np.mean([overlap(encoder.encode(a), encoder.encode(b)) for a, b in pairs]))
    # Weight 0: nothing shared (chance overlap); each step up in the shared token's weight adds overlap.
    assert means[0] < means[1] < means[2]
    assert means[2] > means[0] + 1.5


def test_vocabulary_and_orphans() -> None:
    vocabulary = {"alpha": 1, "beta": 2}
    dropping = SimHashDocumentEncoder(size=400, active_bits=40, vocabulary=vocabulary)
    assert dropping.encode("alpha beta orphan").tolist() == dropping.encode("alpha beta").tolist()
    assert dropping.encode("only orphans here").sum() == 0
    keeping = SimHashDocumentEncoder(size=400, active_bits=40, vocabulary=vocabulary, encode_orphans=True)
    assert keeping.encode("alpha beta orphan").tolist() != keeping.encode("alpha beta").tolist()
    assert keeping.encode("Beta").tolist() == keeping.encode("beta").tolist()


def test_frequency_floor_and_ceiling() -> None:
    floor = SimHashDocumentEncoder(size=400, active_bits=40, frequency_floor=1)
    # The first occurrence of each token is dropped: "a a b" counts one "a".
    assert floor.encode("a a b").tolist() == SimHashDocumentEncoder(size=400, active_bits=40).encode("a").tolist()
    ceiling = SimHashDocumentEncoder(size=400, active_bits=40, frequency_ceiling=2)
    plain = SimHashDocumentEncoder(size=400, active_bits=40)
    assert ceiling.encode("a a a b").tolist() == plain.encode("a b").tolist()


def test_greek_and_cyrillic() -> None:
    encoder = SimHashDocumentEncoder(size=400, active_bits=40, token_similarity=True)
    assert encoder.encode("ΚΑΛΗΜΕΡΑ κόσμε").tolist() == encoder.encode("καλημερα κόσμε").tolist()
    russian = encoder.encode_batch(
        ["привет мир как дела сегодня", "привет мир как дела вчера", "совсем другой текст здесь"]
    )
    assert russian.sum(axis=1).tolist() == [40, 40, 40]
    assert overlap(russian[0], russian[1]) > overlap(russian[0], russian[2])


def test_statistics_of_random_documents() -> None:
    rng = random.Random(42)
    documents = [
        " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 10))) for _ in range(9))
        for _ in range(1000)
    ]
    encoder = SimHashDocumentEncoder(size=400, sparsity=0.33)
    encodings = encoder.encode_batch(documents)
    activity = encodings.mean(axis=0)
    assert activity.min() > 0.01 and activity.max() < 0.99
    sparsity = encodings.mean(axis=1)
    assert np.abs(sparsity - 0.33).max() <= 0.01


def test_parameter_checks() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        SimHashDocumentEncoder(size=100)
    with pytest.raises(ValueError, match="exactly one"):
        SimHashDocumentEncoder(size=100, active_bits=5, sparsity=0.1)
    with pytest.raises(ValueError, match="between 1 and size"):
        SimHashDocumentEncoder(size=100, active_bits=100)
    with pytest.raises(ValueError, match="greater than frequency_floor"):
        SimHashDocumentEncoder(size=100, active_bits=5, frequency_floor=3, frequency_ceiling=3)
    with pytest.raises(ValueError, match="needs a vocabulary"):
        SimHashDocumentEncoder(size=100, active_bits=5, encode_orphans=True)
