"""Triton kernels for the engine on GPUs; each module keeps a PyTorch reference it is tested against."""
