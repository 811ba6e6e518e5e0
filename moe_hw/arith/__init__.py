"""Arithmetic blocks: IEEE-754 float formats, multiplier and adder."""
