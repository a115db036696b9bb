"""Exit codes of every command, in one place (the README's table lists the same)."""

OK = 0
RUN_FAILED = 1     # a worker died, reported an error or went silent; the record says which
BAD_INPUT = 2      # refused before anything ran: settings, data, a record folder we cannot use
DIVERGED = 3       # non-finite parameters or losses: the record names the worker and round
INTERNAL = 4       # an error in gasloc-emu itself: the record holds it, please report it
UNFAITHFUL = 5     # finished, but --require-faithful and the fidelity verdict is degraded
INTERRUPTED = 130  # Ctrl-C or SIGTERM; the record (where one exists) says "stopped"
