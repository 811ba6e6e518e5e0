"""Stream plumbing: skid buffers, fixed-latency pipeline control and the free-running credit
pipeline, written once and reused."""

from .credit import CreditPipeline, RingQueue
from .fifo import RegisteredFIFO
from .pipeline import PipelineControl, delay, replicated
from .skid import SkidBuffer

__all__ = ["CreditPipeline", "PipelineControl", "RegisteredFIFO", "RingQueue", "delay",
           "replicated", "SkidBuffer"]
