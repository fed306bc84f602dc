"""Settings: validated once at the edge (YAML file + ``STREAMDEDUP_...`` environment), immutable afterwards.

Every section is a frozen pydantic model; the defaults here are the defaults of ``config.yaml`` (a test
holds the two together). Environment variables override the file with ``__`` between nested keys, e.g.
``STREAMDEDUP_KAFKA__BOOTSTRAP_SERVERS=broker:9092``. Secrets are ``SecretStr`` and print masked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from .names import (
    DEFAULT_CONSUMER_GROUP,
    DEFAULT_DEAD_LETTER_TOPIC,
    DEFAULT_INPUT_TOPIC,
    DEFAULT_OUTPUT_TOPIC,
)
from .names import (
    verdicts_topic as verdicts_topic_of,
)

__all__ = [
    "ConfigError",
    "DedupSettings",
    "FeatureSettings",
    "FingerprintSettings",
    "IndexSettings",
    "InputSettings",
    "KafkaSecuritySettings",
    "KafkaSettings",
    "LoggingSettings",
    "MetricsSettings",
    "NormalizeSettings",
    "Settings",
    "load_settings",
]


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key and what is allowed."""


class Section(BaseModel):
    """Base of every settings section: immutable, unknown keys rejected (a typo is an error, not a no-op)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class NormalizeSettings(Section):
    enabled: bool = True
    nfkc: bool = True
    casefold: bool = True
    strip_accents: bool = False
    strip_retweet: bool = True
    strip_urls: bool = True
    strip_mentions: bool = True
    strip_hashtags: bool = True
    strip_ellipsis: bool = True
    collapse_punctuation: bool = True


class FeatureSettings(Section):
    word_ngrams: list[int] = Field(default_factory=lambda: [1])
    char_ngrams: list[int] = Field(default_factory=list)
    char_ngram_spaces: bool = True
    cjk_char_ngram: int = Field(default=2, ge=1, le=8)
    weighting: Literal["binary", "tf"] = "binary"
    vocabulary: dict[str, float] = Field(default_factory=dict)
    excludes: list[str] = Field(default_factory=list)
    frequency_floor: int = Field(default=0, ge=0)
    frequency_ceiling: int | None = Field(default=None, ge=1)

    @field_validator("word_ngrams", "char_ngrams")
    @classmethod
    def _positive_sizes(cls, sizes: list[int]) -> list[int]:
        if any(n < 1 or n > 16 for n in sizes):
            raise ValueError(f"n-gram sizes must be between 1 and 16, got {sizes}")
        return sorted(set(sizes))


# The default fingerprint: 32 segments of 32 bits over spaceless character 4-grams (see README, "Quality").
DEFAULT_FEATURES = FeatureSettings(word_ngrams=[], char_ngrams=[4], char_ngram_spaces=False)


class FingerprintSettings(Section):
    width: int = 1024
    hash: Literal["fast", "md5", "shake256"] = "fast"
    seed: int = Field(default=0, ge=0, lt=2**63)
    max_text_chars: int = Field(default=1_000_000, ge=1)
    segments: int = Field(default=32, ge=1)
    segment_min_features: int = Field(default=2, ge=1)
    segment_sample: int = Field(default=96, ge=0)
    normalize: NormalizeSettings = NormalizeSettings()
    features: FeatureSettings = DEFAULT_FEATURES

    @field_validator("width")
    @classmethod
    def _width_multiple_of_64(cls, width: int) -> int:
        if width < 64 or width % 64:
            raise ValueError(f"width must be a positive multiple of 64 (64, 128, 256, ...), got {width}")
        return width

    @model_validator(mode="after")
    def _segments_divide_width(self) -> FingerprintSettings:
        bits = self.width // self.segments
        if self.segments > 1 and (self.width % self.segments or bits > 64 or 64 % bits):
            raise ValueError(
                f"segments must cut width {self.width} into equal segments of 1, 2, 4, 8, 16, 32 or 64 bits, "
                f"got {self.segments}"
            )
        if self.segments > 1 and self.segment_sample % self.segments:
            raise ValueError(
                f"segment_sample must be a multiple of the {self.segments} segments (each takes an equal share), "
                f"got {self.segment_sample}"
            )
        return self


class IndexSettings(Section):
    path: Path = Path("var/index")
    radius: int | None = Field(default=None, ge=0)
    expected_entries: int = Field(default=10_000_000, ge=1)
    max_age_seconds: float | None = Field(default=7 * 24 * 3600.0, gt=0)
    # A document sees an entry only while fewer than max_entries documents were kept after it, and older entries
    # are evicted: what is evicted depends on the kept documents alone, not on where batches were cut.
    max_entries: int | None = Field(default=50_000_000, ge=1)
    time_bucket_seconds: float = Field(default=3600.0, gt=0)
    max_tables: int = Field(default=16, ge=1, le=48)
    map_size_bytes: int = Field(default=1 << 30, ge=1 << 16)
    # A batch that does not fit pauses consumption and is retried with the kafka retry backoff.
    max_map_size_bytes: int | None = Field(default=None, ge=1 << 16)
    sync: bool = True
    mirror_bytes: int = Field(default=320 << 20, ge=0)


class DedupSettings(Section):
    """The decision policy on top of the Hamming lookup."""

    verify: bool = True
    sketch_size: int = Field(default=64, ge=8, le=1024)
    sketch_features: FeatureSettings | None = None
    min_jaccard: float = Field(default=0.55, gt=0.0, le=1.0)
    batch_size: int = Field(default=4096, ge=1)
    workers: int = Field(default=2, ge=0)
    # Hot keys (boilerplate, templates) must not make a lookup's cost grow with the index: a table key leads to
    # at most key_capacity kept documents, and each document verifies at most max_candidates of those it finds.
    key_capacity: int | None = Field(default=32, ge=1)
    max_candidates: int | None = Field(default=16, ge=1)


class MetricsSettings(Section):
    """The HTTP endpoints: /metrics for Prometheus, /healthz and /readyz for the orchestrator."""

    enabled: bool = True
    host: str = "0.0.0.0"
    port: int = Field(default=8000, ge=0, le=65535)


class LoggingSettings(Section):
    """Log records go to standard error; JSON puts each record, with its extra fields, on one line. A line of
    the Kafka client repeated within ``library_repeat_seconds`` shows once (0: every line)."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    format: Literal["text", "json"] = "text"
    library_repeat_seconds: float = Field(default=30.0, ge=0)

    @field_validator("level", mode="before")
    @classmethod
    def _upper_level(cls, level: object) -> object:
        return level.upper() if isinstance(level, str) else level


class InputSettings(Section):
    """How a record value becomes a document: JSON with field paths (dotted, array indices allowed) or text."""

    format: Literal["json", "text"] = "json"
    text_fields: list[str] = Field(default_factory=lambda: ["text"], min_length=1)
    text_separator: str = "\n"
    # A record carrying the id of a kept document from another origin (topic, partition, offset) is an upstream
    # redelivery: dropped as "redelivered", whatever its text. From the same origin it is a replay of that record.
    id_field: str | None = None
    time_field: str | None = None
    max_message_bytes: int = Field(default=1_000_000, ge=1)
    # Event times (time_field, else the record timestamp) later than this far ahead of the wall clock are clamped
    # to it and counted: stamps in milliseconds, or a producer clock years off, would otherwise move the index's
    # expiry clock and expire what it holds. Below index.max_age_seconds, so a clamped burst expires nothing current.
    max_future_seconds: float = Field(default=300.0, ge=0)


class KafkaSecuritySettings(Section):
    """Passed through to aiokafka: SASL (PLAIN, SCRAM) and/or TLS. Passwords are SecretStr, never logged."""

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_key_password: SecretStr | None = None
    ssl_check_hostname: bool = True

    @model_validator(mode="after")
    def _complete(self) -> KafkaSecuritySettings:
        if self.protocol.startswith("SASL") and (not self.sasl_username or self.sasl_password is None):
            raise ValueError(f"protocol {self.protocol} needs sasl_username and sasl_password")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile go together (client certificate and its key)")
        return self


class KafkaSettings(Section):
    """The Kafka service: where it reads and writes, its group and transactions, batching and retries."""

    bootstrap_servers: str = "127.0.0.1:9092"
    client_id: str = "streamdedup"
    group_id: str = DEFAULT_CONSUMER_GROUP
    group_instance_id: str | None = None
    # None: derived from the group (see ``producer_transactional_id``).
    transactional_id: str | None = None
    input_topics: list[str] = Field(default_factory=lambda: [DEFAULT_INPUT_TOPIC], min_length=1)
    output_topic: str = DEFAULT_OUTPUT_TOPIC
    duplicates_topic: str | None = None
    dead_letter_topic: str = DEFAULT_DEAD_LETTER_TOPIC
    create_topics: bool = True
    topic_partitions: int = Field(default=1, ge=1)
    # None: the cluster's default.replication.factor, so a real cluster's topics are replicated as it chose.
    topic_replication_factor: int | None = Field(default=None, ge=1)
    batch_max_records: int = Field(default=1000, ge=1)
    batch_timeout_ms: int = Field(default=100, ge=0)
    fetch_max_bytes: int = Field(default=52_428_800, ge=1024)
    max_request_bytes: int = Field(default=16_777_216, ge=1024)
    linger_ms: int = Field(default=5, ge=0)
    session_timeout_ms: int = Field(default=10_000, ge=1000)
    heartbeat_interval_ms: int = Field(default=3_000, ge=100)
    transaction_timeout_ms: int = Field(default=60_000, ge=1000)
    request_timeout_ms: int = Field(default=30_000, ge=1000)
    # Also the first pause before retrying a batch the index refused and before replacing a decision process that
    # died again without deciding anything; each doubles up to retry_backoff_max_seconds.
    retry_backoff_seconds: float = Field(default=0.5, gt=0)
    retry_backoff_max_seconds: float = Field(default=30.0, gt=0)
    # None: one instance owns every input partition. A topic: scale out (see ``decider``).
    sequence_topic: str | None = None
    # Scaled out: one instance that does not decide keeps its index level with the decider's (a warm standby).
    warm_standby: bool = True
    security: KafkaSecuritySettings = KafkaSecuritySettings()

    @model_validator(mode="after")
    def _sequence_apart(self) -> KafkaSettings:
        taken = [*self.input_topics, self.output_topic, self.dead_letter_topic, self.duplicates_topic]
        for topic in (self.sequence_topic, self.verdicts_topic):
            if topic is not None and topic in taken:
                raise ValueError(
                    f"sequence_topic {self.sequence_topic!r} and its verdicts topic {self.verdicts_topic!r} must be "
                    f"topics of their own ({topic!r} is also an input or output)"
                )
        return self

    @property
    def verdicts_topic(self) -> str | None:
        """Scaled out, the topic of the decider's verdict records (the sequence topic's name and
        ``.verdicts``): what every other instance's index follows the decider's by."""
        return None if self.sequence_topic is None else verdicts_topic_of(self.sequence_topic)

    @property
    def _transactional_base(self) -> str:
        return self.group_id if self.transactional_id is None else self.transactional_id

    def sequencer_transactional_id(self, topic: str, partition: int) -> str:
        """The transactional id that sequences one input partition: whoever takes the partition over fences
        the instance that had it, however long that one was frozen."""
        return f"{self._transactional_base}.sequencer.{topic}.{partition}"

    def decider(self) -> KafkaSettings:
        """The settings the deciding role of a scaled-out deployment consumes and publishes with: the sequence
        topic as its one input, a group of its own, and one transactional id for the whole deployment, so that
        the instance that gets the sequence partition fences the one that had it."""
        if self.sequence_topic is None:
            raise ValueError("a decider needs kafka.sequence_topic")
        return self.model_copy(
            update={
                "input_topics": [self.sequence_topic],
                "group_id": f"{self.group_id}.decider",
                "transactional_id": f"{self._transactional_base}.decider",
            }
        )

    @property
    def producer_transactional_id(self) -> str:
        """``transactional_id``, or by default the group id plus ``/`` and the instance id when set.

        A producer starting under a transactional id fences every earlier one with that id. Deployments that
        consume as different groups therefore never fence each other, while a restart (or a replacement) of
        the same deployment fences the instance it replaces, however long that one was frozen.
        """
        if self.transactional_id is not None:
            return self.transactional_id
        if self.group_instance_id is None:
            return self.group_id
        return f"{self.group_id}/{self.group_instance_id}"


class Settings(BaseSettings):
    """The whole configuration. Build it with :func:`load_settings`."""

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        env_prefix="STREAMDEDUP_",
        env_nested_delimiter="__",
    )

    fingerprint: FingerprintSettings = FingerprintSettings()
    index: IndexSettings = IndexSettings()
    metrics: MetricsSettings = MetricsSettings()
    logging: LoggingSettings = LoggingSettings()
    dedup: DedupSettings = DedupSettings()
    input: InputSettings = InputSettings()
    kafka: KafkaSettings = KafkaSettings()

    @model_validator(mode="after")
    def _future_within_max_age(self) -> Settings:
        max_age = self.index.max_age_seconds
        if max_age is not None and self.input.max_future_seconds >= max_age:
            raise ValueError(
                f"input.max_future_seconds ({self.input.max_future_seconds:g}) must be less than "
                f"index.max_age_seconds ({max_age:g}): a burst of times clamped that far ahead would expire the index"
            )
        return self

    @model_validator(mode="after")
    def _records_fit_a_sequence_record(self) -> Settings:
        kafka = self.kafka
        # A sequence record carries any input record that is not too large, with room for its coordinates.
        if kafka.sequence_topic is not None and self.input.max_message_bytes + 65_536 > kafka.max_request_bytes:
            raise ValueError(
                f"kafka.max_request_bytes ({kafka.max_request_bytes}) must exceed input.max_message_bytes "
                f"({self.input.max_message_bytes}) by 65536 or more: each input record must fit a sequence record"
            )
        return self

    def decider(self) -> Settings:
        """These settings with ``kafka`` as the deciding role of a scaled-out deployment sees it
        (:meth:`KafkaSettings.decider`)."""
        return self.model_copy(update={"kafka": self.kafka.decider()})

    def detached(self) -> Settings:
        """The same values in a plain ``Settings``, which pickles (for worker processes): the class
        ``load_settings`` makes per file does not, and nothing is read again from files or the environment."""
        return Settings.model_construct(**{name: getattr(self, name) for name in Settings.model_fields})

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment beats the YAML file, which beats the defaults.
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if settings_cls.model_config.get("yaml_file"):
            sources.append(YamlConfigSettingsSource(settings_cls))
        return tuple(sources)


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Read ``path`` (YAML) plus ``STREAMDEDUP_...`` environment overrides; raise ConfigError naming the key."""
    settings_cls: type[Settings] = Settings
    if path is not None:
        if not Path(path).is_file():
            raise ConfigError(f"config file not found: {path}")
        # A subclass per load carries the file, so Settings itself stays free of global state.
        settings_cls = type(
            "Settings", (Settings,), {"model_config": {**Settings.model_config, "yaml_file": Path(path)}}
        )
    try:
        loaded = settings_cls(**overrides)
        # Plain Settings again: a per-load subclass cannot be pickled for the processes that take settings.
        return loaded if settings_cls is Settings else Settings(**loaded.model_dump())
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"])
        allowed = error.get("ctx", {}).get("expected")
        hint = f" (allowed: {allowed})" if allowed else ""
        lines.append(f"{key}: {error['msg']}{hint}" if key else f"{error['msg']}{hint}")
    return "invalid configuration: " + "; ".join(lines)
