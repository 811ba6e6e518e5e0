"""Pieces shared by the command-line entry points."""

import sys
import warnings

from .params import ParameterError
from .registry import parse_value

__all__ = ["parse_sets", "table_cell", "fail", "run_main"]


def parse_sets(pairs):
    """``["lanes=4", "format=bf16"]`` -> ``{"lanes": 4, "format": "bf16"}``."""
    settings = {}
    for pair in pairs or ():
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ParameterError(f"--set takes NAME=VALUE, not {pair!r}")
        settings[name.strip().replace("-", "_")] = parse_value(value)
    return settings


def table_cell(row, key, spec):
    """One cell of a results table: ``row[key]`` through ``spec`` (a ``str.format`` pattern,
    or a function of the value giving the text); ``-`` when the row has no such value."""
    value = row.get(key)
    if value is None:
        return "-"
    return spec(value) if callable(spec) else spec.format(value)


def fail(prog, message, code=2):
    message = " ".join(str(message).split())     # one line, whatever the message holds
    print(f"{prog}: error: {message}", file=sys.stderr)
    sys.exit(code)


def run_main(prog, body):
    """Run ``body()``; bad parameters and inputs end in one clear line, not a traceback, as
    does Ctrl-C (the simulator is stopped on the way out), and a deprecated parameter name
    gives one warning line."""
    def show(message, category, *args, **kwargs):
        print(f"{prog}: warning: {message}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.simplefilter("always", DeprecationWarning)
        warnings.showwarning = show
        try:
            return body()
        except (ParameterError, ValueError, TypeError) as error:
            fail(prog, str(error))
        except KeyboardInterrupt:
            fail(prog, "interrupted", code=130)
