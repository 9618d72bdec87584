"""Plugins that let vLLM serve gearshift's models natively: a2fm_parsers.py holds the tool parser
and the reasoning parser "a2fm" for the A^2FM chat format (gearshift.protocol.parsers, format a2fm),
which vLLM loads by path (--tool-parser-plugin, --reasoning-parser-plugin) in its own virtual
environment; this package itself imports nothing but the standard library, so the platform can
name the files and copy them (`python -m gearshift.vllm_plugins DIR`) without vLLM."""

from __future__ import annotations

import shutil
from pathlib import Path

PARSERS = Path(__file__).with_name("a2fm_parsers.py")
PARSERS_PACKAGE = Path(__file__).parent.parent / "protocol" / "parsers"
CHAT_TEMPLATE = PARSERS_PACKAGE.parent / "a2fm_chat_template.jinja"
PARSER_NAME = "a2fm"
A2FM_TEMPLATE_SETTING = "a2fm"  # a chat_template setting naming CHAT_TEMPLATE


def chat_template_text(setting: str | None) -> str | None:
    """The text of a chat_template setting: "a2fm" the shipped A^2FM template, else a file."""
    if not setting:
        return None
    return CHAT_TEMPLATE.read_text() if setting == A2FM_TEMPLATE_SETTING else Path(setting).read_text()


def vllm_args(directory: Path | None = None, chat_template: bool = True) -> list[str]:
    """vLLM server flags serving the A^2FM model with native tool calls and reasoning: the
    parsers and (chat_template) the chat template, from the package or from a directory
    copy_files filled. Without the template flag, requests name it (vLLM's `chat_template`
    field, with --trust-request-chat-template), as on a server that serves other models too."""
    parsers, template = (PARSERS, CHAT_TEMPLATE) if directory is None else (directory / PARSERS.name, directory / CHAT_TEMPLATE.name)
    args = [
        "--enable-auto-tool-choice", "--tool-call-parser", PARSER_NAME, "--tool-parser-plugin", str(parsers),
        "--reasoning-parser", PARSER_NAME, "--reasoning-parser-plugin", str(parsers),
    ]
    return args + (["--chat-template", str(template)] if chat_template else [])


def copy_files(directory: Path) -> list[Path]:
    """Copies the parsers, the package of formats they load (found beside them) and the chat
    template into one directory, e.g. a volume a vLLM container mounts; returns the copies."""
    directory.mkdir(parents=True, exist_ok=True)
    package = directory / PARSERS_PACKAGE.name
    shutil.rmtree(package, ignore_errors=True)
    shutil.copytree(PARSERS_PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    return [Path(shutil.copy(source, directory / source.name)) for source in (PARSERS, CHAT_TEMPLATE)] + [package]
