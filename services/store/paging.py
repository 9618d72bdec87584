"""Opaque page tokens: a keyset position bound to the filter it was issued for."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json

from gearshift.errors import InvalidArgument
from gearshift.storage.repository import Keyset, TrajectoryFilter

MAX_TOKEN_CHARS = 1_024


def filter_digest(flt: TrajectoryFilter) -> str:
    return hashlib.sha256(repr(flt).encode()).hexdigest()[:16]


def encode_page_token(position: Keyset, flt: TrajectoryFilter) -> str:
    raw = json.dumps([position.created_at_us, position.id, filter_digest(flt)], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_page_token(token: str, flt: TrajectoryFilter) -> Keyset | None:
    """The position a token continues from; None for the first page."""
    if not token:
        return None
    if len(token) > MAX_TOKEN_CHARS:
        raise InvalidArgument("page_token is malformed")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        created_at_us, trajectory_id, digest = json.loads(raw)
    except (binascii.Error, ValueError, TypeError):
        raise InvalidArgument("page_token is malformed") from None
    if not (isinstance(created_at_us, int) and isinstance(trajectory_id, str) and isinstance(digest, str)):
        raise InvalidArgument("page_token is malformed")
    if digest != filter_digest(flt):
        raise InvalidArgument("page_token was issued for a different filter")
    return Keyset(created_at_us, trajectory_id)
