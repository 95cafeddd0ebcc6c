"""One-line notices: what slimrl adjusted, with the old and the new value, said once per process.

slimrl never changes a value the user set without saying so; where it adapts an older script (a renamed argument, a
batch geometry TRL would refuse) it prints one line naming both values. Each distinct line is printed once, so a
loop that builds many configs does not repeat it. The logger is "slimrl" at WARNING, so the line shows by default
and `logging.getLogger("slimrl").setLevel(logging.ERROR)` silences it.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("slimrl")
_said: set[str] = set()


def notice(message: str) -> None:
    """Log `slimrl: <message>` once per process."""
    if message in _said:
        return
    _said.add(message)
    logger.warning("slimrl: %s", message)
