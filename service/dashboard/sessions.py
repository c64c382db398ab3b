"""Server-side dashboard sessions and their CSRF tokens.

Sign-in exchanges an admin API key for a random session token (256 bits); the cookie holds
that token, never the key, and the database holds only the token's SHA-256 hash (as for API
keys, the entropy makes a fast hash enough). A session is valid while it has not expired,
its admin's key is still the one it was opened with (rotation ends it), and that key is
live (revocation and expiry end it, through the same check as every API call). Sign-out
deletes the row. Each session carries its own CSRF token, which every POST form sends back.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from service.auth import analyst_for_key, hash_api_key, key_is_live
from service.jobs import as_utc
from service.ledger.tables import Analyst, DashboardSession, Role


@dataclass(frozen=True)
class AdminSession:
    """A live session: whose it is and the CSRF token its forms must carry."""

    admin: str
    csrf_token: str


def open_session(session: Session, key: str, *, ttl_s: float) -> str | None:
    """A new session token for an admin's live key (None for any other key).

    Expired sessions of every admin are removed on the way (they authenticate nobody).
    """
    admin = analyst_for_key(session, key)
    if admin is None or admin.role != Role.admin:
        return None
    now = datetime.now(UTC)
    session.execute(delete(DashboardSession).where(DashboardSession.expires_at <= now))
    token = secrets.token_urlsafe(32)
    session.add(
        DashboardSession(
            token_hash=hash_api_key(token),
            analyst_id=admin.id,
            key_hash=admin.key_hash,
            csrf_token=secrets.token_urlsafe(32),
            created_at=now,
            expires_at=now + timedelta(seconds=ttl_s),
        )
    )
    return token


def session_for_token(
    session: Session, token: str | None, *, now: datetime | None = None
) -> AdminSession | None:
    """The live admin session this cookie token opens, if any."""
    if not token:
        return None
    row = session.execute(
        select(DashboardSession, Analyst)
        .join(Analyst, Analyst.id == DashboardSession.analyst_id)
        .where(DashboardSession.token_hash == hash_api_key(token))
    ).one_or_none()
    if row is None:
        return None
    ds, admin = row
    expires = as_utc(ds.expires_at)
    now = now or datetime.now(UTC)
    if (
        (expires is not None and expires <= now)
        or admin.key_hash != ds.key_hash
        or admin.role != Role.admin
        or not key_is_live(admin, now=now)
    ):
        return None
    return AdminSession(admin=admin.name, csrf_token=ds.csrf_token)


def close_session(session: Session, token: str | None) -> None:
    """Sign-out: the token opens nothing from now on."""
    if token:
        session.execute(
            delete(DashboardSession).where(DashboardSession.token_hash == hash_api_key(token))
        )


def csrf_ok(admin: AdminSession, sent: str | None) -> bool:
    return sent is not None and secrets.compare_digest(admin.csrf_token, sent)
