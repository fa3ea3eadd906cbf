"""Text from model files printed by the CLI: control characters shown as escapes, rich
markup shown as written."""

from __future__ import annotations

from rich.console import Console

from pxvm.cli.terminal import plain, visible


def test_control_characters_are_shown_as_escapes_but_newline_and_tab_kept():
    text = "a\x1b]0;pwned\x07b\x1b[2Jc\r\x00\x7f\x9b\u0085d\n\te"
    assert visible(text) == "a\\x1b]0;pwned\\x07b\\x1b[2Jc\\x0d\\x00\\x7f\\x9b\\x85d\n\te"


def test_printable_text_is_unchanged():
    text = "Bonjour à tous 🙂 ▁x <|im_end|> [b]not markup[/b]"
    assert visible(text) == text


def test_markup_in_names_prints_as_written():
    console = Console(record=True, width=200, color_system=None)
    console.print(plain("[/] evil [bold]name\x1b[2J"))
    assert console.export_text().rstrip("\n") == "[/] evil [bold]name\\x1b[2J"
