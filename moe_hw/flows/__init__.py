"""Flows: Verilog emission, simulation of the emitted Verilog, synthesis and benchmarks."""
