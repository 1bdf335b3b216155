"""Users of a miso cluster, their token hashes and the audit record (SQLite, private file).

A user has an id, a name, an admin flag, an optional Unix account its jobs run as (when the
agent runs as root) and the SHA-256 hash of its current token; the token itself is returned once
by :meth:`UserStore.add` / :meth:`UserStore.rotate` and never stored. Every submit and cancel
(and every change to the users) is appended to ``audit`` with who and when.

Ids: jobs belong to the user's id, never to its name. An id is ``u:`` and 64 random bits (a
``:`` no name can hold), so it is never handed out again - not after the user is removed, not
after ``users.db`` is lost: a user removed and re-created under the same name is a new user who
cannot see or act on the old one's jobs.

Unix accounts: ``unix_user`` must name an existing account (a login name, or a uid with a
passwd entry) other than root (uid 0): a user's jobs never run as root. Only the local
operator's own account, made the first admin by ``miso cluster up``, is taken as it is.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miso.api.tokens import matches, new_token, token_hash
from miso.sqlitebackup import backup_private

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS users (
  name TEXT PRIMARY KEY,
  id TEXT,
  admin INTEGER NOT NULL,
  unix_user TEXT,
  token_hash TEXT UNIQUE NOT NULL,
  created_at REAL NOT NULL,
  rotated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS audit (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  at REAL NOT NULL,
  user TEXT NOT NULL,
  action TEXT NOT NULL,
  job TEXT,
  detail TEXT NOT NULL DEFAULT '{}'
);
"""


_AUDIT_INSERT = "INSERT INTO audit(at, user, action, job, detail) VALUES(?,?,?,?,?)"


@dataclass
class _AuditEntry:
    """One audit row waiting for its group (:meth:`UserStore.record`), and its outcome."""

    row: tuple[Any, ...]
    done: bool = False
    error: Exception | None = None


class UserError(ValueError):
    """Bad request about users (bad or duplicate name, unknown user, last admin)."""


@dataclass(frozen=True)
class User:
    name: str
    admin: bool
    unix_user: str | None
    #: Never reused (see the module docstring); what jobs belong to.
    id: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "admin": self.admin,
                "unix_user": self.unix_user}


ID_PREFIX = "u:"


def new_user_id() -> str:
    return ID_PREFIX + secrets.token_hex(8)


def unix_account_problem(unix_user: str) -> str | None:
    """Why ``unix_user`` cannot run a user's jobs (one line), or None: it must be an existing
    account (name, or uid with a passwd entry) and not root."""
    if not re.match(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,31}$", unix_user):
        return f"bad Unix user {unix_user!r}"
    try:
        pw = pwd.getpwuid(int(unix_user)) if unix_user.isdigit() else pwd.getpwnam(unix_user)
    except (KeyError, OverflowError):
        return f"no Unix account {unix_user!r} on this machine: give an existing account"
    if pw.pw_uid == 0:
        return (f"Unix user {unix_user!r} is root (uid 0): a user's jobs never run as root; "
                "give an unprivileged account")
    return None


def _user(r: sqlite3.Row) -> User:
    return User(r["name"], bool(r["admin"]), r["unix_user"], r["id"])


def _private_file(path: Path) -> None:
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        if p.exists():
            os.chmod(p, 0o600)


class UserStore:
    """Users and audit in ``path`` (mode 0600); ``":memory:"`` for tests.

    :meth:`authenticate` answers from memory for ``auth_ttl`` seconds after a token was
    looked up (a change made through this object takes effect at once; one made by another
    process, e.g. the operator's bootstrap, within ``auth_ttl``).
    """

    def __init__(self, path: str | Path, *, auth_ttl: float = 2.0) -> None:
        self.path = str(path)
        self.auth_ttl = auth_ttl
        self._seen: dict[str, tuple[float, User | None]] = {}
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            Path(self.path).touch(mode=0o600, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        #: audit entries waiting for the next group write, and the lock of that list
        self._audit_mutex = threading.Lock()
        self._audit_waiting: list[_AuditEntry] = []
        with self._lock:
            if self.path != ":memory:":
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")  # WAL: no fsync per record
            self._db.executescript(_SCHEMA)
            self._give_ids()
        if self.path != ":memory:":
            _private_file(Path(self.path))
        # token lookups (on the API's event loop) on a read connection of their own: in WAL
        # mode they never wait behind the audit's writes (submissions' threads hold _lock)
        self._auth_db, self._auth_lock = self._db, self._lock
        if self.path != ":memory:":
            self._auth_db = sqlite3.connect(self.path, check_same_thread=False,
                                            isolation_level=None)
            self._auth_db.row_factory = sqlite3.Row
            self._auth_db.execute("PRAGMA query_only=1")
            self._auth_lock = threading.Lock()
        #: bumped whenever tokens change: a lookup read before that is not cached
        self._generation = 0

    def _forget_tokens(self) -> None:
        """Tokens changed: every cached lookup is dropped (and none read before is kept)."""
        self._generation += 1
        self._seen.clear()

    def _give_ids(self) -> None:
        """An id for every user of an older store (made before users had ids)."""
        cols = {r[1] for r in self._db.execute("PRAGMA table_info(users)")}
        if "id" not in cols:
            self._db.execute("ALTER TABLE users ADD COLUMN id TEXT")
        for (name,) in self._db.execute("SELECT name FROM users WHERE id IS NULL").fetchall():
            self._db.execute("UPDATE users SET id=? WHERE name=?", (new_user_id(), name))
        self._db.execute("CREATE UNIQUE INDEX IF NOT EXISTS users_id ON users(id)")

    def close(self) -> None:
        with self._lock:
            self._db.close()
        if self._auth_db is not self._db:
            with self._auth_lock:
                self._auth_db.close()

    def backup(self, dest: str | Path) -> None:
        """Copy the whole store to ``dest`` (consistent while in use; mode 0600)."""
        with self._lock:
            backup_private(self._db, dest)

    # ---- users --------------------------------------------------------------------------

    def add(self, name: str, *, admin: bool = False, unix_user: str | None = None,
            operator: bool = False) -> str:
        """Create a user (a new id); returns its token (the only time it is known).
        ``unix_user`` must exist and not be root, except for the local ``operator``'s own
        account (it runs the cluster already)."""
        if not NAME_RE.match(name):
            raise UserError(f"bad user name {name!r}: use letters, digits, '_', '.', '-' "
                            "(at most 64, starting with a letter or digit)")
        if unix_user is not None:
            problem = unix_account_problem(unix_user)
            if problem and not (operator and "is root" in problem):
                raise UserError(problem)
        token = new_token()
        now = time.time()
        with self._lock:
            try:
                self._db.execute(
                    "INSERT INTO users(name, id, admin, unix_user, token_hash, created_at, "
                    "rotated_at) VALUES(?,?,?,?,?,?,?)",
                    (name, new_user_id(), int(admin), unix_user, token_hash(token), now, now))
            except sqlite3.IntegrityError:
                raise UserError(f"user {name!r} already exists") from None
        self._forget_tokens()
        return token

    def get(self, name: str) -> User:
        with self._lock:
            r = self._db.execute("SELECT * FROM users WHERE name=?", (name,)).fetchone()
        if r is None:
            raise UserError(f"no user {name!r}")
        return _user(r)

    def list(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT id, name, admin, unix_user, created_at, "
                                    "rotated_at FROM users ORDER BY name").fetchall()
        return [{**dict(r), "admin": bool(r["admin"])} for r in rows]

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM users").fetchone()[0])

    def remove(self, name: str) -> None:
        """Delete a user (its token stops working at once); the last admin stays."""
        with self._lock:
            r = self._db.execute("SELECT admin FROM users WHERE name=?", (name,)).fetchone()
            if r is None:
                raise UserError(f"no user {name!r}")
            admins = self._db.execute("SELECT count(*) FROM users WHERE admin=1").fetchone()[0]
            if r["admin"] and admins <= 1:
                raise UserError(f"{name!r} is the last admin; add another admin first")
            self._db.execute("DELETE FROM users WHERE name=?", (name,))
            self._forget_tokens()

    def rotate(self, name: str) -> str:
        """Give ``name`` a new token (the old one stops working); returns it."""
        token = new_token()
        with self._lock:
            cur = self._db.execute("UPDATE users SET token_hash=?, rotated_at=? WHERE name=?",
                                   (token_hash(token), time.time(), name))
        self._forget_tokens()
        if cur.rowcount != 1:
            raise UserError(f"no user {name!r}")
        return token

    def authenticate(self, token: str | None) -> User | None:
        """The user holding ``token``, or None (missing, malformed or unknown token)."""
        if not token or len(token) > 256:
            return None
        h = token_hash(token)
        now = time.monotonic()
        hit = self._seen.get(h)
        if hit is not None and now - hit[0] < self.auth_ttl:
            return hit[1]
        generation = self._generation
        with self._auth_lock:
            r = self._auth_db.execute("SELECT * FROM users WHERE token_hash=?",
                                      (h,)).fetchone()
        user = None
        if r is not None and matches(token, r["token_hash"]):
            user = _user(r)
        if len(self._seen) > 10_000:  # bounded (wrong tokens are cached too)
            self._seen.clear()
        if generation == self._generation:  # no token changed while it was read
            self._seen[h] = (now, user)
        return user

    # ---- audit --------------------------------------------------------------------------

    def record(self, user: str, action: str, job: str | None = None,
               detail: dict[str, Any] | None = None) -> None:
        """Append an audit entry (wall-clock time); returns once it is written. Entries
        recorded together (submissions arriving at once) are written in one transaction by
        whichever caller gets the lock first (a group commit: one commit, not one each)."""
        entry = _AuditEntry((time.time(), user, action, job,
                             json.dumps(detail or {}, default=str)))
        with self._audit_mutex:
            self._audit_waiting.append(entry)
        with self._lock:
            if not entry.done:
                with self._audit_mutex:
                    group, self._audit_waiting = self._audit_waiting, []
                self._write_audit(group)
        if entry.error is not None:
            raise entry.error

    def _write_audit(self, group: list[_AuditEntry]) -> None:
        """Write ``group`` in one transaction (the caller holds :attr:`_lock`); each entry
        gets the error when it fails."""
        try:
            if len(group) == 1:
                self._db.execute(_AUDIT_INSERT, group[0].row)
            else:
                self._db.execute("BEGIN")
                try:
                    self._db.executemany(_AUDIT_INSERT, [e.row for e in group])
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
        except Exception as e:  # noqa: BLE001 - every caller of the group gets it
            for en in group:
                en.error = e
        finally:
            for en in group:
                en.done = True

    def audit(self, *, user: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        q, args = "SELECT * FROM audit", ()
        if user is not None:
            q, args = q + " WHERE user=?", (user,)
        with self._lock:
            rows = [dict(r) for r in self._db.execute(
                q + " ORDER BY seq DESC LIMIT ?", (*args, int(limit)))]
        for r in rows:
            r["detail"] = json.loads(r["detail"])
        return rows[::-1]
