"""`python -m pxvm` runs the `pxvm` command."""

from .cli import main

main()
