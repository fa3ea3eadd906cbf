"""How `pxvm --help` looks: help text as Markdown, so a docstring's line breaks are not
kept in the middle of a sentence, and switches (--quick, --json) shown without the
`<bool>` Typer puts after every option."""

from __future__ import annotations

import typer
from typer.core import TyperCommand, TyperGroup
from typer.models import DefaultPlaceholder

#: Typer's rich markup modes: "markdown" joins a paragraph's lines, "rich" keeps them
MARKUP_MODE = "markdown"


def _switches_without_metavar(params: list) -> list:
    for param in params:
        if getattr(param, "is_flag", False):
            param.metavar = ""  # Typer shows a metavar if set, else the type: a switch takes none
    return params


class Command(TyperCommand):
    def get_params(self, ctx):
        return _switches_without_metavar(super().get_params(ctx))


class Group(TyperGroup):
    def get_params(self, ctx):
        return _switches_without_metavar(super().get_params(ctx))


def apply(app: typer.Typer) -> None:
    """Give every command and group of `app`, at any depth, the classes above."""
    if _default(app.info.cls, TyperGroup):
        app.info.cls = Group
    for command in app.registered_commands:
        if _default(command.cls, TyperCommand):  # a command's own class stays
            command.cls = Command
    for group in app.registered_groups:
        if _default(group.cls, TyperGroup):
            group.cls = Group
        apply(group.typer_instance)


def _default(cls, typer_class) -> bool:
    """Whether `cls` is Typer's default (unset, a placeholder for it, or Typer's class)."""
    return cls is None or isinstance(cls, DefaultPlaceholder) or cls is typer_class
