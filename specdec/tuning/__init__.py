"""Measured on this machine and cached: the fastest dtype, beam plans, costs, exact mode."""
