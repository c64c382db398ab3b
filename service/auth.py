"""API keys: random bearer tokens, stored only as SHA-256 hashes.

The keys carry 256 bits of entropy, so a fast hash is enough (no password stretching
needed) and lets lookup be one indexed equality.
"""

from __future__ import annotations

import hashlib
import secrets

KEY_PREFIX = "enc_"


def new_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()
