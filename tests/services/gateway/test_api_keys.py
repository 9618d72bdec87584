"""The gateway's keys file read on its own: names by key, the platform token's place, a change
seen on the next look-up, a broken file accepting nothing, and the CLI that writes entries."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner
from gearshift.cli import main
from gearshift.services.gateway.api_keys import PLATFORM_KEY_NAME, ApiKeys, key_hash, new_key, read_keys

ALICE, BOB = new_key(), new_key()


def write(path, entries: dict[str, str]) -> None:
    partial = path.with_name("partial")
    partial.write_text(json.dumps(entries))
    os.replace(partial, path)  # as a Secret volume swaps its files: never half a file


@pytest.fixture
def keys_file(tmp_path):
    path = tmp_path / "keys.json"
    write(path, {"alice": key_hash(ALICE), "bob": key_hash(BOB)})
    return path


def test_a_key_is_known_by_its_name_and_a_removed_one_at_once(keys_file):
    keys = ApiKeys(keys_file, "platform-token", accept_platform_token=False)
    assert (keys.name_of(ALICE), keys.name_of(BOB), keys.name_of("guess"), keys.required) == ("alice", "bob", None, True)
    write(keys_file, {"alice": key_hash(ALICE)})
    assert (keys.name_of(ALICE), keys.name_of(BOB)) == ("alice", None)


def test_the_platform_token_is_a_client_key_only_without_a_file_or_when_a_setting_says_so(keys_file):
    assert ApiKeys(keys_file, "platform-token", accept_platform_token=False).name_of("platform-token") is None
    assert ApiKeys(keys_file, "platform-token", accept_platform_token=True).name_of("platform-token") == PLATFORM_KEY_NAME
    before_keys = ApiKeys(None, "platform-token", accept_platform_token=False)
    assert (before_keys.name_of("platform-token"), before_keys.name_of(ALICE), before_keys.required) == (PLATFORM_KEY_NAME, None, True)
    assert not ApiKeys(None, None, accept_platform_token=False).required  # no token, no file: open, as the services are


@pytest.mark.parametrize("text", ["not json", '["alice"]', '{"alice": "not-a-sha256"}'])
def test_a_broken_or_missing_file_accepts_no_key(keys_file, text):
    keys = ApiKeys(keys_file, None, accept_platform_token=False)
    assert keys.name_of(ALICE) == "alice"
    keys_file.write_text(text)
    assert keys.name_of(ALICE) is None
    keys_file.unlink()
    assert keys.name_of(ALICE) is None
    write(keys_file, {"alice": key_hash(ALICE)})
    assert keys.name_of(ALICE) == "alice"


def test_the_cli_makes_hashes_and_revokes_entries(tmp_path):
    path, runner = tmp_path / "keys.json", CliRunner()
    made = runner.invoke(main, ["keys", "new", "alice", "--file", str(path)])
    assert made.exit_code == 0, made.output
    key = made.stderr.strip()
    assert read_keys(path) == {key_hash(key): "alice"} and key.startswith("gsk-")

    hashed = runner.invoke(main, ["keys", "hash", "bob"], input="a-key-of-bob's\n")
    assert json.loads(hashed.stdout) == {"bob": key_hash("a-key-of-bob's")}

    assert runner.invoke(main, ["keys", "revoke", "alice", "--file", str(path)]).exit_code == 0
    assert read_keys(path) == {}
    assert runner.invoke(main, ["keys", "revoke", "alice", "--file", str(path)]).exit_code != 0
