"""The named design points (TOML), installed as ``moe_hw.design_points``."""
