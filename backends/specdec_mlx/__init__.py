"""specdec's MLX backend: mlx-lm targets, MLX verifiers and tree builders (Metal and CPU).

Importing this package does not import mlx; the plugin's factories do, when asked for.
"""
