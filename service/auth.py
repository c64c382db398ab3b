"""API keys: random bearer tokens, stored only as SHA-256 hashes.

The keys carry 256 bits of entropy, so a fast hash is enough (no password stretching
needed) and lets lookup be one indexed equality. A key works until it is revoked, rotated
(replaced by a new one) or past its optional expiry; every request (API and dashboard)
looks it up again, so each of these takes effect at once.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.ledger.tables import Analyst

KEY_PREFIX = "enc_"


def new_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _aware(ts: datetime | None) -> datetime | None:
    # SQLite returns naive datetimes; everything stored is UTC.
    return ts.replace(tzinfo=UTC) if ts is not None and ts.tzinfo is None else ts


def analyst_for_key(session: Session, key: str, *, now: datetime | None = None) -> Analyst | None:
    """The analyst whose key this is, if it is neither revoked nor expired."""
    analyst = session.scalars(
        select(Analyst).where(Analyst.key_hash == hash_api_key(key))
    ).one_or_none()
    return analyst if analyst is not None and key_is_live(analyst, now=now) else None


def key_is_live(analyst: Analyst, *, now: datetime | None = None) -> bool:
    """Whether the analyst's current key is neither revoked nor past its expiry."""
    if analyst.key_revoked_at is not None:
        return False
    expires = _aware(analyst.key_expires_at)
    return expires is None or expires > (now or datetime.now(UTC))


def rotate_key(analyst: Analyst, *, expires_at: datetime | None) -> str:
    """Give ``analyst`` a new key (returned once), expiring at ``expires_at`` (None: never);
    the old one stops working at once. Which expiry a rotation keeps or sets is decided by
    :func:`service.admin.rotate_analyst_key`."""
    key = new_api_key()
    analyst.key_hash = hash_api_key(key)
    analyst.key_revoked_at = None
    analyst.key_expires_at = expires_at
    return key


def revoke_key(analyst: Analyst) -> None:
    analyst.key_revoked_at = datetime.now(UTC)


def expiry(days: float | None) -> datetime | None:
    return None if days is None else datetime.now(UTC) + timedelta(days=days)
