"""Schema migrations: yoyo-migrations for discovery and ordering, Orbit for everything else.

yoyo alone has no content checksums, no dirty state, and a lock row that survives kill -9. So
yoyo only reads ``migrations/*.sql`` (splitting statements and ordering by ``-- depends:``), and
this module applies them:

* **One migrator at a time.** ``GET_LOCK('orbit:migrate:<db>')`` is held on a dedicated
  connection for the whole run. The server frees it when that connection dies, so a migrator
  killed with -9 never leaves a stale lock. A second migrator waits (bounded) and then finds
  nothing left to do.
* **Dirty state.** Each migration gets a row in ``orbit_schema_migrations`` in state
  ``APPLYING`` before its first statement; ``steps_done`` advances after each statement, and the
  row becomes ``APPLIED`` only after the last one. A failure records ``FAILED`` and the server's
  real error text. MySQL DDL commits implicitly and does not roll back, so any row not
  ``APPLIED`` is *dirty*: ``up`` refuses to continue and readiness fails until an operator has
  compared the statements with the actual schema and resolved the row by hand
  (docs/runbooks/migrations.md). There is deliberately no command that clears it.
* **Immutability.** The SHA-256 of each applied file is recorded; ``status``, ``up`` and
  readiness report an applied migration whose file changed or disappeared. ``migrations/
  CHECKSUMS`` is the committed manifest (``sha256sum`` format) and a test keeps it in step.
"""

from __future__ import annotations

import datetime as dt
import enum
import getpass
import hashlib
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import pymysql
from yoyo import read_migrations
from yoyo.migrations import topological_sort

from orbit_common.db.pool import DatabaseUrl, connect_sync

MANIFEST = "CHECKSUMS"

CREATE_LEDGER = """
CREATE TABLE IF NOT EXISTS orbit_schema_migrations (
  migration_id VARCHAR(191) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
    COMMENT '迁移 ID：迁移文件名（不含扩展名）',
  checksum CHAR(64) CHARACTER SET ascii NOT NULL
    COMMENT '迁移文件内容的 SHA-256（十六进制）；已应用迁移的文件不得修改',
  state VARCHAR(16) NOT NULL
    COMMENT '状态：APPLYING 执行中、FAILED 失败、APPLIED 已完成；非 APPLIED 即 dirty，需人工核查',
  steps_total INT NOT NULL COMMENT '迁移包含的语句数',
  steps_done INT NOT NULL COMMENT '已成功执行的语句数；失败时指向出错语句之前',
  error_text TEXT NULL COMMENT '失败时数据库返回的原始错误',
  applied_by VARCHAR(191) NOT NULL COMMENT '执行迁移的主机与系统用户',
  started_at DATETIME(6) NOT NULL COMMENT '开始时间（UTC，取数据库时间）',
  finished_at DATETIME(6) NULL COMMENT '完成或失败时间（UTC）；执行中为空',
  PRIMARY KEY (migration_id),
  CONSTRAINT ck_schema_migrations_state CHECK (state IN ('APPLYING', 'FAILED', 'APPLIED')),
  CONSTRAINT ck_schema_migrations_steps CHECK (steps_done BETWEEN 0 AND steps_total)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='迁移记录：Orbit 自有的迁移账本，含内容校验和与 dirty 状态'
"""


def migrations_dir() -> Path:
    """The migrations shipped with this checkout (``ORBIT_MIGRATIONS_DIR`` overrides)."""
    override = os.environ.get("ORBIT_MIGRATIONS_DIR")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[2] / "migrations"


class MigrationError(RuntimeError):
    """A migration run refused to start or failed; the message tells the operator what to do."""


class LockTimeout(MigrationError):
    pass


@attrs.frozen(kw_only=True)
class MigrationFile:
    id: str
    path: Path
    checksum: str
    statements: tuple[str, ...]


class Status(enum.Enum):
    APPLIED = "applied"
    PENDING = "pending"
    DIRTY = "dirty"  # APPLYING (died midway) or FAILED
    EDITED = "edited"  # applied, but the file's checksum changed
    MISSING = "missing"  # applied, but its file is gone from the middle of the sequence
    AHEAD = "ahead"  # applied by a newer Orbit: after every migration this version knows


@attrs.frozen(kw_only=True)
class Entry:
    id: str
    status: Status
    detail: str = ""
    finished_at: dt.datetime | None = None


def file_checksum(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def discover(directory: Path | None = None) -> list[MigrationFile]:
    """Migration files in dependency order, with their statements and checksums."""
    directory = directory or migrations_dir()
    found = []
    for migration in topological_sort(read_migrations(str(directory))):
        migration.load()
        if migration.use_transactions:
            raise MigrationError(
                f"{migration.id}: Orbit migrations must say '-- transactional: false' "
                "(MySQL DDL commits implicitly; Orbit tracks progress per statement)"
            )
        statements = tuple(step.step._apply for step in migration.steps)
        path = Path(migration.path)
        found.append(
            MigrationFile(
                id=migration.id, path=path, checksum=file_checksum(path), statements=statements
            )
        )
    return found


def read_manifest(directory: Path) -> dict[str, str]:
    """``{file name: sha256}`` from the committed manifest."""
    manifest = directory / MANIFEST
    if not manifest.exists():
        return {}
    result = {}
    for line in manifest.read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            result[name.strip()] = digest
    return result


def render_manifest(files: list[MigrationFile]) -> str:
    return "".join(f"{f.checksum}  {f.path.name}\n" for f in sorted(files, key=lambda f: f.id))


def check_manifest(files: list[MigrationFile], directory: Path) -> list[str]:
    """Problems between the files and the committed manifest (empty when they agree)."""
    manifest = read_manifest(directory)
    problems = []
    for f in files:
        recorded = manifest.get(f.path.name)
        if recorded is None:
            problems.append(f"{f.path.name} is not in {MANIFEST}")
        elif recorded != f.checksum:
            problems.append(f"{f.path.name} differs from its checksum in {MANIFEST}")
    names = {f.path.name for f in files}
    problems.extend(
        f"{name} is in {MANIFEST} but missing" for name in manifest if name not in names
    )
    return problems


class Migrator:
    """Applies and reports migrations on one database (see the module docstring)."""

    def __init__(
        self, url: DatabaseUrl, *, directory: Path | None = None, lock_timeout_s: int = 120
    ) -> None:
        if not url.database:
            raise MigrationError("the database URL names no database")
        self.url = url
        self.directory = directory or migrations_dir()
        self.lock_timeout_s = lock_timeout_s
        self.lock_name = f"orbit:migrate:{url.database}"

    def _connect(self) -> pymysql.connections.Connection[Any]:
        return connect_sync(self.url, autocommit=True)

    @contextmanager
    def _locked(self, conn: pymysql.connections.Connection[Any]) -> Iterator[None]:
        with conn.cursor() as cur:
            cur.execute("SELECT GET_LOCK(%s, %s)", (self.lock_name, self.lock_timeout_s))
            (got,) = cur.fetchone()
        if got != 1:
            raise LockTimeout(
                f"another migrator holds {self.lock_name!r}; gave up after "
                f"{self.lock_timeout_s}s (it is freed automatically if that process died)"
            )
        try:
            yield
        finally:
            with conn.cursor() as cur:
                cur.execute("SELECT RELEASE_LOCK(%s)", (self.lock_name,))

    @staticmethod
    def _ledger(cur: Any) -> dict[str, dict[str, Any]]:
        cur.execute(
            "SELECT migration_id, checksum, state, steps_total, steps_done, error_text,"
            " finished_at FROM orbit_schema_migrations"
        )
        columns = [c[0] for c in cur.description]
        return {row[0]: dict(zip(columns, row, strict=True)) for row in cur.fetchall()}

    @staticmethod
    def _ledger_exists(cur: Any) -> bool:
        cur.execute(
            "SELECT COUNT(*) FROM information_schema.TABLES"
            " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'orbit_schema_migrations'"
        )
        return bool(cur.fetchone()[0])

    def status(self) -> list[Entry]:
        """Every migration on disk or in the ledger, with its state."""
        files = discover(self.directory)
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                ledger = self._ledger(cur) if self._ledger_exists(cur) else {}
        finally:
            conn.close()
        return compare(files, ledger)

    def up(self, *, log: Any = print) -> list[str]:
        """Apply every pending migration; returns the ids applied (empty when up to date)."""
        files = discover(self.directory)
        problems = check_manifest(files, self.directory)
        if problems:
            raise MigrationError(
                "migration files do not match the checksum manifest: "
                + "; ".join(problems)
                + ". An applied migration must never change: add a new one instead."
            )
        conn = self._connect()
        applied: list[str] = []
        try:
            with self._locked(conn):
                with conn.cursor() as cur:
                    cur.execute(CREATE_LEDGER)
                    entries = compare(files, self._ledger(cur))
                refuse_unsafe(entries)
                # compare() lists the files first, in order, then ledger-only rows.
                for f, entry in zip(files, entries, strict=False):
                    if entry.status is Status.PENDING:
                        log(f"applying {f.id} ({len(f.statements)} statements)")
                        self._apply(conn, f)
                        applied.append(f.id)
        finally:
            conn.close()
        return applied

    def _apply(self, conn: pymysql.connections.Connection[Any], f: MigrationFile) -> None:
        who = f"{getpass.getuser()}@{socket.gethostname()}"
        with conn.cursor() as cur:
            cur.execute(
                "INSERT INTO orbit_schema_migrations (migration_id, checksum, state, steps_total,"
                " steps_done, applied_by, started_at) VALUES (%s, %s, 'APPLYING', %s, 0, %s,"
                " UTC_TIMESTAMP(6))",
                (f.id, f.checksum, len(f.statements), who),
            )
            for index, statement in enumerate(f.statements):
                try:
                    cur.execute(statement)
                except pymysql.err.MySQLError as exc:
                    cur.execute(
                        "UPDATE orbit_schema_migrations SET state = 'FAILED', error_text = %s,"
                        " finished_at = UTC_TIMESTAMP(6) WHERE migration_id = %s",
                        (str(exc), f.id),
                    )
                    raise MigrationError(
                        f"migration {f.id} failed at statement {index + 1} of "
                        f"{len(f.statements)}: {exc}. The schema is now DIRTY. MySQL DDL does "
                        f"not roll back: statements 1..{index} were applied. Compare statement "
                        f"{index + 1} with the actual schema (SHOW CREATE TABLE), then follow "
                        "docs/runbooks/migrations.md to resolve the ledger row by hand."
                    ) from exc
                cur.execute(
                    "UPDATE orbit_schema_migrations SET steps_done = %s WHERE migration_id = %s",
                    (index + 1, f.id),
                )
            cur.execute(
                "UPDATE orbit_schema_migrations SET state = 'APPLIED',"
                " finished_at = UTC_TIMESTAMP(6) WHERE migration_id = %s",
                (f.id,),
            )


def compare(files: list[MigrationFile], ledger: dict[str, dict[str, Any]]) -> list[Entry]:
    """Join the files on disk with the ledger rows (files first, in order)."""
    entries = []
    for f in files:
        row = ledger.get(f.id)
        if row is None:
            entries.append(Entry(id=f.id, status=Status.PENDING))
        elif row["state"] != "APPLIED":
            detail = (
                f"{row['state']} after {row['steps_done']}/{row['steps_total']} statements"
                + (f": {row['error_text']}" if row["error_text"] else "")
            )
            entries.append(Entry(id=f.id, status=Status.DIRTY, detail=detail))
        elif row["checksum"] != f.checksum:
            entries.append(
                Entry(
                    id=f.id,
                    status=Status.EDITED,
                    detail=f"applied with sha256 {row['checksum'][:12]}…, file now "
                    f"{f.checksum[:12]}…",
                    finished_at=row["finished_at"],
                )
            )
        else:
            entries.append(Entry(id=f.id, status=Status.APPLIED, finished_at=row["finished_at"]))
    known = {f.id for f in files}
    newest = max(known, default="")
    for migration_id, row in sorted(ledger.items()):
        if migration_id in known:
            continue
        if row["state"] != "APPLIED":
            entries.append(Entry(id=migration_id, status=Status.DIRTY,
                                 detail="no such file on disk"))
        elif migration_id > newest:
            # Rolling upgrade: a newer version expanded the schema; this one keeps working.
            entries.append(Entry(id=migration_id, status=Status.AHEAD,
                                 detail="applied by a newer version",
                                 finished_at=row["finished_at"]))
        else:
            entries.append(Entry(id=migration_id, status=Status.MISSING,
                                 detail="no such file on disk"))
    return entries


def refuse_unsafe(entries: list[Entry]) -> None:
    """Raise when the ledger shows a dirty, edited or missing migration."""
    bad = [e for e in entries if e.status in {Status.DIRTY, Status.EDITED, Status.MISSING}]
    ahead = [e.id for e in entries if e.status is Status.AHEAD]
    pending = [e.id for e in entries if e.status is Status.PENDING]
    if not bad and ahead and pending:
        raise MigrationError(
            f"refusing to migrate: the database has migrations from a newer version ({ahead}) "
            f"but not {pending}, which this version would apply. Run the newest version's "
            "migrator instead."
        )
    if not bad:
        return
    lines = "; ".join(f"{e.id}: {e.status.value} ({e.detail})" for e in bad)
    if any(e.status is Status.DIRTY for e in bad):
        advice = (
            "A dirty migration stopped midway; MySQL DDL does not roll back. Check which "
            "statements took effect (SHOW CREATE TABLE …), finish or undo them by hand, then "
            "resolve the orbit_schema_migrations row as docs/runbooks/migrations.md describes."
        )
    else:
        advice = (
            "Applied migrations are immutable: restore the original file and add a new "
            "migration for the change."
        )
    raise MigrationError(f"refusing to migrate: {lines}. {advice}")
