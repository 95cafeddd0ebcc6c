"""`python -m slimrl.cli` = the `slimrl` command."""

from slimrl.cli import main

raise SystemExit(main())
