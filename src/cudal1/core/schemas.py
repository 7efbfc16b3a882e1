"""JSON Schemas of what cudal1 reads and writes, kept as files in `cudal1/schemas/`:

- `release_row.schema.json`: one row of a release (JSONL in CUDA-L1's schema), checked row by row by the
  release loader (`tasks.sources.load_release`);
- `eval_result.schema.json`: one verdict as `cudal1 eval --json` prints it and the reward server answers it
  (`EvalResult.to_dict()`);
- `server_answers.schema.json`: every answer body of the reward server (a verdict, a batch's verdicts, a
  refusal's `detail`, `/healthz`);
- `kernel_form_spec.schema.json`: a kernel-only candidate's launch spec (`kernel_form.spec.parse_spec` checks it
  further, with one-line errors of its own).

`schema_problems(name, value)` says, one short line per problem, where a value breaks its schema: the field,
what it holds, and what was expected (each property's `title`). Validation is `jsonschema`'s (draft 2020-12).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas"
SCHEMAS = ("release_row", "eval_result", "server_answers", "kernel_form_spec")


@functools.cache
def load_schema(name: str) -> dict[str, Any]:
    """The schema `name` (one of `SCHEMAS`) as a dict."""
    return json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text(encoding="utf-8"))


@functools.cache
def _validator(name: str, definition: str = "") -> Any:
    import jsonschema
    from referencing import Registry, Resource

    registry = Registry().with_resources(
        (f"{other}.schema.json", Resource.from_contents(load_schema(other))) for other in SCHEMAS)
    schema = {"$ref": f"{name}.schema.json#/$defs/{definition}"} if definition else load_schema(name)
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _shown(value: Any, limit: int = 40) -> str:
    """A value as JSON, cut to `limit` characters (a source of kilobytes is named by its length)."""
    if isinstance(value, str) and len(value) > limit:
        return f"a string of {len(value)} characters"
    text = json.dumps(value, default=repr)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def schema_problems(name: str, value: Any, limit: int = 3, *, definition: str = "") -> list[str]:
    """Where `value` breaks the schema `name` (or its `$defs/<definition>`), at most `limit` lines (first fields
    first); [] when it conforms."""
    errors = sorted(_validator(name, definition).iter_errors(value), key=lambda e: [str(p) for p in e.absolute_path])
    out = []
    for error in errors[:limit]:
        where = ".".join(str(p) for p in error.absolute_path)
        if error.validator == "required":
            missing = error.message.split("'")[1] if error.message.count("'") >= 2 else error.message
            out.append(f"{where + '.' if where else ''}{missing} is missing")
            continue
        expected = error.schema.get("title") if isinstance(error.schema, dict) else None
        subject = where or "it"
        out.append(f"{subject} is {_shown(error.instance)}, not {expected}" if expected
                   else f"{subject}: {error.message[:200]}")
    return out


__all__ = ["SCHEMAS", "SCHEMA_DIR", "load_schema", "schema_problems"]
