"""The head's dashboard, where jobs are submitted: its address, a quick probe and Ray's
job client, each failing in one line, where Ray's client would wait minutes or trace."""

from __future__ import annotations

import http.client
import importlib.util
import json
import logging
import os
import socket
import urllib.error
import urllib.request
from typing import Any

from sweep.submit.errors import SubmitError, one_line

DEFAULT_DASHBOARD = "http://127.0.0.1:8265"
PROBE_TIMEOUT_S = 4.0
HOW_TO_INSTALL = "pip install 'triton-sweep[cluster]' (from a clone: pip install -e '.[cluster]')"


def check_jobs_client() -> None:
    """Whether Ray and ray[default]'s client libraries are there at all, before probing
    (which takes seconds on an address that does not answer); jobs_client imports them."""
    for name in ("ray", "aiohttp", "requests", "pydantic"):
        try:
            there = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a broken or half-removed installation
            there = False
        if not there:
            raise SubmitError(f"sweep submit needs Ray's job client, which ray[default] "
                              f"provides ({name} is missing): {HOW_TO_INSTALL}")


def jobs_client() -> Any:
    """Ray's Jobs client, which needs ray[default] (aiohttp, requests, pydantic)."""
    try:
        import aiohttp  # noqa: F401
        import requests  # noqa: F401
        from ray.job_submission import JobSubmissionClient
    except ImportError as e:
        raise SubmitError(f"sweep submit needs Ray's job client, which ray[default] "
                          f"provides ({e.name or e} is missing): {HOW_TO_INSTALL}") from None
    # Ray's client logs each upload and websocket at INFO; this command says what matters.
    for name in ("ray.dashboard.modules.dashboard_sdk", "ray.dashboard.modules.job.sdk",
                 "ray._private.runtime_env.packaging"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return JobSubmissionClient


def dashboard_url(given: str | None) -> tuple[str, str]:
    """The dashboard's URL and where it came from: --address, else RAY_API_SERVER_ADDRESS,
    else RAY_ADDRESS (the variables Ray's own `ray job` reads, in its order), else the
    local default. HOST:PORT without a scheme is the dashboard's, except in RAY_ADDRESS,
    where Ray's convention makes it the GCS address `sweep run` joins: its head's dashboard
    is looked for on the default port. RAY_ADDRESS=auto or local names no address."""
    ray_address = os.environ.get("RAY_ADDRESS", "").strip()
    if ray_address.lower() in ("auto", "local"):
        ray_address = ""
    sources = (("--address", given),
               ("RAY_API_SERVER_ADDRESS", os.environ.get("RAY_API_SERVER_ADDRESS")),
               ("RAY_ADDRESS", ray_address))
    where, value = next(((w, v.strip()) for w, v in sources if v and v.strip()),
                        ("--address (default)", DEFAULT_DASHBOARD))
    scheme, sep, rest = value.partition("://")
    if not sep:
        scheme, rest = "http", value
    if where == "RAY_ADDRESS" and scheme.lower() in ("http", "ray") and (
            not sep or scheme.lower() == "ray"):
        # A GCS (HOST:6379) or Ray Client (ray://HOST:10001) address: Ray's CLI asks the
        # cluster for its dashboard; the head's default dashboard port is a fair guess,
        # which the probe then checks.
        host = rest.rsplit(":", 1)[0] if rest.rsplit(":", 1)[-1].isdigit() else rest
        scheme, rest = "http", f"{host}:{DEFAULT_DASHBOARD.rsplit(':', 1)[1]}"
        where = f"RAY_ADDRESS={value} (not the dashboard's; tried its default port)"
    if scheme.lower() not in ("http", "https") or not rest.strip("/"):
        raise SubmitError(f"{where}: expected the head's dashboard address, such as "
                          f"http://HEAD:8265, got {value!r}")
    return f"{scheme.lower()}://{rest.rstrip('/')}", where


def probe(url: str, where: str) -> None:
    """Ray's client waits on an address that does not answer for minutes: ask the
    dashboard's version first, with a deadline. A 401/403 is a dashboard that wants a
    token, which Ray's client then sends; anything else must be the version JSON."""
    hint = ("the head node must run the dashboard (ray start --head --dashboard-host "
            "0.0.0.0 ...) and its port be reachable from here (ray dashboard CLUSTER.yaml "
            "forwards it)")
    try:
        with urllib.request.urlopen(f"{url}/api/version", timeout=PROBE_TIMEOUT_S) as r:
            body = r.read(4096)
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            return
        raise SubmitError(f"{where}: {url} answers, but not as a Ray dashboard (HTTP "
                          f"{e.code}); {hint}") from None
    except http.client.HTTPException:  # not HTTP at all: the GCS port, say
        raise SubmitError(f"{where}: {url} answers, but not as a Ray dashboard (not HTTP: "
                          "the GCS port? the dashboard's is 8265 by default); "
                          f"{hint}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        why = (f"no answer within {PROBE_TIMEOUT_S:g} s"
               if isinstance(reason, (TimeoutError, socket.timeout))
               else getattr(reason, "strerror", None) or one_line(reason))
        raise SubmitError(f"{where}: no Ray dashboard at {url} ({why}); {hint}") from None
    try:
        json.loads(body)["ray_version"]
    except (ValueError, KeyError, TypeError):
        raise SubmitError(f"{where}: {url} answers, but not as a Ray dashboard; {hint}"
                          ) from None


def connect(client_cls: Any, url: str, where: str) -> Any:
    from ray.exceptions import AuthenticationError

    # Ray's client prefers the environment's RAY_API_SERVER_ADDRESS / RAY_ADDRESS over
    # the address it is given: give it ours that way, for this call only.
    saved = os.environ.get("RAY_API_SERVER_ADDRESS")
    os.environ["RAY_API_SERVER_ADDRESS"] = url
    try:
        return client_cls(url)
    except AuthenticationError as e:
        raise SubmitError(f"{where}: the Ray dashboard at {url} refused this command "
                          f"({one_line(e)}); the cluster uses token authentication: set "
                          "RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH to a copy of the "
                          "head's ~/.ray/auth_token") from None
    except (ConnectionError, RuntimeError, OSError) as e:
        raise SubmitError(f"{where}: cannot use the Ray dashboard at {url} "
                          f"({one_line(e)})") from None
    finally:
        if saved is None:
            os.environ.pop("RAY_API_SERVER_ADDRESS", None)
        else:
            os.environ["RAY_API_SERVER_ADDRESS"] = saved

