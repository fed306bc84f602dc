from __future__ import annotations

import json

from streamdedup.quality.build import PER_LANGUAGE, SAMPLE_FEED_FILE, sample_feed, select_items
from streamdedup.quality.sources import SourceItem, load_sources


def test_selection_drops_repeats_and_meets_quotas():
    items = [SourceItem("fortunes", "p", "1", "f", "en", f"cookie number {n} with some words in it") for n in range(30)]
    items += [items[0], SourceItem("fortunes", "p", "1", "f", "en", "!!! ... ???")]  # a repeat; nothing left
    chosen = select_items(items, per_language=10, seed=1)
    assert len(chosen) == 10 and len(set(chosen)) == 10
    assert chosen == select_items(items, per_language=10, seed=1)
    assert chosen != select_items(items, per_language=10, seed=2)
    assert all(item in items[:30] for item in chosen)


def test_shipped_sources_were_selected_with_the_quota():
    sources = load_sources()
    counts: dict[tuple[str, str], int] = {}
    for item in sources:
        counts[item.source, item.lang] = counts.get((item.source, item.lang), 0) + 1
    assert max(counts.values()) == PER_LANGUAGE


def test_sample_feed_rebuilds_identically():
    shipped = [json.loads(line) for line in SAMPLE_FEED_FILE.read_text(encoding="utf-8").splitlines()]
    assert sample_feed(load_sources()) == shipped
    assert len(shipped) >= 3000
    assert len({record["id"] for record in shipped}) == len(shipped)
    times = [record["time"] for record in shipped]
    assert times == sorted(times)
    texts = [record["text"] for record in shipped]
    assert len(set(texts)) < len(texts)  # exact reposts among the near ones
