"""Engine and session factories for the ledger database (PostgreSQL or SQLite).

SQLite: every transaction starts with ``BEGIN IMMEDIATE`` so the write lock is taken up
front; two admissions can never both read the same remaining budget. PostgreSQL: the
admission path locks the budget rows with ``SELECT … FOR UPDATE``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from service.config import get_settings
from service.private_files import create_private_sqlite


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def make_engine(url: str, **kwargs: Any) -> Engine:
    if is_sqlite(url):
        # A new ledger file is created 0600 here, not by SQLite with the umask's mode; its
        # -wal and -shm files take that mode (issue 26).
        create_private_sqlite(url)
        engine = create_engine(
            url, connect_args={"timeout": 60, "check_same_thread": False}, **kwargs
        )

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Let SQLAlchemy, not pysqlite, decide when transactions begin.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=60000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 30)  # ≤ 40 connections a process: PostgreSQL allows 100
    return create_engine(url, **kwargs)


@lru_cache(maxsize=8)
def engine_for(url: str) -> Engine:
    return make_engine(url)


def get_engine() -> Engine:
    return engine_for(get_settings().resolved_database_url)


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(engine: Engine) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on any exception."""
    with session_factory(engine)() as session, session.begin():
        yield session
