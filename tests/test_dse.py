"""``python -m moe_hw.dse``: a two-point sweep on iCE40 (the multiplier on the DUET toy gate
multiply, bf16, two pipeline depths) writes outputs that parse, with the workload's cycles
from the unit's formula and the Pareto fronts marked; a re-run takes both points from the
cache; a failed point is a row with its reason; the same sweep on a Dask ``LocalCluster``
gives the same figures; bad sweeps end in one line. The Pareto function is checked on
synthetic data.

Every unit of ``gen list`` has a workload and a design point, and every design point's
workload (random data at its sizes, the problem, the cycle formula) is planned without
synthesis; two new points run bit-exact on the fast path with the formula's cycles.

No timing is asserted: Fmax is a figure to read. The sweeps on ECP5 are benchmarks, run by
hand (README, "Design space").
"""

import csv
import json
import math

import pytest

from moe_hw import dse
from moe_hw.arith.params import FmulParams
from moe_hw.dse import WORKLOADS, explore, pareto_front
from moe_hw.host.checks import HostError
from moe_hw.params import ParameterError
from moe_hw.registry import design_points, units
from moe_hw.run import run_unit
from moe_hw.synth import synth_params

from conftest import FAST_SIM

PROG = "python -m moe_hw.dse"
WORKLOAD = "duet_toy_gate"          # fmul, 336 products
SWEEPS = {"format": ["bf16"], "mul_stages": [2, 3]}
ARGV = ["fmul", "--workload", WORKLOAD, "--sweep", "format=bf16", "--sweep", "mul_stages=2,3",
        "--target", "ice40-up5k"]
#: what may differ between two runs of the same points: where they came from
WHERE_FROM = {"cached"}


def _same_figures(rows):
    return [{key: value for key, value in row.items() if key not in WHERE_FROM}
            for row in rows]


# ---- the Pareto front on synthetic data -------------------------------------------------------

def test_pareto_front_on_synthetic_data():
    points = [
        (100, 10.0),    # on: cheapest
        (200, 30.0),    # on
        (150, 5.0),     # off: (100, 10) costs less and gains more
        (200, 20.0),    # off: (200, 30) costs the same and gains more
        (400, 30.0),    # off: (200, 30) costs less for the same gain
        (500, 50.0),    # on: the most
        None,           # a failed point: never on the front
        (300, 40.0),    # on
    ]
    assert pareto_front(points) == [True, True, False, False, False, True, False, True]


def test_pareto_front_keeps_equal_points_and_zero_costs():
    # two identical points do not dominate each other; a point with no DSP at all is the
    # cheapest there is
    assert pareto_front([(1, 5.0), (1, 5.0), (0, 1.0), (0, 0.5)]) == [True, True, True, False]
    assert pareto_front([]) == []
    assert pareto_front([None, None]) == [False, False]


def test_fronts_are_marked_per_target():
    def row(target, luts, dsps, rate, status="ok"):
        return {"target": target, "lut4_used": luts, "dsp_used": dsps, "elements_per_s": rate,
                "status": status}
    rows = dse.mark_fronts([row("a", 100, 2, 1.0), row("a", 200, 1, 2.0),
                            row("b", 1000, 4, 0.5), row("a", 50, 0, 5.0, status="failed")])
    assert [(r["pareto_lut"], r["pareto_dsp"]) for r in rows] == \
        [(True, False), (True, True), (True, True), (False, False)]


def test_figures_of_a_point_keep_swept_parameters_apart_from_resources():
    # dispatch has parameters called dsp and bram: the resource columns are *_used
    point = dse.Point(target="ecp5-85k", swept={"dsp": "generic", "bram": "ecp5"},
                      settings={}, params={}, description="", key="k", cycles=100,
                      elements=400, element_bits=16)
    point.synthesis = {"ok": True, "fmax_mhz": 250.0, "reference_mhz": 350.0, "ratio": 0.71,
                       "critical_path": "a -> b",
                       "resources": {"lut4": 1000, "ff": 900, "dsp": 4, "bram": 2, "dram": 0}}
    row = dse.figures(point)
    assert (row["dsp"], row["bram"]) == ("generic", "ecp5")
    assert (row["lut4_used"], row["dsp_used"], row["bram_used"]) == (1000, 4, 2)
    assert row["elements_per_s"] == pytest.approx(400 * 250e6 / 100)          # 1e9
    assert row["gb_per_s"] == pytest.approx(2.0)
    assert row["latency_us"] == pytest.approx(0.4)
    assert row["elements_per_s_per_lut"] == pytest.approx(1e6)
    assert row["elements_per_s_per_dsp"] == pytest.approx(2.5e8)
    point.synthesis = {"ok": False, "reason": "does not fit", "cacheable": True}
    failed = dse.figures(point)
    assert failed["status"] == "failed" and failed["reason"] == "does not fit"
    assert failed["elements_per_s"] is None and failed["cycles"] == 100


# ---- the sweep on real tools ------------------------------------------------------------------

@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    """The two-point sweep on the local process pool, into a fresh cache."""
    root = tmp_path_factory.mktemp("dse")
    rows, meta = explore("fmul", WORKLOAD, SWEEPS, ["ice40-up5k"], out_dir=root / "out",
                         jobs=2, cache_dir=root / "cache", progress_bar=False)
    return root, rows, meta


def test_sweep_outputs_exist_and_parse(local_sweep):
    root, rows, meta = local_sweep
    out = root / "out"
    assert meta["synthesized"] == 2 and meta["from_cache"] == 0 and meta["failed"] == 0

    data = json.loads((out / "results.json").read_text())
    assert data["unit"] == "fmul" and data["workload"] == WORKLOAD
    assert data["targets"] == ["ice40-up5k"] and data["points"] == json.loads(
        json.dumps(rows))
    with open(out / "results.csv", newline="") as file:
        table = list(csv.DictReader(file))
    assert [(r["target"], r["format"], r["mul_stages"], r["status"]) for r in table] == \
        [("ice40-up5k", "bf16", "2", "ok"), ("ice40-up5k", "bf16", "3", "ok")]
    for written, row in zip(table, rows):
        assert float(written["fmax_mhz"]) == row["fmax_mhz"]
        assert int(written["lut4_used"]) == row["lut4_used"] and int(written["cycles"]) == row["cycles"]
    markdown = (out / "results.md").read_text().splitlines()
    body = [line for line in markdown if line.startswith("| ice40-up5k |")]
    assert len(body) == 2 and all("FAILED" not in line for line in body)
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_figures_come_from_the_formula_and_the_synthesis(local_sweep):
    _, rows, _ = local_sweep
    for row, stages in zip(rows, (2, 3)):
        params = FmulParams(format="bf16", mul_stages=stages)
        # the unit's own formula (host/binop.py): count + latency
        assert row["cycles"] == 336 + params.mul_latency and row["elements"] == 336
        assert row["fmax_mhz"] > 0 and row["lut4_used"] > 0 and row["ff_used"] > 0
        rate = 336 * row["fmax_mhz"] * 1e6 / row["cycles"]
        assert math.isclose(row["elements_per_s"], rate)
        assert math.isclose(row["latency_us"], row["cycles"] / row["fmax_mhz"])
        assert math.isclose(row["gb_per_s"], rate * 16 / 8 / 1e9)        # bf16: 2 bytes
        assert math.isclose(row["elements_per_s_per_lut"], rate / row["lut4_used"])
        expected_per_dsp = rate / row["dsp_used"] if row["dsp_used"] else None
        assert row["elements_per_s_per_dsp"] == pytest.approx(expected_per_dsp)
    for column, flag in (("lut4_used", "pareto_lut"), ("dsp_used", "pareto_dsp")):
        front = pareto_front([(row[column], row["elements_per_s"]) for row in rows])
        assert [row[flag] for row in rows] == front
        assert any(front)


def test_rerun_takes_every_point_from_the_cache(local_sweep, tmp_path, capsys):
    root, rows, _ = local_sweep
    out = tmp_path / "again"
    assert dse.main([*ARGV, "--cache", str(root / "cache"), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "2 points: 2 from the cache" in captured.err
    again = json.loads((out / "results.json").read_text())
    assert again["from_cache"] == 2 and again["synthesized"] == 0
    assert all(row["cached"] for row in again["points"])
    assert _same_figures(again["points"]) == _same_figures(json.loads(json.dumps(rows)))
    assert captured.out.count("| ice40-up5k | bf16 |") == 2


def test_failed_point_is_recorded_and_the_sweep_goes_on(local_sweep, tmp_path):
    # mul_stages=2 comes from the cache; mul_stages=4 is new and cannot finish in 1 ms
    root, rows, _ = local_sweep
    cache = root / "cache"
    before = sorted(cache.iterdir())
    failed, meta = explore("fmul", WORKLOAD, {"format": ["bf16"], "mul_stages": [2, 4]},
                           ["ice40-up5k"], out_dir=tmp_path, jobs=1, cache_dir=cache,
                           timeout=0.001, progress_bar=False)
    assert [row["status"] for row in failed] == ["ok", "failed"]
    assert meta["failed"] == 1 and meta["from_cache"] == 1 and meta["synthesized"] == 1
    assert failed[0]["fmax_mhz"] == rows[0]["fmax_mhz"]
    reason = failed[1]["reason"]
    assert "did not finish in 0.001 s" in reason and "ice40-up5k" in reason
    assert failed[1]["fmax_mhz"] is None and not failed[1]["pareto_lut"]
    assert failed[1]["cycles"] == 336 + FmulParams(format="bf16", mul_stages=4).mul_latency
    assert sorted(cache.iterdir()) == before          # a run past its time limit is not kept
    line = [line for line in (tmp_path / "results.md").read_text().splitlines()
            if "| 4 |" in line]
    assert len(line) == 1 and "FAILED: " in line[0] and "did not finish" in line[0]
    with open(tmp_path / "results.csv", newline="") as file:
        assert [row["status"] for row in csv.DictReader(file)] == ["ok", "failed"]


def test_dask_cluster_gives_the_same_results(local_sweep, tmp_path):
    distributed = pytest.importorskip("distributed")
    _, rows, _ = local_sweep
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        remote, meta = explore("fmul", WORKLOAD, SWEEPS, ["ice40-up5k"],
                               scheduler=cluster.scheduler_address, cache_dir=tmp_path,
                               progress_bar=False)
    assert meta["synthesized"] == 2 and meta["from_cache"] == 0
    assert meta["scheduler"] == cluster.scheduler_address
    assert _same_figures(remote) == _same_figures(rows)


# ---- bad arguments ----------------------------------------------------------------------------

@pytest.mark.parametrize("extra, message", [
    (["--sweep", "pipeline=1,2"], "--sweep: unit fmul has no parameter 'pipeline'"),
    (["--sweep", "mul_stages=2,99"], "mul_stages must be an integer between 0 and 16, not 99"),
    (["--sweep", "format=bf16,fp8"], "format must be fp32, fp16 or bf16, not 'fp8'"),
    (["--sweep", "mul_stages=2", "--sweep", "mul_stages=3"], "mul_stages is swept twice"),
    (["--target", "ice40-up5k,virtex"], "target must be"),
    (["--jobs", "0"], "jobs must be a positive integer, not 0"),
])
def test_bad_sweep_is_one_line(capsys, tmp_path, extra, message):
    with pytest.raises(SystemExit) as exit:
        dse.main(["fmul", "--workload", WORKLOAD, "--cache", str(tmp_path), *extra])
    assert exit.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{PROG}: error: ") and message in err[0]


def test_workload_of_another_unit_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit:
        dse.main(["fmul", "--workload", "duet_toy"])
    assert exit.value.code == 2
    assert "workload duet_toy is a design point of unit dispatch, not of fmul" in \
        capsys.readouterr().err


def test_bad_scheduler_is_one_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit:
        dse.main([*ARGV, "--cache", str(tmp_path), "--scheduler", "nowhere"])
    assert exit.value.code == 1
    err = [line for line in capsys.readouterr().err.splitlines()
           if line.startswith(f"{PROG}: ")]
    assert err == [f"{PROG}: error: --scheduler nowhere: missing port number in address "
                   "'nowhere'"]


# ---- every unit is explorable: its workloads, planned without synthesis ----------------------

#: Design points left out of the planning test: their random data alone takes long.
HEAVY = {"ascend_rerouting": "117 M random bf16 tokens: 13 s and 2.8 GB (ascend_rerouting_int8 "
                             "plans the same unit)"}
PLANNED = sorted(name for name in design_points() if name not in HEAVY)


def test_every_unit_has_a_workload_and_a_planned_design_point():
    assert list(WORKLOADS) == list(units())           # gen list's units, in its order
    planned = {design_points()[name].unit for name in PLANNED}
    assert planned == set(units()), f"units without a design point: {set(units()) - planned}"


@pytest.mark.parametrize("name", PLANNED)
def test_design_point_workload_is_planned_without_synthesis(name):
    point = design_points()[name]
    unit, found, problem, elements = dse.workload_problem(point.unit, name)
    assert found == point
    for target in ("ecp5-85k", "ice40-up5k"):        # the parameters synth builds there
        _, params, _ = synth_params(name, target)
        cycles = unit.cycles(problem, params)
        assert isinstance(cycles, int) and cycles >= unit.ideal_cycles(problem, params) > 0
        assert WORKLOADS[unit.name].element_bits(params) > 0
    assert elements > 0


def test_point_inputs_are_seeded():
    unit = units()["combine_scatter"]
    problem = design_points()["duet_toy_combine"].problem
    first, again, other = (unit.point_inputs(problem, seed) for seed in (0, 0, 1))
    assert first[0].keys() == again[0].keys() == other[0].keys()
    assert all((first[0][key] == again[0][key]).all() for key in first[0])
    assert any((first[0][key] != other[0][key]).any() for key in first[0])


@pytest.mark.parametrize("unit, table, message", [
    ("sparse_gather", {"tokens": 4, "depth": 2},
     "[problem] depth = 2: unit sparse_gather has no such size or run-time value"),
    ("sparse_index", {"tokens": 4, "capacity": 3},
     "[problem] capacity = 3: unit sparse_index's problem has no capacity"),
    ("combine_scatter", {"tokens": 4, "variant": "sorted"},
     "[problem] variant must be one of 'random', 'back_to_back' for unit combine_scatter, not "
     "'sorted'"),
    ("scan_layers", {"tokens": 4, "hidden": 8},
     "unit scan_layers's design point needs [problem] layers"),
    ("expand", {"input_shape": [2, 1], "expand_size": [2, 3], "format": "fp8"},
     "format must be fp32, fp16, bf16 or int8, not 'fp8'"),
])
def test_bad_design_point_problem_is_one_clear_error(unit, table, message):
    with pytest.raises((HostError, ParameterError)) as error:
        units()[unit].point_inputs(table)
    assert message in str(error.value)


@pytest.mark.parametrize("name", ["duet_toy_gather", "oneflow_repeat"])
def test_new_design_point_runs_bit_exact_on_the_fast_path(name):
    # python -m moe_hw.run POINT: random inputs at the point's sizes, its parameters
    point = design_points()[name]
    unit = units()[point.unit]
    inputs, runtime = unit.point_inputs(point.problem)
    outcome = run_unit(name, inputs, runtime, sim=FAST_SIM)
    assert outcome.passed, outcome.problems
    assert outcome.cycles == outcome.expected_cycles
    _, _, _, elements = dse.workload_problem(point.unit, name)
    assert elements == WORKLOADS[unit.name].elements(outcome.problem)
