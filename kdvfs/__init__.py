"""kdvfs: online per-kernel GPU clock tuning for training jobs, within a slowdown budget."""

__version__ = "0.1.0"
