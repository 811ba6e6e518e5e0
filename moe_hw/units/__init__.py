"""The MoE units, one per file: unit ``U`` is ``moe_hw/units/U.py``, its declaration and host
adapter ``moe_hw/host/U.py``, its cocotb bench ``sim/bench_U.py``, its tests
``tests/test_U.py``. The float units ``fmul`` and ``fadd`` are the arithmetic blocks of
``moe_hw/arith/``."""
