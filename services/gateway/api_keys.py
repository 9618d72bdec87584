"""The gateway's client API keys, apart from the platform's inter-service token: a JSON file of
name -> sha256 hex of the key (the chart mounts it from a Secret), re-read whenever it changes,
so that a key removed from it is refused on the next request, without a restart."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
from pathlib import Path

log = logging.getLogger("gearshift.gateway")

LABEL = "api_key"  # the trajectory label naming the key that caused it (feedback checks it)
PLATFORM_KEY_NAME = "platform"  # the name of the platform token where it is still a client key
ANONYMOUS_KEY_NAME = "anonymous"  # the caller of a gateway that requires no key
# Names a keys file may not give a key: each would be given what the platform token's (or an
# open gateway's callers') trajectories are owed, feedback on them included.
RESERVED_NAMES = (PLATFORM_KEY_NAME, ANONYMOUS_KEY_NAME)
KEY_PREFIX = "gsk-"  # makes a leaked key easy to recognise (secret scanners, logs)


def key_hash(key: str) -> str:
    """What the keys file stores of a key: keys are long random strings, so one sha256 is enough."""
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def check_key_name(name: str) -> None:
    """ValueError when name may not be a client key's (`gearshift keys` should call it too)."""
    if name in RESERVED_NAMES:
        raise ValueError(f"the key name {name!r} is reserved ({', '.join(RESERVED_NAMES)} name the platform's own callers): choose another")


def read_keys(path: Path) -> dict[str, str]:
    """The file's keys as hash -> name; ValueError when it is not a JSON object of name -> sha256
    hex, or names a reserved name."""
    entries = json.loads(path.read_text())
    if not isinstance(entries, dict):
        raise ValueError("expected a JSON object of name -> sha256 hex")
    by_hash = {}
    for name, digest in entries.items():
        check_key_name(name)
        if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest.lower())):
            raise ValueError(f"key {name!r}: expected the sha256 hex of the key (gearshift keys new {name})")
        by_hash[digest.lower()] = name
    return by_hash


class ApiKeys:
    """Whose key an Authorization header carries. Without a keys file the platform token is the one
    client key (as before keys existed); with one, the file's keys, and the platform token only
    where accept_platform_token says so."""

    def __init__(self, path: Path | None, platform_token: str | None, accept_platform_token: bool):
        self.path = path
        self._platform = platform_token if (path is None or accept_platform_token) else None
        self._by_hash: dict[str, str] = {}
        self._version: tuple | None = ("unread",)

    @property
    def required(self) -> bool:
        """Whether a request must carry a key (no file and no token: the gateway is open, as the services are)."""
        return self.path is not None or self._platform is not None

    def describe(self) -> str:
        """What the gateway's start log line says of its client keys."""
        if self.path is not None:
            also = " and the platform token" if self._platform is not None else ""
            return f"client keys from {self.path}{also}"
        return "client key: the platform token" if self._platform is not None else "client keys off: the gateway is open"

    def name_of(self, key: str) -> str | None:
        """The key's name, or None when it is no current key."""
        if self._platform is not None and hmac.compare_digest(key.encode(), self._platform.encode()):
            return PLATFORM_KEY_NAME
        if self.path is None:
            return None
        self.refresh()
        return self._by_hash.get(key_hash(key))

    def refresh(self) -> None:
        """Re-reads the file if it changed (each request; and at start, so that a broken file is logged then)."""
        if self.path is None:
            return
        # One stat per request; a Secret volume swaps a symlink, which changes the inode.
        try:
            stat = os.stat(self.path)
            version = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        except OSError:
            version = None
        if version == self._version:  # unchanged (a missing file was logged once)
            return
        self._version = version
        try:
            self._by_hash = read_keys(self.path)
        except (OSError, ValueError) as exc:  # fail closed: a broken file accepts no key
            self._by_hash = {}
            log.error("API keys file %s unreadable, refusing every client key: %s", self.path, exc)
