"""docs/configuration.md is generated from the dataclass configs and must stay current."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

from cudal1.config_docs import CONFIGS, render_reference

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_reference_is_current():
    assert DOC.read_text() == render_reference(), "regenerate: python -m cudal1.config_docs > docs/configuration.md"


def test_every_field_has_help():
    missing = []
    for _, target in CONFIGS:
        module, name = target.split(":")
        cls = getattr(importlib.import_module(module), name)
        missing += [f"{name}.{f.name}" for f in dataclasses.fields(cls) if not f.metadata.get("help")]
    assert not missing, missing
