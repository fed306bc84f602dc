"""streamdedup: a streaming near-duplicate filter (numpy SimHash, LMDB segment index, Kafka service)."""

from __future__ import annotations

from importlib.metadata import version as _version

from .document_encoder import SimHashDocumentEncoder
from .features import FeatureBatch, FeatureExtractor
from .fingerprint import FingerprintBatch, Fingerprinter, fingerprint_hex, simhash_from_bits
from .minhash import BottomK
from .normalize import Normalizer
from .settings import ConfigError, Settings, load_settings
from .signature import Signatures, Signer, SignerPool

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
    "simhash_from_bits",
]
