"""`pxvm --help` and every subcommand's: descriptions read as whole sentences, switches
show no `<bool>`, and every option says what it does."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import click
import pytest
import typer.main

from pxvm.cli import app


def _commands(command=None, path=()):
    """(path, click command) of every command, groups included, at any depth."""
    command = command or typer.main.get_command(app)
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


COMMANDS = list(_commands())


def _help(*path):
    env = {**os.environ, "COLUMNS": "400", "TERMINAL_WIDTH": "400"}
    proc = subprocess.run([sys.executable, "-m", "pxvm", *path, "--help"], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("path", [path for path, _ in COMMANDS], ids=" ".join)
def test_every_option_of_every_command_has_help(path):
    command = dict(COMMANDS)[path]
    missing = [p.name for p in command.params if not (getattr(p, "help", None) or "").strip()]
    assert missing == [], f"pxvm {' '.join(path)}: no help for {missing}"


@pytest.mark.parametrize("path", [path for path, _ in COMMANDS], ids=" ".join)
def test_switches_show_no_metavar(path):
    assert "<bool>" not in _help(*path)


def test_each_command_is_described_on_one_line_when_the_terminal_is_wide():
    # a docstring's first paragraph wraps over several source lines; the listing must not
    # break the sentence there
    text = _help()
    for name, command in dict(COMMANDS)[()].commands.items():
        first = " ".join(inspect.cleandoc(command.help).split("\n\n")[0].split())
        # the command's own line: its name first in the box ("pixels" is also a word of
        # another command's description)
        line = next(line for line in text.splitlines()
                    if line.strip("│ ").startswith(f"{name} "))
        assert first.split()[-1].strip("`") in line, (name, line)
