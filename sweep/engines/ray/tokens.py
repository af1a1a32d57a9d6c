"""Token authentication as a join meets it: Ray refuses a token without naming it, where it
came from or what the head wants, so the refusal here says all three in one line."""

from __future__ import annotations

import os
from pathlib import Path

import ray

from sweep.engines.ray import procfs


def no_token_here(named: str = "--address") -> str:
    """Ray in token mode (RAY_AUTH_MODE=token) found no token to send."""
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    looked = f"{path} (RAY_AUTH_TOKEN_PATH) does not hold one" if path else \
        "neither RAY_AUTH_TOKEN nor ~/.ray/auth_token holds one"
    return (f"{named}: RAY_AUTH_MODE=token, but this machine has no token ({looked}); "
            "set RAY_AUTH_TOKEN to the cluster's token or put it in ~/.ray/auth_token "
            "(`ray get-auth-token` on the head prints it)")


def refused_token(address: str, named: str = "--address") -> str:
    where = _token_here()
    head = f"{named}: the Ray cluster at {address} uses token authentication"
    if where is None:
        return (f"{head} and this machine has no token; set RAY_AUTH_MODE=token and "
                "RAY_AUTH_TOKEN to the cluster's token (`ray get-auth-token` on the head "
                "prints it), or put it in ~/.ray/auth_token")
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        # Ray sends a token to an address given explicitly only in token mode.
        return (f"{head}; a token is in {where}, but Ray sends it only with "
                "RAY_AUTH_MODE=token: set that too")
    return (f"{head} and refused the token in {where}; use the cluster's token "
            "(`ray get-auth-token` on the head prints it)")


def _token_here() -> str | None:
    """Where the token Ray would send from this process is, as Ray looks for one:
    RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH names (Ray looks no further when it
    is set), else ~/.ray/auth_token; a blank value or file holds none. None: no token."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return "RAY_AUTH_TOKEN"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    file = Path(path).expanduser() if path else Path.home() / ".ray" / "auth_token"
    try:
        if not file.read_text(errors="replace").strip():
            return None
    except OSError:
        return None
    return f"{path} (RAY_AUTH_TOKEN_PATH)" if path else str(file)


def send_token_here(address: str) -> str | None:
    """For the cluster `ray start` began on this machine, what Ray's own ray.init()
    without an address does (sweep hands ray.init the address it found, and Ray sends a
    token to an address only in token mode): with RAY_AUTH_MODE unset and a token here,
    turn token mode on for this process, unless the head is seen to run without token
    authentication. Returns where the token is, for the first line (~ for the default
    file); None: nothing changed. A head with another token refuses this one, in one line
    (refused_token); a head that cannot be told counts as one with token authentication,
    since one without accepts a token sent all the same (Ray 2.60)."""
    if os.environ.get("RAY_AUTH_MODE") is not None:  # the user's choice, as Ray keeps it
        return None
    where = _token_here()
    if where is None or _head_uses_token(address) is False:
        return None
    os.environ["RAY_AUTH_MODE"] = "token"
    config = getattr(getattr(ray, "_raylet", None), "Config", None)
    if config is not None:  # Ray reads RAY_AUTH_MODE once, at import: read it again
        config.initialize("")
    default = Path.home() / ".ray" / "auth_token"
    return "~/.ray/auth_token" if where == str(default) else where


def _head_uses_token(address: str) -> bool | None:
    """Whether the head at address, started on this machine by this user, runs with
    token authentication: its GCS server's environment says (RAY_AUTH_MODE, which `ray
    start` sets to token where a token exists, and which Ray's servers read when they
    start; the GCS is found by the port on its command line). None where that cannot be
    told: no such process to be seen here (a head in another PID namespace, or started
    with --port 0), or no RAY_AUTH_MODE there (Ray's default mode then)."""
    port = address.rpartition(":")[2]
    if not port.isdigit():
        return None
    flag, me = f"--gcs_server_port={int(port)}", os.getuid()
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None
    for pid in pids:
        args = procfs.args(pid)
        if not args or os.path.basename(args[0]) != "gcs_server" or flag not in args:
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != me:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        mode = next((v.partition(b"=")[2].decode(errors="replace").strip().lower()
                     for v in environ if v.startswith(b"RAY_AUTH_MODE=")), None)
        return {"token": True, "disabled": False}.get(mode or "")
    return None
