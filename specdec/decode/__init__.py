"""The decode step over request slots: requests, plan, loop, batching, budgets, checks."""
