"""The ``specdec`` command line: one module per group of commands."""
