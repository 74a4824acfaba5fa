"""Packaging: the wheel ships the case tiers and declares what the package imports.

Source: issue 13 item 6 (matplotlib in the base install, tomli where needed, tiers as package data
found through importlib.resources). Builds the wheel from this tree without network access.
"""

from __future__ import annotations

import email
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import harness.cases as C

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    try:
        import setuptools  # noqa: F401
    except ImportError:  # pragma: no cover - setuptools is the build backend
        pytest.skip("setuptools is not installed; the wheel cannot be built offline")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--no-cache-dir", "-w", str(out), str(ROOT)], check=True, capture_output=True, timeout=300)
    (path,) = out.glob("numerics_harness-*.whl")
    return zipfile.ZipFile(path)


def test_wheel_ships_every_tier_and_the_kernels(wheel):
    names = set(wheel.namelist())
    for tier, file in C.TIERS.items():
        assert f"cases/{file}" in names, tier
    assert "cases/__init__.py" in names and "cases/README.md" in names
    cu = {p.name for p in (ROOT / "native" / "cuda").iterdir()}
    assert {f"native/cuda/{n}" for n in cu} <= names


def test_wheel_requires_what_the_package_imports(wheel):
    (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    msg = email.message_from_bytes(wheel.read(meta))
    requires = msg.get_all("Requires-Dist")
    base = sorted(r for r in requires if "extra ==" not in r)
    assert base == ["jinja2", "matplotlib", "numpy", "pandas", "pebble", "pytest", "pytest-timeout", "tomli; python_version < \"3.11\"",
                    "torch"]
    extras = {r.split(";")[0].strip() for r in requires if "extra ==" in r}
    assert "pytest-xdist" in extras and "cupy-cuda13x" in extras


def test_tiers_are_found_through_the_cases_package():
    import cases

    assert C.CASES_DIR == Path(cases.__file__).resolve().parent
    for tier, file in C.TIERS.items():
        assert C.resolve(tier) == C.CASES_DIR / file
        assert C.resolve(tier).is_file()
