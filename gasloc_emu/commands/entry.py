"""The ``gasloc-emu`` console script: Ctrl-C at any moment, imports included, exits 130.

It imports nothing of ours until inside the try, so an interrupt while click, numpy or torch
load is one line and exit 130, like an interrupt anywhere else.
"""
import sys


def main() -> None:
    try:
        from gasloc_emu.commands.cli import run_cli
        code = run_cli()
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        code = 130  # exitcodes.INTERRUPTED, which may not have loaded yet
    sys.exit(code)
