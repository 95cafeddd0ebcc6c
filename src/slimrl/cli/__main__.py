"""`python -m slimrl.cli` = the `slimrl` command."""

from slimrl.cli import run

raise SystemExit(run())
