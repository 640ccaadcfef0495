"""Persistence: SQLAlchemy 2 over SQLite by default (any SQLAlchemy URL works), Alembic migrations.

`Storage` opens the database, migrates it, probes it, and holds one repository per concern; the
repositories share its connection and its one way of reporting failures (StorageError). Nothing here
knows what a setting means (that is tts_core's job).
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.util.exc import CommandError
from sqlalchemy import text

from .audit import AuditLog
from .calibrations import Calibrations
from .cloned_voices import ClonedVoices
from .database import AlreadyExists, Database, StorageError, guarded
from .jobs import Jobs
from .keys import ApiKeys
from .lexicon import Lexicon
from .models import JobStatus
from .replicas import Replicas
from .request_log import RequestLog
from .settings import StoredSettings

__all__ = ["AlreadyExists", "JobStatus", "Storage", "StorageError", "sqlite_url"]

MIGRATIONS = Path(__file__).parent / "migrations"
MIGRATION_LOCK = 0x43686F72  # "Chor": the Postgres advisory lock that migrations hold


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


class Storage:
    def __init__(self, url: str):
        self.url = url
        self._database = Database(url)
        self.engine = self._database.engine
        self.settings = StoredSettings(self._database)
        self.audit = AuditLog(self._database)
        self.request_log = RequestLog(self._database)
        self.keys = ApiKeys(self._database)
        self.jobs = Jobs(self._database)
        self.replicas = Replicas(self._database)
        self.cloned_voices = ClonedVoices(self._database)
        self.lexicon = Lexicon(self._database)
        self.calibrations = Calibrations(self._database)

    def migrate(self, revision: str = "head") -> None:
        """Upgrade the schema (an empty database is created from scratch)."""
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.set_main_option("sqlalchemy.url", self.url.replace("%", "%%"))
        try:
            with guarded(), self._sqlite_file_lock(), self.engine.begin() as connection:
                if self._database.dialect == "postgresql":  # replicas starting at once: one migrates, the rest wait
                    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
                config.attributes["connection"] = connection
                command.upgrade(config, revision)
        except CommandError as error:  # e.g. a database from a newer version of Chorus
            raise StorageError(f"cannot migrate the database: {error}") from None

    @contextmanager
    def _sqlite_file_lock(self) -> Iterator[None]:
        """Processes starting at once on one SQLite file: one migrates, the rest wait (then find nothing to do).
        SQLite runs a migration's DDL outside any lock, so they hold a lock file beside the database."""
        database = self.engine.url.database if self._database.dialect == "sqlite" else None
        if not database or database == ":memory:":
            yield
            return
        with open(f"{database}.migrate-lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            yield

    def revision(self) -> str | None:
        from alembic.runtime.migration import MigrationContext

        with guarded(), self.engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()

    def probe_write(self) -> None:
        """The health probe: a real committed write that changes nothing (the schema's version row rewritten to
        itself); it fails as any write would while the database is full, read-only or locked."""
        with self._database.transaction(write=True) as session:
            session.execute(text("UPDATE alembic_version SET version_num = version_num"))
