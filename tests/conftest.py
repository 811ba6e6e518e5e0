"""Shared pytest fixtures: the simulators (Icarus skipped, with the reason, when absent)."""

import pytest

from moe_hw.flows.simulate import simulator_available


def simulator_params(*sims):
    """pytest params for the given simulators; unavailable ones are skipped with the reason."""
    params = []
    for sim in sims:
        reason = simulator_available(sim)
        marks = [pytest.mark.skip(reason=f"{sim}: {reason}")] if reason else []
        params.append(pytest.param(sim, marks=marks, id=sim))
    return params


STALLS = [pytest.param(0.0, id="no-stall"), pytest.param(0.3, id="stall")]
