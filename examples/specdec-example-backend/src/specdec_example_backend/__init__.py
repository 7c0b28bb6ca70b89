"""An example third-party specdec backend: Llama-family targets computed in float32 NumPy."""
