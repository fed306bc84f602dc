"""Zen 4's AVX-512 sorting: detection from /proc/cpuinfo, the request to numpy, and numpy honouring it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamdedup import cpu
from streamdedup.cpu import AVX512_TARGETS, is_zen4, prefer_avx2_sorting


def _cpuinfo(vendor: str, family: int, flags: str) -> str:
    block = f"processor\t: {{n}}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: 17\nflags\t\t: {flags}\n"
    return "\n".join(block.format(n=n) for n in range(2))


ZEN4 = _cpuinfo("AuthenticAMD", 25, "fpu sse2 avx2 avx512f avx512dq avx512bw")
ZEN3 = _cpuinfo("AuthenticAMD", 25, "fpu sse2 avx2 bmi2")
ZEN5 = _cpuinfo("AuthenticAMD", 26, "fpu sse2 avx2 avx512f avx512dq avx512bw")
ICE_LAKE = _cpuinfo("GenuineIntel", 6, "fpu sse2 avx2 avx512f avx512dq avx512bw")


@pytest.mark.parametrize(
    ("cpuinfo", "expected"), [(ZEN4, True), (ZEN3, False), (ZEN5, False), (ICE_LAKE, False), ("", False)]
)
def test_only_amd_family_19h_with_avx512_is_zen4(cpuinfo: str, expected: bool) -> None:
    assert is_zen4(cpuinfo) is expected


@pytest.fixture(autouse=True)
def numpy_2_4(monkeypatch: pytest.MonkeyPatch) -> None:
    """The unit tests below hold for the numpy whose target names the module uses, whatever is installed."""
    monkeypatch.setattr(cpu, "_numpy_version", lambda: (2, 4))


def test_on_zen4_numpy_is_asked_to_leave_its_avx512_targets(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(ZEN4)
    environ = {"PATH": "/usr/bin"}
    assert prefer_avx2_sorting(cpuinfo, environ, loaded_modules=set()) is True
    assert environ == {"PATH": "/usr/bin", "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR"}


@pytest.mark.parametrize(
    ("cpuinfo_text", "environ", "loaded"),
    [
        (ICE_LAKE, {}, set()),
        (ZEN5, {}, set()),
        (ZEN4, {"NPY_DISABLE_CPU_FEATURES": ""}, set()),
        (ZEN4, {"NPY_ENABLE_CPU_FEATURES": "X86_V3"}, set()),
        (ZEN4, {}, {"numpy"}),
    ],
    ids=["intel", "zen5", "user-disabled-nothing", "user-enabled", "numpy-already-loaded"],
)
def test_elsewhere_nothing_is_asked(
    tmp_path: Path, cpuinfo_text: str, environ: dict[str, str], loaded: set[str]
) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(cpuinfo_text)
    before = dict(environ)
    assert prefer_avx2_sorting(cpuinfo, environ, loaded_modules=loaded) is False
    assert environ == before


def test_a_numpy_naming_its_targets_otherwise_is_not_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(ZEN4)
    monkeypatch.setattr(cpu, "_numpy_version", lambda: (2, 3))
    environ: dict[str, str] = {}
    assert prefer_avx2_sorting(cpuinfo, environ, loaded_modules=set()) is False
    assert environ == {}


def test_without_procfs_nothing_is_asked(tmp_path: Path) -> None:
    environ: dict[str, str] = {}
    assert prefer_avx2_sorting(tmp_path / "absent", environ, loaded_modules=set()) is False
    assert environ == {}


def _numpy_in_fresh_interpreter(environ: dict[str, str]) -> list[str]:
    probe = (
        "import os, streamdedup\n"
        "from numpy._core._multiarray_umath import __cpu_features__ as features\n"
        "print(os.environ.get('NPY_DISABLE_CPU_FEATURES'))\n"
        "print(features['X86_V4'])\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], env=environ, capture_output=True, text=True, check=True)
    return result.stdout.splitlines()


def test_importing_streamdedup_takes_effect_in_numpy() -> None:
    """On this very machine: a Zen 4 gets numpy without its AVX-512 targets, anything else is untouched."""
    environ = {key: value for key, value in os.environ.items() if not key.startswith("NPY_")}
    request, x86_v4 = _numpy_in_fresh_interpreter(environ)
    if is_zen4(Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""):
        assert (request, x86_v4) == (AVX512_TARGETS, "False")
    else:
        assert request == "None"


def test_a_user_setting_wins() -> None:
    environ = {key: value for key, value in os.environ.items() if not key.startswith("NPY_")}
    environ["NPY_DISABLE_CPU_FEATURES"] = ""
    request, _ = _numpy_in_fresh_interpreter(environ)
    assert request == ""
