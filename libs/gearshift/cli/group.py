"""The `gearshift` command group, in a module of its own: each command module adds its commands
to it, and the package imports those modules, so none of them imports the package back."""

from __future__ import annotations

import click

# Commands that serve rather than call: they take their addresses from settings alone.
SERVING_COMMANDS = {"serve", "serve-policy", "up", "demo"}


# show_default: every command's --help shows every option's default (the subcommands inherit it).
@click.group(context_settings={"show_default": True})
@click.pass_context
def main(context: click.Context) -> None:
    """gearshift: an adaptive agent platform.

    Commands that call the platform find a `gearshift up` running from the data directory
    (GEARSHIFT_DATA_DIR, default ~/.gearshift) by the stack.json it writes there, on whatever
    ports it serves; a GEARSHIFT_*_ADDR variable, where set, wins (docs/settings.md)."""
    if context.invoked_subcommand not in SERVING_COMMANDS:
        from gearshift.cli.common import use_running_stack
        from gearshift.settings import get_settings

        use_running_stack(get_settings())
