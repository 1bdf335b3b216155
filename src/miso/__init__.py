"""miso: share NVIDIA GPUs among ML training jobs with Multi-Instance GPU (MIG)."""

__version__ = "0.1.0"
