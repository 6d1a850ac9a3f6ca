"""The run store: one SQLite file holding runs, per-check status, findings and evidence.

Each finished check is committed in one transaction with its findings and artifacts, so a run
killed at any point (even ``kill -9``) loses at most the check that was running, and
``validate --resume RUN`` recomputes only that one. WAL journaling keeps readers (``mmchaos
runs``) from blocking a run in progress.

A store given by the user may be anything: before a single byte is written the file is opened
read-only, checked to be a mmchaos store (not some other application's SQLite file) and checked
for corruption. Readers (``runs``, ``report``) open it read-only all the way (``mode=ro``), so they
work on a store they may not write and never change one.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmchaos.errors import StoreError
from mmchaos.findings import Artifact, Finding

__all__ = ["CheckRecord", "RunRecord", "RunStore"]

SCHEMA_VERSION = 1
_TABLES = frozenset({"meta", "runs", "checks", "findings", "artifacts"})
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    finished REAL,
    status TEXT NOT NULL,
    target_uri TEXT NOT NULL,
    suite_name TEXT NOT NULL,
    config TEXT NOT NULL,
    target TEXT NOT NULL DEFAULT '{}',
    dataset TEXT NOT NULL DEFAULT '{}',
    environment TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS checks (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    check_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    status TEXT NOT NULL,
    started REAL,
    finished REAL,
    wall_seconds REAL,
    model_seconds REAL,
    model_calls INTEGER,
    PRIMARY KEY (run_id, check_id)
);
CREATE TABLE IF NOT EXISTS findings (
    run_id TEXT NOT NULL,
    check_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (run_id, check_id, idx)
);
CREATE TABLE IF NOT EXISTS units (
    run_id TEXT NOT NULL,
    check_id TEXT NOT NULL,
    key TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (run_id, check_id, key)
);
CREATE TABLE IF NOT EXISTS artifacts (
    run_id TEXT NOT NULL,
    name TEXT NOT NULL,
    media_type TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (run_id, name)
);
"""


@dataclass
class CheckRecord:
    check_id: str
    position: int
    status: str
    wall_seconds: float = 0.0
    model_seconds: float = 0.0
    model_calls: int = 0


@dataclass
class RunRecord:
    run_id: str
    created: float
    finished: float | None
    status: str
    target_uri: str
    suite_name: str
    config: dict[str, Any]
    target: dict[str, Any] = field(default_factory=dict)
    dataset: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def _ro_uri(path: Path, *, immutable: bool = False) -> str:
    quoted = urllib.parse.quote(str(path.resolve()))
    return f"file:{quoted}?mode=ro" + ("&immutable=1" if immutable else "")


def _connect_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection that creates nothing next to the file.

    A WAL database opened ``mode=ro`` still creates ``-wal`` and ``-shm`` files. When no ``-wal``
    file exists nobody is writing and every change is in the main file, so it is read as
    immutable; while a run writes (its ``-wal`` exists) a plain read-only connection sees it.
    """
    with path.open("rb") as f:
        header = f.read(100)
    is_wal = len(header) == 100 and header[18] == 2
    wal_idle = is_wal and not path.with_name(path.name + "-wal").exists()
    db = sqlite3.connect(_ro_uri(path, immutable=wal_idle), uri=True, timeout=30.0, isolation_level=None)
    try:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return db
    except sqlite3.OperationalError:  # a -wal we may not read alongside: read the main file as it is
        db.close()
        return sqlite3.connect(_ro_uri(path, immutable=True), uri=True, timeout=30.0, isolation_level=None)


def _verify(db: sqlite3.Connection, path: Path) -> None:
    """Refuse a file that is not a mmchaos store of this schema, or that is corrupted (reads only)."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not tables >= _TABLES:
        found = ", ".join(sorted(tables)) or "no tables"
        raise StoreError(
            f"{path} is not a mmchaos run store (it has {found}); give a store written by mmchaos, "
            "or a new file, to --store",
            code="store_foreign",
        )
    row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    if row is None or row[0] != str(SCHEMA_VERSION):
        version = "none" if row is None else row[0]
        raise StoreError(
            f"{path}: store schema {version} is not {SCHEMA_VERSION}; use another --store", code="store_foreign"
        )
    problems = [r[0] for r in db.execute("PRAGMA quick_check(5)")]
    if problems != ["ok"]:
        raise StoreError(
            f"{path} is corrupted ({' '.join(problems).replace(chr(10), '; ')[:300]}); it was left as it is",
            code="store_corrupt",
        )


class RunStore:
    """A handle on the SQLite run store at ``path``.

    ``read_only=False`` (a run) creates the store and its folder when missing; ``read_only=True``
    (listing, re-rendering) needs an existing store and never writes to it. Either way a file that
    is not a mmchaos store, or is corrupted, is refused with a :class:`StoreError` and left untouched.
    """

    def __init__(self, path: Path | str, *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        try:
            self._db = self._open_read_only() if read_only else self._open_for_writing()
        except sqlite3.DatabaseError as exc:
            code = "store_corrupt" if "malformed" in str(exc) or "not a database" in str(exc) else "store_error"
            raise StoreError(f"cannot open run store {self.path}: {exc}", code=code) from exc

    def _open_read_only(self) -> sqlite3.Connection:
        if not self.path.is_file():
            what = "a folder" if self.path.is_dir() else "missing"
            raise StoreError(f"no run store at {self.path} ({what})", code="store_missing")
        if not os.access(self.path, os.R_OK):
            raise StoreError(f"cannot read run store {self.path}: permission denied", code="store_unreadable")
        db = _connect_read_only(self.path)
        try:
            _verify(db, self.path)
        except BaseException:
            db.close()
            raise
        return db

    def _open_for_writing(self) -> sqlite3.Connection:
        if self.path.is_dir():
            raise StoreError(f"--store {self.path} is a folder; give a file path", code="store_unusable")
        if self.path.is_file() and self.path.stat().st_size > 0:
            # Check what the file is before writing anything to it.
            self._open_read_only().close()
            if not os.access(self.path, os.W_OK):
                raise StoreError(
                    f"run store {self.path} is read-only; a run must write to it (use another --store)",
                    code="store_read_only",
                )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot create the folder of --store {self.path}: {exc.strerror or exc}", code="store_unusable"
            ) from exc
        if not os.access(self.path.parent, os.W_OK):
            raise StoreError(
                f"cannot write in {self.path.parent} (the run store and its journal live there)",
                code="store_read_only",
            )
        db = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
            row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        except BaseException:
            db.close()
            raise
        return db

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        if self.read_only:
            raise StoreError(f"run store {self.path} was opened read-only", code="store_read_only")
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # runs ------------------------------------------------------------------------------------
    def create_run(self, record: RunRecord, check_ids: list[str]) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    record.run_id,
                    record.created,
                    record.finished,
                    record.status,
                    record.target_uri,
                    record.suite_name,
                    json.dumps(record.config),
                    json.dumps(record.target),
                    json.dumps(record.dataset),
                    json.dumps(record.environment),
                ),
            )
            db.executemany(
                "INSERT INTO checks (run_id, check_id, position, status) VALUES (?,?,?,'pending')",
                [(record.run_id, cid, i) for i, cid in enumerate(check_ids)],
            )

    def update_run(self, run_id: str, **fields: Any) -> None:
        allowed = {"status", "finished", "target", "dataset", "environment"}
        if not fields or set(fields) - allowed:
            raise ValueError(f"can only update {allowed}")
        values = [json.dumps(v) if isinstance(v, dict) else v for v in fields.values()]
        sets = ", ".join(f"{k}=?" for k in fields)
        with self._tx() as db:
            db.execute(f"UPDATE runs SET {sets} WHERE run_id=?", (*values, run_id))

    def resolve(self, ref: str) -> str:
        """A run id from a full id, a unique prefix, or ``latest``."""
        if ref == "latest":
            row = self._db.execute("SELECT run_id FROM runs ORDER BY created DESC LIMIT 1").fetchone()
            if row is None:
                raise StoreError(f"no runs in {self.path}", code="run_missing")
            return str(row[0])
        rows = self._db.execute("SELECT run_id FROM runs WHERE run_id LIKE ?", (ref.replace("%", "") + "%",)).fetchall()
        if len(rows) == 1:
            return str(rows[0][0])
        if not rows:
            raise StoreError(f"no run {ref!r} in {self.path} (see `mmchaos runs`)", code="run_missing")
        raise StoreError(f"{ref!r} matches {len(rows)} runs; give more of the id", code="run_ambiguous")

    def get_run(self, run_id: str) -> RunRecord:
        row = self._db.execute(
            "SELECT run_id, created, finished, status, target_uri, suite_name, config, target, dataset, environment "
            "FROM runs WHERE run_id=?",
            (run_id,),
        ).fetchone()
        if row is None:
            raise StoreError(f"no run {run_id!r} in {self.path}", code="run_missing")
        return RunRecord(
            run_id=row[0],
            created=row[1],
            finished=row[2],
            status=row[3],
            target_uri=row[4],
            suite_name=row[5],
            config=json.loads(row[6]),
            target=json.loads(row[7]),
            dataset=json.loads(row[8]),
            environment=json.loads(row[9]),
        )

    def list_runs(self, limit: int = 50) -> list[tuple[RunRecord, dict[str, int]]]:
        rows = self._db.execute("SELECT run_id FROM runs ORDER BY created DESC LIMIT ?", (limit,)).fetchall()
        out = []
        for (run_id,) in rows:
            counts: dict[str, int] = {}
            for finding in self.findings(run_id):
                counts[finding.verdict.value] = counts.get(finding.verdict.value, 0) + 1
            out.append((self.get_run(run_id), counts))
        return out

    # checks ----------------------------------------------------------------------------------
    def checks(self, run_id: str) -> list[CheckRecord]:
        rows = self._db.execute(
            "SELECT check_id, position, status, COALESCE(wall_seconds,0), COALESCE(model_seconds,0), "
            "COALESCE(model_calls,0) FROM checks WHERE run_id=? ORDER BY position",
            (run_id,),
        ).fetchall()
        return [CheckRecord(*r) for r in rows]

    def mark_started(self, run_id: str, check_id: str) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE checks SET status='running', started=? WHERE run_id=? AND check_id=?",
                (time.time(), run_id, check_id),
            )

    def commit_check(
        self,
        run_id: str,
        check_id: str,
        findings: list[Finding],
        *,
        wall_seconds: float,
        model_seconds: float,
        model_calls: int,
    ) -> None:
        """Store a finished check's findings and artifacts and mark it done, atomically."""
        with self._tx() as db:
            db.execute("DELETE FROM findings WHERE run_id=? AND check_id=?", (run_id, check_id))
            db.execute("DELETE FROM units WHERE run_id=? AND check_id=?", (run_id, check_id))
            db.executemany(
                "INSERT INTO findings VALUES (?,?,?,?)",
                [(run_id, check_id, i, json.dumps(f.to_dict())) for i, f in enumerate(findings)],
            )
            db.executemany(
                "INSERT OR REPLACE INTO artifacts VALUES (?,?,?,?)",
                [(run_id, a.name, a.media_type, a.data) for f in findings for a in f.artifacts],
            )
            db.execute(
                "UPDATE checks SET status='done', finished=?, wall_seconds=?, model_seconds=?, model_calls=? "
                "WHERE run_id=? AND check_id=?",
                (time.time(), wall_seconds, model_seconds, model_calls, run_id, check_id),
            )

    # work units of a running check (see mmchaos.executors.journal) -----------------------------
    def commit_unit(self, run_id: str, check_id: str, key: str, body: str) -> None:
        """Keep one finished work unit until its check commits (then they are dropped)."""
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO units VALUES (?,?,?,?)", (run_id, check_id, key, body))

    def unit_keys(self, run_id: str, check_id: str) -> set[str]:
        try:
            rows = self._db.execute("SELECT key FROM units WHERE run_id=? AND check_id=?", (run_id, check_id))
            return {r[0] for r in rows}
        except sqlite3.OperationalError:  # a store written before units existed, opened read-only
            return set()

    def unit(self, run_id: str, check_id: str, key: str) -> str:
        row = self._db.execute(
            "SELECT body FROM units WHERE run_id=? AND check_id=? AND key=?", (run_id, check_id, key)
        ).fetchone()
        if row is None:
            raise StoreError(f"run {run_id} has no unit {key!r} of {check_id}", code="store_missing_unit")
        body: str = row[0]
        return body

    def findings(self, run_id: str) -> list[Finding]:
        rows = self._db.execute(
            "SELECT f.body FROM findings f JOIN checks c ON c.run_id=f.run_id AND c.check_id=f.check_id "
            "WHERE f.run_id=? ORDER BY c.position, f.idx",
            (run_id,),
        ).fetchall()
        return [Finding.from_dict(json.loads(r[0])) for r in rows]

    def artifacts(self, run_id: str) -> Iterator[Artifact]:
        for name, media_type, data in self._db.execute(
            "SELECT name, media_type, data FROM artifacts WHERE run_id=? ORDER BY name", (run_id,)
        ):
            yield Artifact(name=name, data=bytes(data), media_type=media_type)

    def artifact(self, run_id: str, name: str) -> Artifact | None:
        row = self._db.execute(
            "SELECT name, media_type, data FROM artifacts WHERE run_id=? AND name=?", (run_id, name)
        ).fetchone()
        return Artifact(name=row[0], data=bytes(row[2]), media_type=row[1]) if row else None
