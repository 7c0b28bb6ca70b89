"""The drafters of the core, which need no weights (none, lookup), and vocabulary shortlists."""
