"""`locust -f loadtest/tts.py --help` with the suite's options in it.

Locust 2.47 prints --help before it reads a locustfile (locustio/locust#2917), so options the locustfile adds never
show. The venv's `tts_locust_help.pth` (copied there by `make venv`) calls `install` at interpreter start-up, before
Locust parses anything; `install` hooks the options onto Locust's parser only for a locust process asked for help
about this locustfile, and does nothing (imports nothing) in every other process.
"""

from __future__ import annotations

import os

LOCUSTFILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tts.py")


def asks_for_our_help(argv: list[str]) -> bool:
    """argv (the interpreter's own, sys.orig_argv) runs locust (`locust ...` or `python -m locust ...`) asking for
    help, with -f/--locustfile naming loadtest/tts.py."""
    for i, arg in enumerate(argv):
        if os.path.basename(arg) == "locust" or (arg == "locust" and i and argv[i - 1] == "-m"):
            args = argv[i + 1:]
            break
    else:
        return False
    if not {"-h", "--help"} & set(args):
        return False
    files: list[str] = []
    for i, arg in enumerate(args):
        if arg in ("-f", "--locustfile") and i + 1 < len(args):
            files += args[i + 1].split(",")
        elif arg.startswith("--locustfile="):
            files += arg.split("=", 1)[1].split(",")
        elif arg.startswith("-f") and len(arg) > 2:
            files += arg[2:].lstrip("=").split(",")
    return any(os.path.abspath(f.strip()) == LOCUSTFILE for f in files)


_installed: list[bool] = []


def install(argv: list[str]) -> None:
    """Idempotent: the interpreter may read the venv's .pth files more than once in one process."""
    if _installed or not asks_for_our_help(argv):
        return
    _installed.append(True)
    from locust import events

    from loadtest.locust_cli import add_options

    events.init_command_line_parser.add_listener(lambda parser, **_kw: add_options(parser))
