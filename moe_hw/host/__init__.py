"""Host side of the units: check a user's tensors, run them through the emitted Verilog in
simulation, and score the hardware's results against the golden models."""
