"""Text from model files (token texts, general.name, architectures, error messages quoting
them) made safe to print: a vocabulary entry or a name may hold terminal escape
sequences (ESC [ 2 J clears the screen, ESC ] 0 ; ... BEL retitles the window) or rich
markup ("[/]" ends a style that was never opened, and rich raises).

Control characters other than newline and tab, C0 (U+0000-U+001F), DEL and C1
(U+0080-U+009F), are printed as their Python escapes: ESC shows as the four characters
`\\x1b`. Only what the CLI prints is changed; the Python API and the server (JSON) keep
the raw text."""

from __future__ import annotations

import re

from rich.markup import escape

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """`text` with its control characters (but newline and tab) shown as `\\xNN`."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def plain(text: str) -> str:
    """`text` for a rich console: control characters shown, markup escaped."""
    return escape(visible(text))
