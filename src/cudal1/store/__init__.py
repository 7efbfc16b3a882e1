"""The results store: one SQLite file that every measured thing lands in (see `sqlite_store`).

    from cudal1.store import ResultsStore, default_store_path

    with ResultsStore() as store:              # $CUDAL1_STORE or <user data dir>/cudal1/results.sqlite
        task_hash = store.put_task("level1/1_matmul", ref_source)
        cand_hash = store.put_candidate(candidate_source, task_id="level1/1_matmul")
        key, hit = store.lookup(task_hash, cand_hash, protocol, environment)
        if hit is None:
            store.put_evaluation(evaluate(...), task_hash=task_hash, key=key)
"""

from cudal1.store.connection import (
    ENV_STORE_PATH,
    StoreError,
    default_store_path,
    retry_on_lock,
    write_transaction,
)
from cudal1.store.keys import EVAL_KEY_ENV_FIELDS, environment_key, eval_key, source_hash
from cudal1.store.schema import target_version
from cudal1.store.sqlite_store import ResultsStore

__all__ = [
    "ENV_STORE_PATH",
    "EVAL_KEY_ENV_FIELDS",
    "ResultsStore",
    "StoreError",
    "default_store_path",
    "environment_key",
    "eval_key",
    "retry_on_lock",
    "source_hash",
    "target_version",
    "write_transaction",
]
