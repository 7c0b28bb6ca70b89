"""specdec's MLX backend: mlx-lm targets, MLX verifiers and tree builders (Metal and CPU).

Importing this package does not import mlx; the plugin's factories do, when asked for. On Linux
the backend's factory loads the system's OpenBLAS for MLX first, when there is one
(``specdec_mlx.blas``). ``specdec_mlx.ops`` holds the public array operations drafters use
(the only module a drafter package imports).
"""
