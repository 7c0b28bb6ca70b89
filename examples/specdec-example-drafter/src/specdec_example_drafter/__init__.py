"""An example third-party specdec drafter: n-gram continuations copied from each row's own text."""
