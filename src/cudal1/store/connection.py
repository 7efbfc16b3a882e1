"""Where the results store lives and how to open it safely: path checks, configured connections, locking.

Every connection this module hands out is configured the same way: WAL journal (readers never block the
writer, a killed process never corrupts the file), `synchronous=NORMAL` (durable against a killed process,
not against power loss, which is the usual WAL trade-off), a 60 s busy timeout, and autocommit mode
(`isolation_level=None`) so that transactions are explicit. Writers use `write_transaction`, which takes
the write lock up front with `BEGIN IMMEDIATE` (so a transaction never has to upgrade a read lock, the
case SQLite cannot wait on) and retries when the lock stays busy longer than the timeout.

Limits: SQLite over a network file system (NFS, Lustre) does not give WAL's guarantees; several machines
should share a server database instead (not implemented here). A connection must not be carried across
`fork()`; `ResultsStore` opens fresh ones in a child process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from cudal1.core.errors import Cudal1Error

logger = logging.getLogger(__name__)

ENV_STORE_PATH = "CUDAL1_STORE"  # deployment override of the default store path
STORE_FILE_NAME = "results.sqlite"

# Rationale: long enough that a writer waiting behind a slow batch commit never gives up, short enough that
# a wedged process surfaces as an error within a minute.
BUSY_TIMEOUT_S = 60.0
# Rationale: if the busy handler itself gives up (timeout, or SQLITE_BUSY returned without waiting, as during
# WAL recovery), retry the whole step a few times with a jittered back-off before failing loudly.
LOCK_RETRY_ATTEMPTS = 8
LOCK_RETRY_BASE_DELAY_S = 0.05

_SQLITE_HEADER = b"SQLite format 3\x00"
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6

T = TypeVar("T")


class StoreError(Cudal1Error):
    """The results store cannot be opened or used (bad path, not a database, newer schema, stuck lock)."""


def default_store_path() -> Path:
    """Return the store path: `$CUDAL1_STORE` if set, else `<user data dir>/cudal1/results.sqlite`."""
    override = os.environ.get(ENV_STORE_PATH, "").strip()
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("cudal1")) / STORE_FILE_NAME


def resolve_store_path(path: str | os.PathLike[str] | None) -> Path:
    """Resolve and check a store path; create its parent directory. Raises `StoreError` for unusable paths.

    A missing file is fine (it is created on first use). An existing file must be readable, writable and
    either empty or an SQLite database; it is never overwritten.
    """
    resolved = default_store_path() if path is None else Path(path).expanduser()
    if resolved.is_dir():
        raise StoreError(f"results store path is a directory, not a file: {resolved}")
    if resolved.exists():
        _check_existing_file(resolved)
        return resolved
    try:
        resolved.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create the directory for the results store {resolved}: "
                         f"{exc.strerror or exc}") from exc
    return resolved


def _check_existing_file(path: Path) -> None:
    if not os.access(path, os.R_OK | os.W_OK):
        raise StoreError(f"results store is not readable and writable: {path}")
    try:
        with open(path, "rb") as fh:
            header = fh.read(len(_SQLITE_HEADER))
    except OSError as exc:
        raise StoreError(f"cannot read the results store {path}: {exc.strerror or exc}") from exc
    if header and header != _SQLITE_HEADER:
        raise StoreError(f"not an SQLite database (left untouched): {path}")


def is_lock_error(exc: BaseException) -> bool:
    """True when an sqlite3 error means 'busy/locked' (worth retrying), not a real failure."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)  # Python >= 3.11
    if code is not None:
        return (code & 0xFF) in (_SQLITE_BUSY, _SQLITE_LOCKED)
    text = str(exc).lower()  # Python 3.10 fallback: no error code on the exception
    return "locked" in text or "busy" in text


def retry_on_lock(fn: Callable[[], T], *, what: str = "results store operation") -> T:
    """Call `fn` and retry it with jittered back-off while it fails with 'database is locked/busy'.

    `fn` must be safe to repeat (a read, or a whole transaction that rolled back). Raises `StoreError`
    after `LOCK_RETRY_ATTEMPTS` attempts.
    """
    for attempt in range(LOCK_RETRY_ATTEMPTS):
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            if not is_lock_error(exc):
                raise
            delay_s = LOCK_RETRY_BASE_DELAY_S * (2**attempt) * (0.5 + random.random())
            logger.debug("%s: %s; retry %d in %.3f s", what, exc, attempt + 1, delay_s)
            time.sleep(delay_s)
    raise StoreError(f"{what}: database stayed locked after {LOCK_RETRY_ATTEMPTS} attempts")


def open_connection(path: Path, *, check_same_thread: bool = True) -> sqlite3.Connection:
    """Open a configured connection (WAL, synchronous=NORMAL, busy timeout, autocommit) to `path`.

    The path should come from `resolve_store_path`. Raises `StoreError` if the file is not a database or
    cannot be opened.
    """
    try:
        conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None,
                               check_same_thread=check_same_thread)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open the results store {path}: {exc}") from exc
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        mode = retry_on_lock(lambda: conn.execute("PRAGMA journal_mode = WAL").fetchone()[0],
                             what=f"enabling WAL on {path}")
        if str(mode).lower() != "wal":
            logger.warning("results store %s runs in journal mode %r, not WAL", path, mode)
        conn.execute("PRAGMA synchronous = NORMAL")
    except sqlite3.DatabaseError as exc:
        conn.close()
        if is_lock_error(exc):
            raise StoreError(f"results store {path} is locked: {exc}") from exc
        raise StoreError(f"not a usable SQLite database: {path} ({exc})") from exc
    except StoreError:
        conn.close()
        raise
    return conn


@contextlib.contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """Run the body in one short `BEGIN IMMEDIATE` transaction: commit on success, roll back on error.

    Taking the write lock at `BEGIN` means the statements inside never meet a busy lock, so only `BEGIN`
    needs retrying (done here). Keep the body short: other processes wait while it runs.
    The connection must be in autocommit mode (as `open_connection` makes it) and not inside a transaction.
    """
    retry_on_lock(lambda: conn.execute("BEGIN IMMEDIATE"), what="starting a write transaction")
    try:
        yield conn
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    try:
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
