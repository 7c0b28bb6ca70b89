"""``generate``, ``stream``, ``load``: the arguments checked and resolved into a decode plan."""
