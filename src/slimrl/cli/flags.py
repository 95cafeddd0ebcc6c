"""A flag the parser cannot use, said in one line: the error, the closest flags ("did you mean --x?") and a pointer to
--help, instead of argparse's usage text (hundreds of lines for a training command) before the error.

`concise_errors(parser, command)` makes the parser's errors raise FlagError (a ValueError, so the command prints it as
a user error, face.py); `unknown_flags_error` rewrites HfArgumentParser's "Some specified arguments are not used".
"""

from __future__ import annotations

import difflib
import re


class FlagError(ValueError):
    """A flag or a flag's value the command's parser refused."""


def flag_names(parser) -> list[str]:
    """The parser's long flags, one spelling each (`--learning_rate`, not also its alias `--learning-rate`)."""
    seen, names = set(), []
    for option in parser._option_string_actions:
        key = option.replace("-", "_")
        if option.startswith("--") and key not in seen:
            seen.add(key)
            names.append(option)
    return names


def closest(parser, flag: str) -> str:
    """`flag`, with the closest known flags when there are any."""
    close = difflib.get_close_matches(flag.split("=", 1)[0], flag_names(parser), n=2, cutoff=0.7)
    return f"{flag} (did you mean {' or '.join(close)}?)" if close else flag


def help_pointer(command: str) -> str:
    return f"`slimrl {command} --help` lists every flag with its default."


def unknown_flags(parser, argv: list[str]) -> list[str]:
    """The `--flags` of argv the parser knows under no name or prefix."""
    known = parser._option_string_actions
    found = []
    for arg in argv:
        name = arg.split("=", 1)[0]
        if name.startswith("--") and len(name) > 2 and not any(option.startswith(name) for option in known):
            found.append(name)
    return found


def flag_error(parser, command: str, message: str, argv: list[str]) -> FlagError:
    """argparse's `message`, the unknown flags of argv named with the closest known ones, and the --help pointer."""
    unknown = [f for f in unknown_flags(parser, argv) if f not in message]
    extra = f"; unknown flag(s): {', '.join(closest(parser, f) for f in unknown)}" if unknown else ""
    return FlagError(f"{message}{extra}. {help_pointer(command)}")


def unknown_flags_error(parser, command: str, exc: ValueError) -> FlagError | None:
    """HfArgumentParser's "Some specified arguments are not used ..." as FlagError (None for any other error)."""
    text = str(exc)
    if "Some specified arguments are not used" not in text:
        return None
    flags = re.findall(r"'(--[^']+)'", text) or re.findall(r"'([^']+)'", text)
    return FlagError(f"unknown flag(s): {', '.join(closest(parser, f) for f in flags)}. {help_pointer(command)}")


def concise_errors(parser, command: str, argv: list[str]):
    """`parser`, its errors raised as FlagError (no usage text); returns the parser."""

    def error(message: str):
        raise flag_error(parser, command, message, argv)

    from slimrl.swaps import swap

    swap(parser, "error", error, "one-line flag errors (cli/flags.py)")
    return parser
