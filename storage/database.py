"""The one connection to the database every repository shares: the engine, sessions, and how failures
come out (StorageError), including renewing connections a fault left unusable once the database is well."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import ArgumentError, DBAPIError, DisconnectionError
from sqlalchemy.orm import Session, sessionmaker


class AlreadyExists(Exception):
    """A row with that unique key is there already (the message names it)."""


class StorageError(Exception):
    """The database cannot do what was asked now (unreachable, locked, full, read-only, a bad URL).
    Every repository method raises this in place of the driver's errors, so callers handle one kind; its
    text is the driver's, for the log and the operator, never for API callers."""


# What a database failure looks like from here: the driver's errors as SQLAlchemy wraps them, and the
# file system's under SQLite.
FAILURES = (DBAPIError, OSError)
# Failures that leave a connection unusable although the database may be well again: SQLite opens a file it
# cannot write read-only and keeps that connection read-only for good (SQLITE_READONLY), and after an I/O error
# or a journal it could not open (IOERR, CANTOPEN) its view of the file may be stale; Postgres answers 25006 on
# a connection to a server that has become a read-only standby. pool_pre_ping passes all of these (a SELECT
# works), so the connection, and the pool's others opened under the same fault, are dropped when one is seen.
SQLITE_STALE_CODES = {8, 10, 14}  # primary result codes: READONLY, IOERR, CANTOPEN
POSTGRES_STALE_STATES = {"25006"}  # read_only_sql_transaction


class Database:
    """The engine and session factory for one URL; `transaction` is the one way repositories reach it."""

    def __init__(self, url: str):
        try:
            self.engine: Engine = create_engine(url, pool_pre_ping=True)
        except (ArgumentError, ImportError) as error:  # not a URL, an unknown dialect, a driver not installed
            raise StorageError(f"not a usable database URL: {error}") from None
        self.dialect = self.engine.dialect.name
        if self.dialect == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
            if (database := self.engine.url.database) and database != ":memory:":
                _renew_read_only_connections(self.engine, database)
        event.listen(self.engine, "handle_error", _drop_stale_connections)
        self._session = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def transaction(self, write: bool = False) -> Iterator[Session]:
        """A session, committed at the end when write; the driver's failures come out as StorageError."""
        with guarded(), (self._session.begin() if write else self._session()) as session:
            yield session


@contextmanager
def guarded() -> Iterator[None]:
    try:
        yield
    except FAILURES as error:
        cause = getattr(error, "orig", None) or error  # the driver's own error, without the SQL and its parameters
        raise StorageError(f"{type(cause).__name__}: {cause}") from error


def loads(value: str) -> Any:
    """JSON as stored; Infinity and NaN (which older versions could store) come back as strings, so that
    they fail validation instead of breaking a JSON answer."""
    return json.loads(value, parse_constant=str)


def dumps_or_none(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def now() -> datetime:
    return datetime.now(UTC)


def aware(moment: datetime) -> datetime:
    """SQLite hands back naive datetimes; every stored moment is UTC."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def iso(moment: datetime) -> str:
    return aware(moment).isoformat()


def _renew_read_only_connections(engine: Engine, database: str) -> None:
    """A connection SQLite opened read-only (its file was not writable then) is replaced by a fresh one at its
    first use after the file is writable again, before any write of its fails."""
    @event.listens_for(engine, "connect")
    def opened(_dbapi_connection, record) -> None:
        record.info["read_only_file"] = not os.access(database, os.W_OK)

    @event.listens_for(engine, "checkout")
    def checked_out(_dbapi_connection, record, _proxy) -> None:
        if record.info.get("read_only_file") and os.access(database, os.W_OK):
            raise DisconnectionError("opened while the file was read-only; it is writable now")


def _drop_stale_connections(context) -> None:
    """A failure that leaves its connection unusable counts as a disconnect: SQLAlchemy then drops the
    connection and renews the pool's others, so the database works again here as soon as it does."""
    error = context.original_exception
    code = getattr(error, "sqlite_errorcode", None)
    if (code is not None and code & 0xFF in SQLITE_STALE_CODES) or getattr(error, "sqlstate", None) in \
            POSTGRES_STALE_STATES:
        context.is_disconnect = True


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()
