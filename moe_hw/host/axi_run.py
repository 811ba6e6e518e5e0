"""What the units' runs behind their AXI wrappers share (``run_axi`` of ``dispatch``,
``combine_gather``, ``moe_re_routing``): the wrapper built and simulated under its cocotb
bench (``sim/bench_<unit>_axi.py``, cocotbext-axi models), the RAM's size around the
buffers, and the findings every run checks after ``irq``."""

from ..axi import AxiParams

__all__ = ["check_base", "ram_size", "simulate_axi", "status_findings"]


def check_base(name, base, bus_bytes):
    if base % bus_bytes:
        raise ValueError(f"{name} must be a multiple of the bus width ({bus_bytes} bytes), "
                         f"not {base:#x}")


def ram_size(*ends):
    """A RAM size in whole 4 KiB pages, one page past the last of ``ends`` (byte addresses)."""
    return -(-(max(ends) + 4096) // 4096) * 4096


def simulate_axi(unit, params, axi, stimulus, settings, *, sim, progress, bench=None):
    """Simulate ``unit`` at ``params`` behind its AXI wrapper (``axi``) on
    ``sim/bench_<unit>_axi.py`` (or the bench named ``bench``: a unit with another's ports);
    ``settings`` gets the register map and the wrapper's ``max_burst``. Returns ``(results,
    wrapper)``."""
    from ..flows.simulate import simulate
    axi = axi or AxiParams()
    wrapper = unit.build_axi(params, axi)
    # A design already emitted in this process is reused, and this wrapper then goes
    # unelaborated: that is expected.
    wrapper._MustUse__silence = wrapper.unit._MustUse__silence = True
    settings = {**settings, "registers": wrapper.register_map(),
                "max_burst": axi.axi_max_burst}
    top = f"{unit.name}_axi"
    results = simulate(wrapper, top, bench or f"bench_{top}", stimulus, sim=sim,
                       settings=settings, key=(top, params, axi), progress=progress)
    return results, wrapper


def status_findings(results):
    """``STATUS`` must read done and nothing else after the run, ``IRQ.done`` be cleared."""
    findings = []
    status = int(results["status"])
    if status & 0b11111 != 0b00010:
        findings.append(f"STATUS reads {status:#x} after done (want done only)")
    if int(results["irq_after"]):
        findings.append("IRQ.done still set after it was cleared")
    return findings
