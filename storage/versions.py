"""The installed versions of the libraries a run depends on, read in one place so that a
run's record and the best-config cache's key spell them alike."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata

ABSENT = "absent"  # what a library not installed here is recorded as


def installed_versions(dists: Mapping[str, str]) -> dict[str, str]:
    """{key: version} for each {distribution name: key} of dists, in its order; a
    distribution not installed is ABSENT."""
    out: dict[str, str] = {}
    for dist, key in dists.items():
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[key] = ABSENT
    return out
