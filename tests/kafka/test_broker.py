from __future__ import annotations

from pathlib import Path

import pytest

from streamdedup.kafka.broker import LocalBroker
from tests.conftest import OutRecord

pytestmark = pytest.mark.integration


async def test_session_broker_round_trips_records(topic_factory, kafka_produce, kafka_consume) -> None:
    topic = await topic_factory(partitions=2)
    sent = [OutRecord(f"v{i}".encode(), key=b"k", headers=(("h", str(i).encode()),), partition=i % 2) for i in range(6)]
    await kafka_produce(topic, sent)
    got = await kafka_consume(topic)
    assert [(r.partition, r.value, r.key, list(r.headers)) for r in got] == [
        (0, b"v0", b"k", [("h", b"0")]),
        (0, b"v2", b"k", [("h", b"2")]),
        (0, b"v4", b"k", [("h", b"4")]),
        (1, b"v1", b"k", [("h", b"1")]),
        (1, b"v3", b"k", [("h", b"3")]),
        (1, b"v5", b"k", [("h", b"5")]),
    ]


@pytest.mark.slow
def test_local_broker_start_stop_are_idempotent_and_keep_address_and_data(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path / "kafka")
    try:
        address = broker.start()
        assert address.startswith("127.0.0.1:")
        assert broker.start() == address
        assert broker.running()
        broker.stop()
        broker.stop()
        assert not broker.running()
        assert broker.start() == address
        assert (tmp_path / "kafka" / "data" / "meta.properties").is_file()
    finally:
        broker.stop()
    assert not broker.running()


@pytest.mark.parametrize("argument", ["", "--add-scram SCRAM-SHA-256=[name=a,password=b]", "two\twords"])
def test_format_arguments_with_blanks_are_refused_before_anything_starts(tmp_path: Path, argument: str) -> None:
    # The script splits KAFKA_FORMAT_ARGS at blanks: an argument holding one would arrive as two.
    with pytest.raises(ValueError, match="without blanks"):
        LocalBroker(tmp_path / "kafka", format_args=["--add-scram", argument])
    assert not (tmp_path / "kafka").exists()
