"""``python -m specdec.cli``: the ``specdec`` command."""

from specdec.cli.main import main

raise SystemExit(main())
