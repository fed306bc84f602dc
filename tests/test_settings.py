from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from streamdedup.fingerprint import Fingerprinter
from streamdedup.settings import (
    ConfigError,
    FeatureSettings,
    FingerprintSettings,
    KafkaSettings,
    NormalizeSettings,
    load_settings,
)

CONFIG = Path(__file__).resolve().parent.parent / "config.yaml"


def test_config_yaml_fingerprint_section_equals_the_defaults() -> None:
    section = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))["fingerprint"]
    assert section == FingerprintSettings().model_dump(mode="json")
    assert load_settings(CONFIG).fingerprint == FingerprintSettings()


def test_every_fingerprint_key_is_documented_in_config_yaml() -> None:
    text = CONFIG.read_text(encoding="utf-8")
    section = text[text.index("\nfingerprint:") :]
    lines = section[: section.index("\n\n")].splitlines()
    keys = [*FingerprintSettings.model_fields, *NormalizeSettings.model_fields, *FeatureSettings.model_fields]
    for key in keys:
        documented = [line for line in lines if line.strip().startswith(f"{key}:")]
        assert documented, key
        assert all("#" in line for line in documented), key


def test_environment_overrides_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMDEDUP_FINGERPRINT__WIDTH", "128")
    monkeypatch.setenv("STREAMDEDUP_FINGERPRINT__HASH", "md5")
    monkeypatch.setenv("STREAMDEDUP_FINGERPRINT__NORMALIZE__STRIP_ACCENTS", "true")
    monkeypatch.setenv("STREAMDEDUP_FINGERPRINT__FEATURES__WORD_NGRAMS", "[2, 1, 2]")
    settings = load_settings(CONFIG).fingerprint
    assert (settings.width, settings.hash, settings.normalize.strip_accents) == (128, "md5", True)
    assert settings.features.word_ngrams == [1, 2]
    assert settings.seed == 0
    assert Fingerprinter.from_settings(settings).fingerprint(["café au lait"]).shape == (1, 2)


def test_settings_from_a_file_pickle_for_the_processes_that_take_them(tmp_path: Path) -> None:
    # Spawned processes (signing workers, benchmark runs) get the settings pickled.
    config = tmp_path / "config.yaml"
    config.write_text(
        "fingerprint:\n  features:\n    char_ngram_spaces: true\nkafka:\n  security:\n    sasl_password: pw\n"
    )
    settings = load_settings(config)
    copy = pickle.loads(pickle.dumps(settings))
    assert copy == settings
    assert copy.fingerprint.features.char_ngram_spaces is True
    assert copy.kafka.security.sasl_password is not None
    assert copy.kafka.security.sasl_password.get_secret_value() == "pw"


@pytest.mark.parametrize(
    ("variable", "value", "key"),
    [
        ("STREAMDEDUP_FINGERPRINT__WIDTH", "100", "fingerprint.width"),
        ("STREAMDEDUP_FINGERPRINT__HASH", "sha1", "fingerprint.hash"),
        ("STREAMDEDUP_FINGERPRINT__FEATURES__CHAR_NGRAMS", "[0]", "fingerprint.features.char_ngrams"),
        ("STREAMDEDUP_FINGERPRINT__FEATURES__WEIGHTING", "idf", "fingerprint.features.weighting"),
        ("STREAMDEDUP_FINGERPRINT__NORMALIZE__NFKC", "perhaps", "fingerprint.normalize.nfkc"),
    ],
)
def test_errors_name_the_key(monkeypatch: pytest.MonkeyPatch, variable: str, value: str, key: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_settings(CONFIG)


def test_unknown_keys_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("fingerprint:\n  widht: 128\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"fingerprint\.widht"):
        load_settings(path)


def test_max_future_seconds_must_stay_below_max_age(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings(CONFIG).input.max_future_seconds == 300
    monkeypatch.setenv("STREAMDEDUP_INPUT__MAX_FUTURE_SECONDS", "-1")
    with pytest.raises(ConfigError, match=r"input\.max_future_seconds"):
        load_settings(CONFIG)
    monkeypatch.setenv("STREAMDEDUP_INPUT__MAX_FUTURE_SECONDS", "3600")
    monkeypatch.setenv("STREAMDEDUP_INDEX__MAX_AGE_SECONDS", "3600")
    with pytest.raises(
        ConfigError, match=r"^invalid configuration: Value error, input\.max_future_seconds \(3600\) must be less"
    ):
        load_settings(CONFIG)
    monkeypatch.setenv("STREAMDEDUP_INDEX__MAX_AGE_SECONDS", "3601")
    assert load_settings(CONFIG).input.max_future_seconds == 3600


def test_config_yaml_kafka_section_equals_the_defaults() -> None:
    assert load_settings(CONFIG).kafka == KafkaSettings()


def test_topics_are_replicated_as_the_cluster_chooses_unless_set() -> None:
    assert KafkaSettings().topic_replication_factor is None
    assert KafkaSettings(topic_replication_factor=3).topic_replication_factor == 3
    with pytest.raises(ValidationError):
        KafkaSettings(topic_replication_factor=0)


def test_a_scaled_out_deployment_derives_its_roles_names_from_the_group_not_the_instance() -> None:
    kafka = KafkaSettings(group_id="orders", group_instance_id="pod-2", sequence_topic="orders-sequence")
    # The same on every instance: whoever takes a partition (or the sequence) over fences whoever had it.
    assert kafka.sequencer_transactional_id("news", 3) == "orders.sequencer.news.3"
    decider = kafka.decider()
    assert decider.input_topics == ["orders-sequence"]
    assert decider.group_id == "orders.decider"
    assert decider.producer_transactional_id == "orders.decider"
    assert (decider.output_topic, decider.group_instance_id) == (kafka.output_topic, "pod-2")
    named = KafkaSettings(group_id="orders", transactional_id="tx", sequence_topic="orders-sequence")
    assert named.decider().producer_transactional_id == "tx.decider"
    assert named.sequencer_transactional_id("news", 0) == "tx.sequencer.news.0"
    with pytest.raises(ValueError, match=r"needs kafka\.sequence_topic"):
        KafkaSettings().decider()


@pytest.mark.parametrize(
    ("topic", "taken"),
    [("news", "news"), ("streamdedup-dead-letters", "streamdedup-dead-letters"), ("out", "out.verdicts")],
)
def test_the_sequence_topic_and_its_verdicts_topic_are_topics_of_their_own(topic: str, taken: str) -> None:
    with pytest.raises(ValidationError, match=f"must be topics of their own \\('{taken}' is also"):
        KafkaSettings(input_topics=["news"], output_topic="out.verdicts", sequence_topic=topic)
    assert KafkaSettings(sequence_topic="orders-sequence").verdicts_topic == "orders-sequence.verdicts"
    assert KafkaSettings().verdicts_topic is None


def test_every_input_record_must_fit_a_sequence_record() -> None:
    with pytest.raises(ConfigError, match=r"must exceed input\.max_message_bytes"):
        load_settings(
            None,
            kafka={"sequence_topic": "s", "max_request_bytes": 1_000_000},
            input={"max_message_bytes": 1_000_000},
        )
    assert load_settings(None, kafka={"sequence_topic": "s"}).kafka.sequence_topic == "s"


def test_the_default_transactional_id_is_the_group_and_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    assert KafkaSettings().producer_transactional_id == KafkaSettings().group_id
    assert KafkaSettings(group_id="orders").producer_transactional_id == "orders"
    assert KafkaSettings(group_id="orders", group_instance_id="pod-0").producer_transactional_id == "orders/pod-0"
    given = KafkaSettings(group_id="orders", group_instance_id="pod-0", transactional_id="tx")
    assert given.producer_transactional_id == "tx"
    # The environment's group, not the file's, names the producer.
    monkeypatch.setenv("STREAMDEDUP_KAFKA__GROUP_ID", "invoices")
    assert load_settings(CONFIG).kafka.producer_transactional_id == "invoices"
