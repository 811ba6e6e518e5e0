"""Stream plumbing: skid buffers, fixed-latency pipeline control and the free-running credit
pipeline, written once and reused."""

from .credit import CreditPipeline, RingQueue
from .fifo import RegisteredFIFO
from .pipeline import (KEPT, PipelineControl, RegisterCopies, delay, kept_signal, lut_increment,
                       replicated, thermometer_down, thermometer_up)
from .skid import ALTERNATE_GROUP_BITS, SkidBuffer

__all__ = ["ALTERNATE_GROUP_BITS", "CreditPipeline", "KEPT", "PipelineControl", "RegisteredFIFO",
           "RegisterCopies", "RingQueue", "delay", "kept_signal", "lut_increment", "replicated",
           "SkidBuffer", "thermometer_down", "thermometer_up"]
