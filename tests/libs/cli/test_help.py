"""Every option of every command shows its default in --help: a value, or what its absence means."""

from __future__ import annotations

import click
from click.testing import CliRunner
from gearshift.cli import main


def commands(group: click.Group, path: tuple[str, ...] = ()):
    for name, command in group.commands.items():
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))


def test_every_option_of_every_command_shows_its_default():
    missing = []
    for path, command in commands(main):
        context = click.Context(command, info_name=path[-1], parent=click.Context(main, info_name="gearshift", **main.context_settings))
        for option in command.params:
            if not isinstance(option, click.Option) or option.is_flag or option.required:
                continue  # a flag is off unless given; a required option has none
            _, text = option.get_help_record(context)
            if "[default: " not in text and "[required]" not in text:
                missing.append(f"gearshift {' '.join(path)} {option.opts[0]}")
    assert missing == []


def test_serve_policy_names_default_its_default_model_and_up_its_port_layout():
    serve_policy = CliRunner().invoke(main, ["serve-policy", "--help"], terminal_width=400).output
    assert "[default: (GEARSHIFT_POLICY_SERVER__MODEL, else default)]" in serve_policy
    up = CliRunner().invoke(main, ["up", "--help"], terminal_width=400).output
    assert "router B, planner B+1, executor B+2, sandbox B+3, reward B+4, store B+5, gateway B+6, policy B+7" in up
    assert "[default: (GEARSHIFT_DATA_DIR, ~/.gearshift)]" in up
