"""The building blocks the MoE units share, each written once: the run control, the slot
address generator, the counter bank, the prefix sum and the row reader."""
