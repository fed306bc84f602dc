"""Signing: the same fingerprints and sketches in the deciding process and in the worker processes."""

from __future__ import annotations

import itertools
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from streamdedup.decide import Deduplicator, open_index
from streamdedup.document import Document
from streamdedup.features import FeatureExtractor, route_of
from streamdedup.fingerprint import Fingerprinter
from streamdedup.index import UNMEASURED
from streamdedup.index.plan import make_segment_plan
from streamdedup.minhash import BottomK
from streamdedup.offline import index_plan
from streamdedup.quality.corpus import load_stream
from streamdedup.settings import FeatureSettings, Settings, load_settings
from streamdedup.signature import (
    SIGNER_NICENESS,
    SIGNING_SCHEME,
    Signatures,
    Signer,
    SignerPool,
    signing_id,
)
from streamdedup.workers import WorkerDied
from tests.conftest import plant_signing_bug

TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "RT @x: The quick brown fox jumps over the lazy dog http://t.co/1",
    "",
    "   ",
    "日本語のテキストも同じように扱われる",
]


def _width_and_pid(signer: Signer, extra: int) -> tuple[int, int]:
    return signer.fingerprinter.width + extra, os.getpid()


@pytest.fixture(scope="module")
def settings() -> Settings:
    return load_settings(Path(__file__).parents[1] / "config.yaml")


def test_signatures_are_the_fingerprints_and_the_bottom_k_sketches(settings: Settings) -> None:
    signatures = Signer(settings.fingerprint, settings.dedup).sign([*TEXTS, b"\xff not utf-8"])  # type: ignore[list-item]
    batch = Fingerprinter.from_settings(settings.fingerprint).fingerprint_batch(TEXTS)
    assert signatures.fingerprints[: len(TEXTS)].tolist() == batch.fingerprints.tolist()
    expected = BottomK(settings.dedup.sketch_size).sketch(batch.features)
    assert signatures.sketches[: len(TEXTS)].tolist() == expected.tolist()
    assert signatures.sketches.shape == (len(TEXTS) + 1, settings.dedup.sketch_size)
    assert signatures.indexable.tolist() == [True, True, False, False, True, False]
    assert signatures.errors[-1] is not None and "UTF-8" in signatures.errors[-1]


def test_joined_signatures_are_those_of_the_whole_batch_without_its_keys(settings: Settings) -> None:
    signer = Signer(settings.fingerprint, settings.dedup, index_plan(settings))
    texts = [*TEXTS, b"\xff not utf-8", *TEXTS]
    whole, parts = signer.sign(texts), [signer.sign(texts[:4]), signer.sign(texts[4:])]
    joined = Signatures.joined(parts)
    assert joined.fingerprints.tolist() == whole.fingerprints.tolist()
    assert joined.sketches.tolist() == whole.sketches.tolist()
    assert joined.errors == whole.errors and joined.empty.tolist() == whole.empty.tolist()
    # The parts' keys and in-batch pairs miss the pairs across them: keying the whole finds those.
    assert joined.keys is None and joined.pairs is None
    assert signer.keyed(joined).pairs.later.tolist() == whole.pairs.later.tolist()
    assert len(whole.pairs.later) > len(parts[0].pairs.later) + len(parts[1].pairs.later)
    assert Signatures.joined(parts[:1]) is parts[0]


def test_a_sketch_wider_than_the_fingerprint_sample_reads_every_feature_it_needs(settings: Settings) -> None:
    fingerprint = settings.fingerprint.model_copy(update={"segment_sample": 32})
    policy = settings.dedup.model_copy(update={"sketch_size": 64})
    texts = [
        " ".join(TEXTS) * 20,
        " ".join(TEXTS[:2]) + " while the lazy dog sleeps under an old oak tree",
        " ".join(TEXTS[-1:] * 2 + TEXTS[:1]),
    ]
    signatures = Signer(fingerprint, policy).sign(texts)
    fingerprinter = Fingerprinter.from_settings(fingerprint)
    extractor = fingerprinter.extractor
    everything = FeatureExtractor(extractor.settings, extractor.hash_name, extractor.seed).extract(
        fingerprinter.normalizer.normalize(texts)
    )
    assert everything.counts.min() > 64
    assert signatures.sketches.tolist() == BottomK(64).sketch(everything).tolist()
    # The fingerprint is still sampled from one feature per segment, as a fingerprinter that keeps only those
    # makes it.
    sampled = fingerprinter.fingerprint_batch(texts).features
    routes = route_of(sampled.identities, 32)
    for first, last in itertools.pairwise(sampled.offsets.tolist()):
        assert len(set(routes[first:last].tolist())) == last - first > 16
    assert signatures.fingerprints.tolist() == fingerprinter.fingerprint(texts).tolist()


def test_the_pool_signs_exactly_as_the_process_itself(settings: Settings) -> None:
    texts = [doc.text for doc in load_stream(split="holdout")[:3000]]
    plan = index_plan(settings)
    local = [
        Signer(settings.fingerprint, settings.dedup, plan).sign(texts[start : start + 1000])
        for start in range(0, 3000, 1000)
    ]
    pool = SignerPool(settings.fingerprint, settings.dedup, workers=2, plan=plan)
    with pool:
        futures = [pool.submit(texts[start : start + 1000]) for start in range(0, len(texts), 1000)]
        remote = [future.result(timeout=120) for future in futures]
        # The workers yield a contested core to the decider.
        expected_niceness = min(19, os.getpriority(os.PRIO_PROCESS, 0) + SIGNER_NICENESS)
        assert [os.getpriority(os.PRIO_PROCESS, pid) for pid in pool.pids if pid] == [expected_niceness] * 2
        # Other work runs beside a worker's signer, the workers taking turns.
        ran = [pool.run(_width_and_pid, 7).result(timeout=120) for _ in range(2)]
        assert [width for width, _ in ran] == [settings.fingerprint.width + 7] * 2
        assert sorted(pid for _, pid in ran) == sorted(pool.pids)
    for mine, theirs in zip(local, remote, strict=True):
        assert theirs.fingerprints.tolist() == mine.fingerprints.tolist()
        assert theirs.sketches.tolist() == mine.sketches.tolist()
        assert theirs.errors == mine.errors
        assert theirs.keys is not None and mine.keys is not None and theirs.pairs is not None and mine.pairs is not None
        assert theirs.keys.plan == plan and np.array_equal(theirs.keys.keys, mine.keys.keys)
        assert np.array_equal(theirs.pairs.later, mine.pairs.later) and np.array_equal(
            theirs.pairs.jaccard, mine.pairs.jaccard
        )
    assert sum(len(part.pairs.later) for part in local if part.pairs is not None) > 100
    pool.stop()  # idempotent
    with pytest.raises(RuntimeError, match="stopped"):
        pool.submit(["x"])
    with pytest.raises(ValueError, match="at least 1"):
        SignerPool(settings.fingerprint, settings.dedup, workers=0)


def test_decide_with_given_signatures_gives_the_same_verdicts(settings: Settings, tmp_path: Path) -> None:
    stream = load_stream(split="tune")[:4000]
    batches = [[Document(d.id, d.text, 0.0) for d in stream[start : start + 1000]] for start in range(0, 4000, 1000)]
    # Signed without a plan, under the index's plan (keys used as they come), under another plan (re-keyed).
    signers = {
        "inline": None,
        "unkeyed": Signer(settings.fingerprint, settings.dedup),
        "keyed": Signer(settings.fingerprint, settings.dedup, index_plan(settings)),
        "other-plan": Signer(settings.fingerprint, settings.dedup, make_segment_plan(settings.fingerprint.width, 16)),
    }
    results = []
    for name, signer in signers.items():
        with open_index(settings, tmp_path / name) as index:
            dedup = Deduplicator(settings, index)
            results.append(
                [
                    (v.novel, v.reason, v.match_id, v.jaccard)
                    for batch in batches
                    for v in dedup.decide(batch, signatures=signer.sign([d.text for d in batch]) if signer else None)
                ]
            )
    assert all(result == results[0] for result in results[1:])
    assert sum(not novel for novel, _, _, _ in results[0]) > 1000
    one = Signer(settings.fingerprint, settings.dedup).sign(["one text"])
    with open_index(settings, tmp_path / "bad") as index, pytest.raises(ValueError, match="signatures for"):
        Deduplicator(settings, index).decide(batches[0], signatures=one)


def test_pairs_keyed_without_estimates_make_those_asked_for_as_keying_with_them_does(settings: Settings) -> None:
    texts = [d.text for d in load_stream(split="tune")[:3000]]
    signer = Signer(settings.fingerprint, settings.dedup, index_plan(settings))
    signatures = signer.sign(texts)
    estimated = signer.keyed(signatures).pairs
    deferred = signer.keyed(signatures, estimate=False).pairs
    assert estimated is not None and deferred is not None
    assert len(deferred.jaccard) == len(estimated.jaccard) > 500 and np.isnan(deferred.jaccard).all()
    # A copy's distance to its first copy is known without measuring; every other waits.
    assert set(deferred.distances.tolist()) <= {UNMEASURED, 0} and (deferred.distances == UNMEASURED).sum() > 500
    keep = np.random.default_rng(5).random(len(deferred.later)) < 0.3
    made = deferred.estimated(keep, signer.sketcher, signatures.fingerprints, signatures.sketches)
    assert made.jaccard.tolist() == estimated.jaccard[keep].tolist()
    assert made.earlier.tolist() == estimated.earlier[keep].tolist()
    assert made.distances.tolist() == estimated.distances[keep].tolist()
    # Made once, an estimate is kept: asking again makes none.
    again = made.estimated(
        np.ones(len(made.later), dtype=bool), signer.sketcher, signatures.fingerprints[:0], signatures.sketches[:0]
    )
    assert again.jaccard.tolist() == made.jaccard.tolist() and again.distances.tolist() == made.distances.tolist()


def test_batches_of_a_killed_worker_fail_with_worker_died(settings: Settings) -> None:
    texts = [doc.text for doc in load_stream(split="tune")[:20000]]
    with SignerPool(settings.fingerprint, settings.dedup, workers=1) as pool:
        pool.submit([]).result(timeout=120)
        running = pool.submit(texts)  # long enough to be killed under
        queued = pool.submit(texts[:10])  # waits behind it
        (pid,) = pool.pids
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerDied):
            running.result(timeout=60)
        with pytest.raises(WorkerDied):
            queued.result(timeout=60)


def test_stop_finishes_the_batches_already_submitted_and_refuses_new_ones(settings: Settings) -> None:
    texts = [doc.text for doc in load_stream(split="tune")[:20000]]
    pool = SignerPool(settings.fingerprint, settings.dedup, workers=1)
    pool.submit([]).result(timeout=120)
    first = pool.submit(texts)
    queued = pool.submit(texts[:10])
    pool.stop()
    assert first.done() and queued.done()
    assert len(first.result()) == len(texts)
    assert np.array_equal(queued.result().fingerprints, first.result().fingerprints[:10])
    with pytest.raises(RuntimeError, match="stopped"):
        pool.submit(texts[:1])


def test_warm_up_reaches_every_worker_and_signing_goes_on_as_before(settings: Settings) -> None:
    with SignerPool(settings.fingerprint, settings.dedup, workers=2) as pool:
        ready = pool.warm_up()
        assert len(ready) == 2
        assert [len(future.result(timeout=120)) for future in ready] == [0, 0]
        assert len({pid for pid in pool.pids}) == 2
        texts = ["one text", "another text entirely"]
        signed_here = Signer(settings.fingerprint, settings.dedup).sign(texts).fingerprints
        assert all(np.array_equal(pool.submit(texts).result(timeout=60).fingerprints, signed_here) for _ in range(2))
    with pytest.raises(RuntimeError, match="stopped"):
        pool.warm_up()


def test_the_signing_id_changes_with_every_setting_that_shapes_a_signature(settings: Settings) -> None:
    fingerprint, policy = settings.fingerprint, settings.dedup
    same = signing_id(fingerprint.model_copy(), policy.model_copy())
    assert same == signing_id(fingerprint, policy) and same.startswith(f"scheme {SIGNING_SCHEME}, settings ")
    others = {
        signing_id(fingerprint.model_copy(update={"segment_sample": 64}), policy),
        signing_id(fingerprint.model_copy(update={"seed": 1}), policy),
        signing_id(fingerprint.model_copy(update={"features": FeatureSettings(char_ngrams=[5])}), policy),
        signing_id(fingerprint, policy.model_copy(update={"sketch_size": 32})),
        signing_id(fingerprint, policy.model_copy(update={"sketch_features": FeatureSettings()})),
    }
    assert len(others) == 5 and same not in others
    # The decision policy's thresholds shape no stored signature.
    assert signing_id(fingerprint, policy.model_copy(update={"min_jaccard": 0.9, "verify": False})) == same


def test_a_text_that_breaks_signing_its_batch_gets_an_error_alone(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    signer = Signer(settings.fingerprint, settings.dedup, index_plan(settings))
    texts = [TEXTS[0], "a poisonword text", TEXTS[1], TEXTS[4]]
    expected = signer.sign([texts[0], texts[2], texts[3]])
    plant_signing_bug(monkeypatch, "poisonword", "a bug this text sets off")
    signatures = signer.sign(texts)
    assert signatures.errors == (
        None,
        "could not sign this text: ZeroDivisionError: a bug this text sets off",
        None,
        None,
    )
    assert signatures.indexable.tolist() == [True, False, True, True]
    kept = [0, 2, 3]
    assert signatures.fingerprints[kept].tolist() == expected.fingerprints.tolist()
    assert signatures.sketches[kept].tolist() == expected.sketches.tolist()
    assert not signatures.fingerprints[1].any()
    assert signatures.sketches.shape == (4, expected.sketches.shape[1])
