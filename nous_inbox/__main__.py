"""``python -m nous_inbox`` runs the ``nous-inbox`` command."""

from nous_inbox.cli import main

raise SystemExit(main())
