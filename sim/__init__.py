"""The cocotb benches and their harness, installed as ``moe_hw.sim``. cocotb loads each
bench as a top-level module with this folder on its path."""
