"""gearshift keys: client API keys of the gateway (services/gateway/api_keys.py). The keys file
holds only each key's sha256; the key itself is shown once, to hand to the client."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from gearshift.cli.group import main
from gearshift.services.gateway.api_keys import key_hash, new_key, read_keys

FILE_OPTION = click.option("--file", "keys_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
                           help="Write the entry into this keys file (made if missing) instead of printing it")


@main.group()
def keys() -> None:
    """Client API keys of the gateway: make, hash and revoke entries of its keys file."""


@keys.command("new")
@click.argument("name")
@FILE_OPTION
def keys_new(name: str, keys_file: Path | None) -> None:
    """Make a key named NAME: the key on stderr (hand it to the client), its entry on stdout or in --file."""
    key = new_key()
    click.echo(key, err=True)
    _put(name, key_hash(key), keys_file)


@keys.command("hash")
@click.argument("name")
@FILE_OPTION
def keys_hash(name: str, keys_file: Path | None) -> None:
    """The entry of an existing key, read from stdin, under NAME."""
    key = sys.stdin.readline().strip()
    if not key:
        raise click.ClickException("no key on stdin")
    _put(name, key_hash(key), keys_file)


@keys.command("revoke")
@click.argument("name")
@click.option("--file", "keys_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True, help="The keys file")
def keys_revoke(name: str, keys_file: Path) -> None:
    """Remove NAME's key from the keys file; a gateway reading it refuses the key on its next request."""
    entries = _entries(keys_file)
    if entries.pop(name, None) is None:
        raise click.ClickException(f"no key named {name} in {keys_file}")
    _write(keys_file, entries)


def _put(name: str, digest: str, keys_file: Path | None) -> None:
    if keys_file is None:
        click.echo(json.dumps({name: digest}))
        return
    _write(keys_file, _entries(keys_file) | {name: digest})


def _entries(keys_file: Path) -> dict[str, str]:
    if not keys_file.exists():
        return {}
    try:
        read_keys(keys_file)  # refuse to extend a file the gateway cannot read
    except ValueError as exc:
        raise click.ClickException(f"{keys_file}: {exc}") from None
    return json.loads(keys_file.read_text())


def _write(keys_file: Path, entries: dict[str, str]) -> None:
    # Written beside and renamed over, so that a gateway never reads half a file.
    partial = keys_file.with_name(keys_file.name + ".partial")
    partial.write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n")
    os.replace(partial, keys_file)
