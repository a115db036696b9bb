"""``python -m gasloc_emu``: the console script, for environments without it on PATH."""
from gasloc_emu.commands.entry import main

main()
