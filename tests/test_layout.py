"""tests/ mirrors the package: every test folder names a package of cudal1, and every package has tests;
`tests/experimental/` mirrors `experimental/` (research code beside the library) the same way."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "cudal1"
EXPERIMENTAL = ROOT / "experimental"
NOT_PACKAGES = {"fixtures", "helpers", "experimental", "__pycache__"}  # test data, test utilities, see below
WITHOUT_TESTS = {"configs", "__pycache__"}  # YAML data


def test_test_folders_mirror_packages():
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir()} - NOT_PACKAGES
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir()}
    assert folders <= packages, f"test folders without a package: {sorted(folders - packages)}"


def test_every_package_has_tests():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir()} - WITHOUT_TESTS
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir()}
    assert packages <= folders, f"packages without tests: {sorted(packages - folders)}"


def test_experimental_tests_mirror_experimental_packages():
    folders = {p.name for p in (ROOT / "tests" / "experimental").iterdir() if p.is_dir()} - {"__pycache__"}
    packages = {p.name for p in EXPERIMENTAL.iterdir() if (p / "__init__.py").exists()}
    assert folders == packages, (sorted(folders), sorted(packages))


def test_tests_stay_outside_the_installed_package():
    assert not list(PACKAGE.rglob("test_*.py"))
