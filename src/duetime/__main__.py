"""`python -m duetime` runs the command line."""

from duetime.cli import main

raise SystemExit(main())
