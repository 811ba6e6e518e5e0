"""``python -m moe_hw.formal``: check a unit's properties formally (SymbiYosys, Yices).

    python -m moe_hw.formal UNIT [--set NAME=VALUE ...] [--depth N] [--work DIR]
                                 [--mode prove|cover|all] [--property NAME ...] [--timeout S]

UNIT is a unit of ``python -m moe_hw.gen list`` that has a formal harness, or one of the
shared blocks ``skid_buffer`` and ``run_control``. Each property is checked in a run of its
own (moe_hw/flows/formal.py): the unit, emitted as RTLIL inside a harness of Amaranth
``Assert`` / ``Assume`` / ``Cover`` statements, goes to ``yowasp-sby`` with the ``smtbmc
yices`` engine; ``prove`` checks the assertions by k-induction (``mode prove``), ``cover``
the cover statements (``mode cover``). The checks run at small generation parameters
(``--set`` changes them; the defaults are printed with ``--list``).

Amaranth's own statements, not a Verilog property module: Amaranth 0.5 emits them as Yosys
``$check`` cells through its RTLIL back end, which SymbiYosys proves, covers and traces like
SystemVerilog immediate assertions; the harness then names the unit's own ports and stays in
step with its signature.

Output: a table (stdout) of unit | property | proved / bounded to depth N / covered | solver
time (s). ``proved``: the k-induction closed; ``bounded to depth N``: no counterexample in
the first N cycles from reset, but the induction step did not close. A failed assertion or
an unreached cover, or a check with no verdict within ``--timeout`` seconds (``timed out``;
the other checks go on) prints two lines on stderr, the property and the counterexample (or
the log), and the exit status is 1. Bad arguments: one line naming the parameter, exit status 2.
"""

import argparse
import dataclasses
import sys
from pathlib import Path

from .cli import fail, parse_sets, run_main
from .flows.formal import FormalError, check_property, format_table
from .flows.formal_checks import BLOCKS, DEFAULTS, PROPERTIES
from .params import ParameterError
from .registry import units

__all__ = ["main", "formal", "targets", "target", "MODES"]

PROG = "python -m moe_hw.formal"

MODES = ("prove", "cover", "all")

#: Seconds each check may take by default.
DEFAULT_TIMEOUT = 600


@dataclasses.dataclass(frozen=True)
class Target:
    """A unit or block the command checks: ``make(settings)`` -> the component (at its formal
    defaults, ``DEFAULTS[name]``, with ``settings`` on top), ``properties(component,
    settings)`` -> its properties."""

    name: str
    defaults: dict
    make: object
    properties: object


def targets():
    """The units and blocks with a formal harness, by name."""
    def unit_maker(name):
        def make(settings):
            unit = units()[name]
            return unit.build(unit.make_params(settings, base=DEFAULTS[name]))
        return make
    return {name: Target(name, DEFAULTS[name], BLOCKS.get(name) or unit_maker(name),
                         properties) for name, properties in PROPERTIES.items()}


def target(name):
    known = targets()
    if name not in known:
        raise ParameterError(f"unit must be one of {', '.join(known)}, not {name!r}")
    return known[name]


def formal(name, settings=None, *, depth=None, work_dir=None, mode="all", properties=None,
           timeout=DEFAULT_TIMEOUT, progress=None):
    """Check the properties of unit or block ``name`` at generation parameters ``settings``
    (on top of its formal defaults); return the list of
    :class:`~moe_hw.flows.formal.CheckResult`. ``mode``: ``prove`` (assertions), ``cover``
    or ``all``; ``properties``: only these (names). Arguments are checked before any tool
    runs. ``timeout``: seconds each check may take (it is then reported ``timed out``)."""
    if mode not in MODES:
        raise ParameterError(f"mode must be {', '.join(MODES[:-1])} or {MODES[-1]}, "
                             f"not {mode!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ParameterError(f"timeout must be a positive number of seconds, not {timeout!r}")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int)
                              or depth < 1):
        raise ParameterError(f"depth must be a positive integer, not {depth!r}")
    chosen = target(name)
    settings = dict(settings or {})
    props = _properties(chosen, settings)
    names = [prop.name for prop in props]
    for wanted in properties or ():
        if wanted not in names:
            raise ParameterError(f"property must be one of {', '.join(names)}, not {wanted!r}")
    kinds = {"prove": ("assert",), "cover": ("cover",), "all": ("assert", "cover")}[mode]
    selected = [prop for prop in props if prop.kind in kinds and
                (not properties or prop.name in properties)]
    work_dir = Path(work_dir) / name if work_dir is not None else None
    results = []
    for prop in selected:
        if progress:
            progress(f"{name} {prop.name} ({prop.kind}, depth "
                     f"{prop.depth if depth is None else depth})")
        # Each run elaborates a unit of its own.
        results.append(check_property(name, prop, chosen.make(settings), depth=depth,
                                      work_dir=work_dir, timeout=timeout))
    return results


def _properties(chosen, settings):
    """The properties of ``chosen`` at ``settings`` (read from a unit that is never
    elaborated: Amaranth's unused-elaboratable warning is silenced for it)."""
    dut = chosen.make(settings)
    dut._MustUse__silence = True
    return chosen.properties(dut, settings)


def _progress(text):
    print(f"[moe_hw.formal] {text}", file=sys.stderr, flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("unit", nargs="?", help=f"one of {', '.join(targets())}")
    parser.add_argument("--set", action="append", metavar="NAME=VALUE", default=[],
                        help="a generation-time parameter (repeatable)")
    parser.add_argument("--depth", type=int, default=None, metavar="N",
                        help="the depth of every check (default: each property's own)")
    parser.add_argument("--work", type=Path, default=None, metavar="DIR",
                        help="keep the RTLIL, .sby files, logs and traces in DIR/UNIT/PROPERTY "
                             "(default: a temporary folder, kept)")
    parser.add_argument("--mode", default="all", metavar="MODE",
                        help="prove (assertions), cover, or all (default)")
    parser.add_argument("--property", action="append", default=[], metavar="NAME",
                        help="check only this property (repeatable)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                        help=f"seconds each check may take (default {DEFAULT_TIMEOUT}); one "
                             "that takes longer is reported 'timed out' and the others go on")
    parser.add_argument("--list", action="store_true",
                        help="list the units, their formal defaults and their properties")
    args = parser.parse_args(argv)

    def body():
        if args.list:
            for name, chosen in targets().items():
                sets = " ".join(f"{key}={value}" for key, value in chosen.defaults.items())
                print(f"{name}: {sets}")
                for prop in _properties(chosen, {}):
                    print(f"  {prop.name} ({prop.kind}, depth {prop.depth}): {prop.doc}")
            return 0
        if args.unit is None:
            raise ParameterError(f"unit is required: one of {', '.join(targets())}")
        results = formal(args.unit, parse_sets(args.set), depth=args.depth,
                         work_dir=args.work, mode=args.mode, properties=args.property,
                         timeout=args.timeout, progress=_progress)
        print(format_table(results))
        failed = [result for result in results if result.failed]
        for result in failed:
            print(f"{PROG}: {result.unit}: property {result.property} {result.status}",
                  file=sys.stderr)
            evidence = result.trace if result.trace else result.log
            label = "counterexample" if result.trace else "log"   # no trace: the log says why
            print(f"{PROG}: {label}: {evidence}", file=sys.stderr)
        return 1 if failed else 0

    try:
        return run_main(PROG, body)
    except FormalError as error:
        fail(PROG, str(error), code=1)


if __name__ == "__main__":
    sys.exit(main())
