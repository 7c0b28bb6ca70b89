"""The float64 NumPy reference of every specdec algorithm; the ``numpy`` backend."""
