"""Settings: validated once at the edge (YAML file + ``STREAMDEDUP_...`` environment), immutable afterwards.

Every section is a frozen pydantic model; the defaults here are the defaults of ``config.yaml`` (a test
holds the two together). Environment variables override the file with ``__`` between nested keys, e.g.
``STREAMDEDUP_KAFKA__BOOTSTRAP_SERVERS=broker:9092``. Secrets are ``SecretStr`` and print masked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

__all__ = [
    "ConfigError",
    "FeatureSettings",
    "FingerprintSettings",
    "IndexSettings",
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


class FingerprintSettings(Section):
    width: int = 64
    hash: Literal["fast", "md5", "shake256"] = "fast"
    seed: int = Field(default=0, ge=0, lt=2**63)
    max_text_chars: int = Field(default=1_000_000, ge=1)
    normalize: NormalizeSettings = NormalizeSettings()
    features: FeatureSettings = FeatureSettings()

    @field_validator("width")
    @classmethod
    def _width_multiple_of_64(cls, width: int) -> int:
        if width < 64 or width % 64:
            raise ValueError(f"width must be a positive multiple of 64 (64, 128, 256, ...), got {width}")
        return width


class IndexSettings(Section):
    path: Path = Path("var/index")
    radius: int = Field(default=3, ge=0)
    expected_entries: int = Field(default=10_000_000, ge=1)
    max_age_seconds: float | None = Field(default=7 * 24 * 3600.0, gt=0)
    max_entries: int | None = Field(default=50_000_000, ge=1)


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
        settings_cls = type("Settings", (Settings,), {"model_config": {**Settings.model_config, "yaml_file": Path(path)}})
    try:
        return settings_cls(**overrides)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"])
        allowed = error.get("ctx", {}).get("expected")
        hint = f" (allowed: {allowed})" if allowed else ""
        lines.append(f"{key}: {error['msg']}{hint}")
    return "invalid configuration: " + "; ".join(lines)
