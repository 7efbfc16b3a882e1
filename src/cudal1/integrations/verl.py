"""verl integration: a custom reward function that calls the reward server, and the parquet data verl reads.

Reward (in verl's config):
    custom_reward_function:
      path: <site-packages>/cudal1/integrations/verl.py    # or `python -c "import cudal1.integrations.verl as m; print(m.__file__)"`
      name: compute_score_batch                             # with reward_model.reward_manager=batch
      # name: compute_score                                 # with the default (naive) manager: one call per sample

The functions read the server's address and token from `CUDAL1_REWARD_URL` and `CUDAL1_SERVER_TOKEN` in
the environment of verl's reward workers. Convention: `ground_truth` is the cudal1 task id (the server
resolves it through its task sources); `extra_info["reference_source"]`, when present, carries the
reference module for tasks the server does not know. The score (`cudal1.core.rewards.reward_of`) is the
speedup for CORRECT with a finite positive speedup and 0.0 otherwise (unparseable completions are not
sent). If the server cannot be reached after the client's retries, the call raises instead of returning 0:
silent zero rewards would train the policy on nothing.

Data: `export_verl_parquet(rows, path)` writes the columns verl's RL dataset expects: `data_source`,
`prompt` (chat messages), `ability`, `reward_model` ({"style": "rule", "ground_truth": task id}) and
`extra_info` ({"task_id", "index", "split"}); `rows_from_tasks` builds rows with the plain prompt or any
prompt function (e.g. a contrastive prompt with exemplars).

Limits: the naive manager calls `compute_score` once per sample, serially; use the batch manager (or
verl's parallel managers) so that a batch of rollouts is evaluated in parallel on the server's GPUs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from cudal1.core.errors import MissingDependencyError
from cudal1.core.rewards import reward_of
from cudal1.core.types import EvalResult
from cudal1.integrations.common import completion_text
from cudal1.llm.extract import extract_completion
from cudal1.llm.prompts import build_plain_prompt
from cudal1.service.client import RewardClient

logger = logging.getLogger(__name__)

DATA_SOURCE = "cudal1"
ABILITY = "cuda_optimization"

_client_lock = threading.Lock()
_client: Any = None


def reward_client() -> Any:
    """The process-wide `RewardClient` built from the environment (created on first use)."""
    global _client
    with _client_lock:
        if _client is None:
            _client = RewardClient.from_env()
        return _client


def _task_and_reference(ground_truth: Any, extra_info: dict[str, Any] | None) -> tuple[str, str | None]:
    info = extra_info or {}
    task_id = ground_truth if isinstance(ground_truth, str) and ground_truth else info.get("task_id")
    if not task_id:
        raise ValueError("ground_truth must hold the cudal1 task id (or extra_info['task_id'])")
    return str(task_id), info.get("reference_source")


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None,
                  **kwargs: Any) -> float:
    """verl's per-sample reward: the speedup of the completion's code for the task in `ground_truth`."""
    return compute_score_batch([data_source], [solution_str], [ground_truth], [extra_info])[0]


def compute_score_batch(data_sources: Sequence[str], solution_strs: Sequence[str], ground_truths: Sequence[Any],
                        extra_infos: Sequence[dict[str, Any] | None] | None = None, *, client: Any = None,
                        **kwargs: Any) -> list[float]:
    """verl's batch reward (`reward_model.reward_manager=batch`): all samples in parallel on the server."""
    infos = list(extra_infos) if extra_infos is not None else [None] * len(solution_strs)
    verdicts: list[EvalResult | None] = [None] * len(solution_strs)
    items: list[tuple[int, dict[str, Any]]] = []
    for i, (solution, truth, info) in enumerate(zip(solution_strs, ground_truths, infos, strict=True)):
        task_id, reference = _task_and_reference(truth, info)
        extraction = extract_completion(completion_text(solution))
        if extraction.code is None:
            verdicts[i] = EvalResult.unparseable(task_id, extraction.error)
            continue
        item = {"task_id": task_id, "source": extraction.code, "label": "verl"}
        if reference:
            item["reference_source"] = reference
        items.append((i, item))
    if items:
        results = (client or reward_client()).evaluate_many([item for _, item in items])
        for (i, _), result in zip(items, results, strict=True):
            verdicts[i] = result
    return [float(reward_of(v) or 0.0) for v in verdicts if v is not None]


def rows_from_tasks(tasks: Iterable[Any], prompt_fn: Callable[[Any], list[dict[str, str]]] | None = None, *,
                    split: str = "train", data_source: str = DATA_SOURCE,
                    include_reference: bool = False) -> list[dict[str, Any]]:
    """One verl row per task; `prompt_fn(task) -> messages` defaults to cudal1's plain prompt."""
    if prompt_fn is None:
        def prompt_fn(task: Any) -> list[dict[str, str]]:
            return build_plain_prompt(task.source)

    rows = []
    for index, task in enumerate(tasks):
        row = {"task_id": task.id, "prompt": prompt_fn(task), "index": index, "split": split,
               "data_source": data_source}
        if include_reference:
            row["reference_source"] = task.source
        rows.append(row)
    return rows


def verl_record(row: dict[str, Any]) -> dict[str, Any]:
    """A row in verl's schema from {"task_id", "prompt", optional "index", "split", "data_source", ...}."""
    prompt = row["prompt"]
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    extra = {"task_id": row["task_id"], "index": int(row.get("index", 0)), "split": row.get("split", "train")}
    if row.get("reference_source"):
        extra["reference_source"] = row["reference_source"]
    return {"data_source": row.get("data_source", DATA_SOURCE),
            "prompt": [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt],
            "ability": row.get("ability", ABILITY),
            "reward_model": {"style": "rule", "ground_truth": row["task_id"]},
            "extra_info": extra}


def export_verl_parquet(rows: Iterable[dict[str, Any]], path: str | Path) -> Path:
    """Write rows (see `verl_record`) as a parquet file verl's RL dataset reads; returns the path."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingDependencyError("pyarrow", "dist", "writing verl parquet files") from None
    records = [verl_record(r) for r in rows]
    if not records:
        raise ValueError("no rows to export")
    keys = sorted({k for r in records for k in r["extra_info"]})
    for r in records:  # one struct type for every row
        r["extra_info"] = {k: r["extra_info"].get(k) for k in keys}
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), out)
    logger.info("wrote %d verl rows to %s", len(records), out)
    return out
