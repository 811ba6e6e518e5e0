"""The scan_layers_unrolled unit's declaration: the scan_layers problem (same npz keys, same
golden model, same bench) on a chain of L copies of the layer datapath, for comparison."""

from ..units.scan_layers_unrolled import ScanLayersUnrolledParams, ScanLayersUnrolledUnit
from .checks import HostError
from .scan_layers import ScanLayers

__all__ = ["UNIT", "ScanLayersUnrolled"]


class ScanLayersUnrolled(ScanLayers):
    name = "scan_layers_unrolled"
    summary = ("scan_layers unrolled: L copies of the layer relu?(a_l * h + b_l) in a chain "
               "(generation-time L), for comparison with the single-body scan (SPEC 1.7)")
    params = ScanLayersUnrolledParams
    ideal = "one beat per cycle: S*ceil(H/lanes)"
    ports = ("tokens", "hidden", "relu")

    def build(self, params):
        return ScanLayersUnrolledUnit(params)

    def smallest(self, problem):
        return dict(max_tokens=max(1, problem["tokens"]), max_hidden=max(1, problem["hidden"]),
                    layers=problem["layers"])

    def fits(self, problem, params):
        super().fits(problem, params.layer.replace(max_layers=problem["layers"]))
        if problem["layers"] != params.layers:
            raise HostError(f"scale and bias have {problem['layers']} layers, but the unit is "
                            f"built for layers = {params.layers}")

    def ideal_cycles(self, problem, params):
        return problem["tokens"] * self.beats(problem, params)


UNIT = ScanLayersUnrolled()
