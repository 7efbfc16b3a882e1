"""Content hashes that key the results store: sources, evaluation cache keys and baseline environments.

An evaluation is reused instead of re-run when its key matches. The key covers exactly:
- the task source hash (sha256 of the reference module's text, byte for byte),
- the candidate source hash (sha256 of the candidate's text),
- the whole protocol dict, as canonical JSON (sorted keys, no whitespace; `1` and `1.0` differ),
- the environment fields in `EVAL_KEY_ENV_FIELDS`: `gpu_name`, `torch_version`, `cuda_version`,
  `device_type` (a missing field counts as `null`). Other environment entries (host name, driver version,
  clocks) are recorded in the result but do not change the key.

Limits: sources are hashed as given, so a whitespace change is a different candidate; callers that want to
share results across formatting must normalize first. Values that JSON cannot encode are converted with
`canonical_json`'s rules (enums -> value, paths -> str, dataclasses -> dict, sets -> sorted list).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from pathlib import PurePath
from typing import Any

# Rationale: these are the parts of the machine that change a kernel's speed or numerics; anything else
# (host name, PID, timestamps) would make every run a cache miss.
EVAL_KEY_ENV_FIELDS: tuple[str, ...] = ("gpu_name", "torch_version", "cuda_version", "device_type")

# Bump when the key recipe changes, so old rows stop matching instead of matching wrongly.
EVAL_KEY_VERSION = 1


def source_hash(source: str) -> str:
    """Return the sha256 hex digest of a source text (UTF-8)."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def _json_default(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, PurePath):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def canonical_json(value: Any) -> str:
    """Encode `value` as canonical JSON (sorted keys, compact separators, ASCII) for hashing and storage."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=_json_default)


def to_json(value: Any) -> str:
    """Encode `value` as JSON for a stored column, with the same conversions as `canonical_json`."""
    return json.dumps(value, sort_keys=True, default=_json_default)


def key_environment(environment: dict[str, Any]) -> dict[str, Any]:
    """Return only the environment fields that enter cache keys (missing ones as None)."""
    return {name: environment.get(name) for name in EVAL_KEY_ENV_FIELDS}


def environment_key(environment: dict[str, Any]) -> str:
    """Hash of the key environment fields: the `environment_key` under which baselines are cached."""
    payload = {"v": EVAL_KEY_VERSION, "environment": key_environment(environment)}
    return hashlib.sha256(canonical_json(payload).encode("ascii")).hexdigest()


def eval_key(task_hash: str, candidate_hash: str, protocol: dict[str, Any], environment: dict[str, Any]) -> str:
    """Stable cache key of one evaluation; see the module docstring for exactly what it covers."""
    payload = {
        "v": EVAL_KEY_VERSION,
        "task_hash": task_hash,
        "candidate_hash": candidate_hash,
        "protocol": protocol,
        "environment": key_environment(environment),
    }
    return hashlib.sha256(canonical_json(payload).encode("ascii")).hexdigest()
