"""`gearshift keys` as an operator uses it: a name holds one key, `--replace` rotates without a
moment in which the client is refused, and the platform token's name is nobody's."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from gearshift.cli import main
from gearshift.services.gateway.api_keys import ApiKeys


def keys(*args: str, stdin: str | None = None):
    return CliRunner().invoke(main, ["keys", *args], input=stdin)


def test_a_second_key_of_one_name_is_refused_in_one_line_and_the_first_still_works(tmp_path):
    path = tmp_path / "keys.json"
    first = keys("new", "alice", "--file", str(path))
    assert first.exit_code == 0
    second = keys("new", "alice", "--file", str(path))
    assert second.exit_code == 1 and second.stdout == ""
    assert second.stderr == (f"Error: {path} already has a key named alice: --replace rotates it (the old key stays valid as "
                             "alice.previous until revoked), or choose another name\n")  # and no new key was shown
    assert ApiKeys(path, None, accept_platform_token=False).name_of(first.stderr.strip()) == "alice"
    assert keys("hash", "alice", "--file", str(path), stdin="another\n").exit_code == 1


def test_replace_rotates_keeping_the_old_key_until_it_is_revoked(tmp_path):
    path = tmp_path / "keys.json"
    old = keys("new", "alice", "--file", str(path)).stderr.strip()
    rotated = keys("new", "alice", "--file", str(path), "--replace")
    assert rotated.exit_code == 0, rotated.output
    new = rotated.stderr.strip()
    gateway = ApiKeys(path, None, accept_platform_token=False)  # the gateway's own reading of the file
    assert (gateway.name_of(new), gateway.name_of(old)) == ("alice", "alice.previous")
    assert keys("list", "--file", str(path)).stdout.splitlines() == [
        "alice", "alice.previous  (alice's key before --replace; `keys revoke alice.previous` ends it)"]

    again = keys("new", "alice", "--file", str(path), "--replace")  # would end the old key unasked
    assert again.exit_code == 1 and "keys revoke alice.previous" in again.stderr and len(again.stderr.splitlines()) == 1

    assert keys("revoke", "alice.previous", "--file", str(path)).exit_code == 0
    assert (gateway.name_of(new), gateway.name_of(old)) == ("alice", None)
    assert keys("new", "alice", "--file", str(path), "--replace").exit_code == 0


@pytest.mark.parametrize("args", [("new", "platform"), ("new", "platform", "--file", "{file}"), ("hash", "platform"), ("new", "anonymous"),
                                  ("new", "bob.previous", "--file", "{file}"), ("new", "nobody", "--file", "{file}", "--replace"),
                                  ("new", "bob", "--replace")])
def test_reserved_names_and_rotations_of_nothing_are_refused_in_one_line(tmp_path, args):
    path = tmp_path / "keys.json"
    result = keys(*(arg.format(file=path) for arg in args), stdin="a-key\n")
    assert result.exit_code == 1 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("Error: ")
    assert not path.exists() or json.loads(path.read_text()) == {}
