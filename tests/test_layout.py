"""tests/ mirrors the package: every test folder names a package of cudal1, and every package has tests."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "cudal1"
NOT_PACKAGES = {"fixtures", "helpers", "__pycache__"}  # test data and shared test utilities
WITHOUT_TESTS = {"configs", "experimental", "__pycache__"}  # YAML data; the unstable-ideas area


def test_test_folders_mirror_packages():
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir()} - NOT_PACKAGES
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir()}
    assert folders <= packages, f"test folders without a package: {sorted(folders - packages)}"


def test_every_package_has_tests():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir()} - WITHOUT_TESTS
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir()}
    assert packages <= folders, f"packages without tests: {sorted(packages - folders)}"


def test_tests_stay_outside_the_installed_package():
    assert not list(PACKAGE.rglob("test_*.py"))
