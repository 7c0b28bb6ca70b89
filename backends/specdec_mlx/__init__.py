"""specdec's MLX backend: mlx-lm targets, MLX verifiers and tree builders (Metal and CPU).

Importing this package does not import mlx; the plugin's factories do, when asked for. On Linux
it loads the system's OpenBLAS for MLX first, when there is one (``specdec_mlx.blas``).
"""

from specdec_mlx.blas import prefer_system_blas

prefer_system_blas()
