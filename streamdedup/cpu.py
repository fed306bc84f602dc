"""The processor numpy runs on, where it decides streamdedup's speed: AVX-512 sorting on AMD Zen 4.

numpy sorts 32- and 64-bit keys with x86-simd-sort's AVX-512 kernels wherever the processor has AVX-512.
Those kernels write through ``vpcompress`` with a memory destination, which AMD Zen 4 (family 19h, the
first AMD cores with AVX-512) runs in microcode: there ``np.sort`` is about four times slower than with
numpy's AVX2 kernels (numpy/x86-simd-sort#6, numpy/numpy#32690; Zen 5 reportedly runs them at full speed).
Fingerprinting, index merges and lookups all sort whole batches, so on Zen 4 streamdedup asks numpy to
dispatch to AVX2. numpy reads that request once, when it loads, so it is made before anything imports
numpy, and a user's own ``NPY_DISABLE_CPU_FEATURES`` or ``NPY_ENABLE_CPU_FEATURES`` (even empty) is left as
it is.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Container, MutableMapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

__all__ = ["AVX512_TARGETS", "is_zen4", "prefer_avx2_sorting"]

# numpy's AVX-512 dispatch targets as numpy 2.4 names them (earlier versions had other names, and numpy
# rejects the whole setting for one name it does not dispatch on).
AVX512_TARGETS = "X86_V4 AVX512_ICL AVX512_SPR"
_TARGETS_NAMED_SINCE = (2, 4)

_NUMPY_SWITCHES = ("NPY_DISABLE_CPU_FEATURES", "NPY_ENABLE_CPU_FEATURES")
_ZEN_3_AND_4_FAMILY = "25"


def is_zen4(cpuinfo: str) -> bool:
    """Whether ``/proc/cpuinfo`` text describes AMD Zen 4: family 19h (Zen 3 and Zen 4) with AVX-512."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break  # the first processor speaks for all of them
        name, _, value = line.partition(":")
        fields[name.strip()] = value.strip()
    return (
        fields.get("vendor_id") == "AuthenticAMD"
        and fields.get("cpu family") == _ZEN_3_AND_4_FAMILY
        and "avx512f" in fields.get("flags", "").split()
    )


def prefer_avx2_sorting(
    cpuinfo_path: Path = Path("/proc/cpuinfo"),
    environ: MutableMapping[str, str] = os.environ,
    loaded_modules: Container[str] = sys.modules,
) -> bool:
    """On Zen 4, have numpy dispatch to AVX2 rather than AVX-512; True when the request was made."""
    if "numpy" in loaded_modules or any(switch in environ for switch in _NUMPY_SWITCHES):
        return False
    if _numpy_version() < _TARGETS_NAMED_SINCE:
        return False
    try:
        cpuinfo = cpuinfo_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False  # not Linux, or no procfs: numpy keeps its own choice
    if not is_zen4(cpuinfo):
        return False
    environ["NPY_DISABLE_CPU_FEATURES"] = AVX512_TARGETS
    return True


def _numpy_version() -> tuple[int, int]:
    """numpy's installed (major, minor), read from its metadata without loading it."""
    try:
        major, minor, *_ = version("numpy").split(".")
        return int(major), int(minor)
    except (PackageNotFoundError, ValueError):
        return (0, 0)
