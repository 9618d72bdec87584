"""gearshift keys: client API keys of the gateway (services/gateway/api_keys.py). The keys file
holds only each key's sha256; the key itself is shown once, to hand to the client.

A name holds one key: a second `keys new NAME` is refused, and `--replace` rotates, keeping the
old key valid as NAME.previous until `keys revoke NAME.previous`, so that a client switches to the
new key without a moment refused. The names the gateway reserves (`platform`, ...) are refused."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from gearshift.cli.group import main
from gearshift.services.gateway.api_keys import check_key_name, key_hash, new_key, read_keys

PREVIOUS = ".previous"  # NAME.previous: NAME's key before `--replace`, valid until revoked
FILE_OPTION = click.option("--file", "keys_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
                           show_default="none: the entry is printed", help="Write the entry into this keys file (made if missing)")
REPLACE_OPTION = click.option("--replace", is_flag=True,
                              help=f"Rotate NAME's key in --file: the new key becomes NAME, the old one stays valid as NAME{PREVIOUS} "
                              f"until `gearshift keys revoke NAME{PREVIOUS}` (refused while an older NAME{PREVIOUS} is still there)")


@main.group()
def keys() -> None:
    """Client API keys of the gateway: make, hash, list and revoke entries of its keys file.

    A name holds one key: `keys new NAME --file F` refuses a NAME that F holds; `--replace`
    rotates, keeping the old key valid as NAME.previous until `keys revoke NAME.previous`.
    The names the gateway reserves for the platform's own callers (`platform`, ...) are refused."""


@keys.command("new")
@click.argument("name")
@FILE_OPTION
@REPLACE_OPTION
def keys_new(name: str, keys_file: Path | None, replace: bool) -> None:
    """Make a key named NAME: the key on stderr (hand it to the client), its entry on stdout or in --file.
    A name --file already holds is refused unless --replace."""
    entries = _checked(name, keys_file, replace)  # before the key is shown: a refused one is never handed out
    key = new_key()
    click.echo(key, err=True)
    _put(name, key_hash(key), keys_file, entries)


@keys.command("hash")
@click.argument("name")
@FILE_OPTION
@REPLACE_OPTION
def keys_hash(name: str, keys_file: Path | None, replace: bool) -> None:
    """The entry of an existing key, read from stdin, under NAME (refused as `keys new` refuses)."""
    entries = _checked(name, keys_file, replace)
    key = sys.stdin.readline().strip()
    if not key:
        raise click.ClickException("no key on stdin")
    _put(name, key_hash(key), keys_file, entries)


@keys.command("list")
@click.option("--file", "keys_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True, help="The keys file")
def keys_list(keys_file: Path) -> None:
    """The names of the keys file's keys, one a line (never the keys: the file holds only their hashes)."""
    for name in sorted(_entries(keys_file)):
        rotated = name.endswith(PREVIOUS) and name.removesuffix(PREVIOUS)
        click.echo(f"{name}  ({rotated}'s key before --replace; `keys revoke {name}` ends it)" if rotated else name)


@keys.command("revoke")
@click.argument("name")
@click.option("--file", "keys_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True, help="The keys file")
def keys_revoke(name: str, keys_file: Path) -> None:
    """Remove NAME's key from the keys file; a gateway reading it refuses the key on its next request."""
    entries = _entries(keys_file)
    if entries.pop(name, None) is None:
        raise click.ClickException(f"no key named {name} in {keys_file}")
    _write(keys_file, entries)


def _checked(name: str, keys_file: Path | None, replace: bool) -> dict[str, str]:
    """The keys file's entries, once NAME may be written to it: a reserved name, a name taken
    (without --replace) and a rotation that would silently end a key are refused, in one line."""
    try:
        check_key_name(name)  # the gateway's own reserved names (platform, ...)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if name.endswith(PREVIOUS):
        raise click.ClickException(f"names ending in {PREVIOUS} are reserved for rotated keys (keys new NAME --replace)")
    if keys_file is None:
        if replace:
            raise click.ClickException("--replace rotates a key in a keys file: give it with --file")
        return {}
    entries = _entries(keys_file)
    if replace:
        if name not in entries:
            raise click.ClickException(f"no key named {name} in {keys_file} to replace (without --replace, keys new adds one)")
        if name + PREVIOUS in entries:
            raise click.ClickException(f"{name}{PREVIOUS} still holds the key before the last rotation: "
                                       f"gearshift keys revoke {name}{PREVIOUS} --file {keys_file}, then rotate")
    elif name in entries:
        raise click.ClickException(f"{keys_file} already has a key named {name}: --replace rotates it (the old key stays valid as "
                                   f"{name}{PREVIOUS} until revoked), or choose another name")
    return entries


def _put(name: str, digest: str, keys_file: Path | None, entries: dict[str, str]) -> None:
    if keys_file is None:
        click.echo(json.dumps({name: digest}))
        return
    if name in entries:  # --replace: the old key stays, under NAME.previous
        entries = entries | {name + PREVIOUS: entries[name]}
    _write(keys_file, entries | {name: digest})


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
