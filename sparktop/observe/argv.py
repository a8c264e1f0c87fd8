"""Reading command lines: the flags a server was started with.

Shared by the discovery parsers (`hostparse`, `host_probe`) and the engine
modules (`observe/engines/`), which each know their own flags.
"""

from __future__ import annotations


def flag_value(argv: list[str], *names: str) -> str | None:
    """The value of the first of `names` a command line gives (`--flag V` or `--flag=V`)."""
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def flag_int(argv: list[str], *names: str) -> int | None:
    """An integer flag, or None when absent or not a number."""
    value = flag_value(argv, *names)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def flag_port(argv: list[str], default: int, *names: str) -> int:
    """The port a server was told to listen on (`--port`, or `names`), else `default`."""
    port = flag_int(argv, *(names or ("--port",)))
    return port if port is not None and 0 < port < 65536 else default


def basename(arg: str) -> str:
    return arg.rsplit("/", 1)[-1]


def after(argv: list[str], word: str) -> list[str]:
    """The arguments after the first `word` (a subcommand), or []."""
    return argv[argv.index(word) + 1:] if word in argv else []


def positional(argv: list[str]) -> str | None:
    """The first argument that is not a flag (a subcommand's MODEL)."""
    return next((a for a in argv if not a.startswith("-")), None)
