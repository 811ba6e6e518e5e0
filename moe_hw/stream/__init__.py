"""Stream plumbing: skid buffers and fixed-latency pipeline control, written once and reused."""

from .pipeline import PipelineControl, delay
from .skid import SkidBuffer

__all__ = ["PipelineControl", "delay", "SkidBuffer"]
