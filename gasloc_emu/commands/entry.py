"""The ``gasloc-emu`` console script: Ctrl-C at any moment, imports included, exits 130.

It imports nothing of ours until inside the try, so an interrupt while click, numpy or torch
load is one line and exit 130, like an interrupt anywhere else.
"""
import signal
import sys

INTERRUPTED = 130   # exitcodes.INTERRUPTED, which may not have loaded yet


# Libraries whose import runs C++ that calls back into Python (pybind11): a KeyboardInterrupt
# raised inside it becomes a C++ exception that aborts the process ("terminate called after
# throwing an instance of 'pybind11::error_already_set'"). Ctrl-C waits until they are loaded.
NATIVE_IMPORTS = ("torch",)
REDELIVER_POLL_S = 0.01


def _loading_native() -> bool:
    for name in NATIVE_IMPORTS:
        spec = getattr(sys.modules.get(name), "__spec__", None)
        if spec is not None and getattr(spec, "_initializing", False):
            return True
    return False


def _redeliver_when_loaded() -> None:
    import os
    import time
    while _loading_native():
        time.sleep(REDELIVER_POLL_S)
    os.kill(os.getpid(), signal.SIGINT)


def _on_sigint(signum, frame) -> None:
    """Python's own reaction (KeyboardInterrupt), except while a native import runs: then the
    signal is sent again once it has finished."""
    if _loading_native():
        import threading
        threading.Thread(target=_redeliver_when_loaded, daemon=True).start()
        return
    raise KeyboardInterrupt


def main() -> None:
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)   # not where SIGINT is ignored (a background job)
    try:
        from gasloc_emu.commands.cli import run_cli
        code = run_cli()
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        code = INTERRUPTED
    except SystemExit as exc:        # a command's own exit (friendly_errors: 130 on Ctrl-C)
        code = exc.code
    if code == INTERRUPTED:
        _exit_interrupted()
    sys.exit(code)


def _exit_interrupted() -> None:
    """Exit 130 even when the interrupt passed through C code that ran Python (pybind11's
    exec, as torch's import does): CPython then marks the KeyboardInterrupt as unhandled,
    whoever caught it, and Py_RunMain ends the process by SIGINT instead of our exit code
    (Modules/main.c, ``unhandled_keyboard_interrupt``). So: no second interrupt, the atexit
    work done, streams flushed, and a direct exit."""
    import atexit
    import contextlib
    import os
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(INTERRUPTED)
