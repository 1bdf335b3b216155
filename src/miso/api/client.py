"""A small HTTP client of the miso API (httpx), used by the CLI and the load benchmark."""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import quote

import httpx

from miso.api.wire import API


class ApiError(Exception):
    """The API answered an error (``status`` > 0) or could not be reached (``status`` 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Client:
    """Calls of ``/api/v1/`` with a bearer token; every failure is an :class:`ApiError`."""

    def __init__(self, url: str, token: str | None, *, ca: str | None = None,
                 timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        verify: Any = True
        if ca:  # trusted besides the system's CAs (e.g. the server's self-signed certificate)
            verify = ssl.create_default_context()
            verify.load_verify_locations(cafile=ca)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url + API, headers=headers, verify=verify,
                                  timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.HTTPError as e:
            raise ApiError(0, f"cannot reach the miso API at {self.url}: {e}") from None
        try:
            body = r.json()
        except ValueError:
            body = {"error": r.text[:200]}
        if r.status_code >= 400:
            msg = body.get("error") if isinstance(body, dict) else None
            raise ApiError(r.status_code, str(msg or f"HTTP {r.status_code}"))
        return body

    # ---- jobs ---------------------------------------------------------------------------

    def submit(self, command: list[str], *, name: str | None = None,
               memory_gb: float | None = None, workload: str | None = None,
               env: dict[str, str] | None = None, cwd: str | None = None,
               request_id: str | None = None, priority: str | int | None = None,
               host_memory_gb: float | None = None,
               time_limit_s: float | None = None,
               num_gpus: int | None = None, nodes: int | None = None,
               profile: str | None = None, after: list[str] | None = None) -> str:
        body: dict[str, Any] = {"command": command, "env": env or {}}
        if profile is not None:
            body["profile"] = profile
        if after:
            body["after"] = list(after)
        if num_gpus is not None and num_gpus != 1:
            body["num_gpus"] = num_gpus
        if nodes is not None:
            body["nodes"] = nodes
        for k, v in (("name", name), ("memory_gb", memory_gb), ("workload", workload),
                     ("cwd", cwd), ("request_id", request_id), ("priority", priority),
                     ("host_memory_gb", host_memory_gb), ("time_limit_s", time_limit_s)):
            if v is not None:
                body[k] = v
        return str(self.request("POST", "/jobs", json=body)["id"])

    def jobs(self, *, active: bool = False, limit: int | None = None,
             all_users: bool = False) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"active": active, "all": all_users}
        if limit is not None:
            params["limit"] = limit
        return list(self.request("GET", "/jobs", params=params)["jobs"])

    def job(self, job: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/jobs/{job}")["job"])

    def logs(self, job: str, tail: int = 200) -> str:
        return str(self.request("GET", f"/jobs/{job}/logs", params={"tail": tail})["text"])

    def cancel(self, job: str) -> dict[str, Any]:
        return dict(self.request("POST", f"/jobs/{job}/cancel")["job"])

    def status(self, limit: int = 200, *, state: str | None = None, owner: str | None = None,
               offset: int = 0, summary: bool = False) -> dict[str, Any]:
        """The status view: a page of ``limit`` jobs (after the ``offset`` latest), of one
        ``state`` / ``owner`` (a user name); ``summary``: counts only."""
        params: dict[str, Any] = {"limit": limit}
        if summary:
            params["summary"] = "true"
        params.update({k: v for k, v in (("state", state), ("owner", owner)) if v})
        if offset:
            params["offset"] = offset
        return dict(self.request("GET", "/status", params=params))

    # ---- users --------------------------------------------------------------------------

    def me(self) -> dict[str, Any]:
        return dict(self.request("GET", "/users/me"))

    def users(self) -> list[dict[str, Any]]:
        return list(self.request("GET", "/users")["users"])

    def add_user(self, name: str, *, admin: bool = False,
                 unix_user: str | None = None) -> dict[str, Any]:
        return dict(self.request("POST", "/users", json={"name": name, "admin": admin,
                                                         "unix_user": unix_user}))

    def remove_user(self, name: str) -> None:
        self.request("DELETE", f"/users/{name}")

    def rotate(self, name: str) -> str:
        return str(self.request("POST", f"/users/{name}/rotate")["token"])

    def audit(self, user: str | None = None) -> list[dict[str, Any]]:
        params = {"user": user} if user else {}
        return list(self.request("GET", "/audit", params=params)["audit"])

    # ---- quotas (admin) -----------------------------------------------------------------

    def quotas(self) -> dict[str, Any]:
        """``{"tenancy": {...}, "quotas": [row, ...]}``."""
        return dict(self.request("GET", "/quotas"))

    def quota(self, name: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/quotas/{quote(name, safe='')}")["quota"])

    def set_quota(self, name: str, **fields: Any) -> dict[str, Any]:
        """Set the given fields (``weight``, ``max_in_use``, ``max_queued``,
        ``priority_limit``; None clears one); ``{"quota", "tenancy"}``."""
        return dict(self.request("PUT", f"/quotas/{quote(name, safe='')}", json=fields))

    def set_account_weight(self, account: str, weight: float | None) -> dict[str, Any]:
        """Set an account's fair-share weight (None: the default)."""
        return dict(self.request("PUT", f"/accounts/{quote(account, safe='')}",
                                 json={"weight": weight}))

    def clear_quota(self, name: str) -> dict[str, Any]:
        return dict(self.request("DELETE", f"/quotas/{quote(name, safe='')}"))
