"""``python -m specdec``: the ``specdec`` command (as ``python -m specdec.cli``)."""

from specdec.cli.main import main

raise SystemExit(main())
