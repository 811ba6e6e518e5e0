"""moe_hw: streaming FPGA hardware for the data-movement operators of Mixture-of-Experts layers.

Every unit is an Amaranth ``wiring.Component``; every unit has a NumPy golden model in
:mod:`moe_hw.golden`; ``python -m moe_hw.gen`` emits Verilog and ``python -m moe_hw.run``
simulates the emitted Verilog on a user's arrays.
"""

__version__ = "0.1.0"
