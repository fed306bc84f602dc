"""streamdedup: a streaming near-duplicate filter (numpy SimHash, LMDB segment index, Kafka service)."""

from __future__ import annotations

from importlib.metadata import version as _version

from .cpu import prefer_avx2_sorting

# numpy reads its dispatch settings once, when it loads: before any module below imports it.
prefer_avx2_sorting()

from .document_encoder import SimHashDocumentEncoder  # noqa: E402
from .features import FeatureBatch, FeatureExtractor  # noqa: E402
from .fingerprint import FingerprintBatch, Fingerprinter, fingerprint_hex, simhash_from_bits  # noqa: E402
from .minhash import BottomK  # noqa: E402
from .normalize import Normalizer  # noqa: E402
from .settings import ConfigError, Settings, load_settings  # noqa: E402
from .signature import Signatures, Signer, SignerPool, signing_id  # noqa: E402

__version__ = _version("streamdedup")

__all__ = [
    "BottomK",
    "ConfigError",
    "FeatureBatch",
    "FeatureExtractor",
    "FingerprintBatch",
    "Fingerprinter",
    "Normalizer",
    "Settings",
    "Signatures",
    "Signer",
    "SignerPool",
    "SimHashDocumentEncoder",
    "__version__",
    "fingerprint_hex",
    "load_settings",
    "signing_id",
    "simhash_from_bits",
]
