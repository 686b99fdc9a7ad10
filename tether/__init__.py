"""tether: post-training language models with human feedback, with a ground-truth lab."""

__version__ = "0.1.0"
