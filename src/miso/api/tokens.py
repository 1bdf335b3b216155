"""API tokens: random secrets handed out once, stored only as a SHA-256 hash.

A token is ``miso_`` plus 32 random bytes in URL-safe base64. A 256-bit random secret needs no
slow password hash: SHA-256 of it cannot be reversed or guessed, and comparing hashes with
:func:`hmac.compare_digest` keeps the comparison constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

PREFIX = "miso_"


def new_token() -> str:
    """A fresh random token (shown to its user once)."""
    return PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """The stored form of a token (hex SHA-256)."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def matches(token: str, stored_hash: str) -> bool:
    """Whether ``token`` hashes to ``stored_hash`` (constant-time comparison)."""
    return hmac.compare_digest(token_hash(token), stored_hash)
