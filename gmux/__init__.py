"""gmux: many PyTorch training jobs sharing GPUs, suspended and resumed losslessly at mini-batch boundaries."""
__version__ = "0.1.0"
