"""Generation-time parameters: one base class, one way to declare and check a parameter.

Every unit's parameters are a frozen dataclass derived from :class:`UnitParams`, whose fields
are declared with :func:`param`; ``UnitParams.__post_init__`` checks every field the same way,
so an impossible value fails before any hardware is built, with one line naming the parameter
and the value: "lanes must be 1, 2, 4, 8 or 16, not 3". Rules that tie fields together go in
the subclass's :meth:`UnitParams.check`.

The vocabulary is fixed (README, "Names"). Old spellings are accepted, with a deprecation
message, through :data:`ALIASES` (``--set`` and keyword construction alike) for one release.
"""

import dataclasses
import operator
import warnings

__all__ = ["ParameterError", "check_int", "check_choice", "resolve_params", "LANES",
           "UnitParams", "param", "ALIASES", "canonical_name"]

LANES = (1, 2, 4, 8, 16)

#: Old parameter names -> the vocabulary's names, accepted for one release with a warning.
#: A parameter class adds its own in its ``ALIASES`` class attribute (they win).
ALIASES = {
    "max_k": "max_top_k",
    "outstanding": "max_outstanding",
    "max_inflight": "max_outstanding",
}


class ParameterError(ValueError):
    """A generation-time parameter has an impossible value."""


def check_int(name, value, *, minimum=0, maximum=None):
    """``value`` as an int in ``[minimum, maximum]``, else a ParameterError naming ``name``."""
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise ParameterError(f"{name} must be an integer, not {value!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"at least {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise ParameterError(f"{name} must be an integer {bound}, not {value!r}")
    return value


def _is_choice(value, choice):
    """``value`` is ``choice`` in kind as well as value: True is not the lane count 1, nor
    4.0 the lane count 4."""
    if isinstance(choice, bool) or isinstance(value, bool):
        return value is choice
    if isinstance(choice, int):
        try:
            return operator.index(value) == choice
        except TypeError:
            return False
    return type(value) is type(choice) and value == choice


def check_choice(name, value, choices):
    if not any(_is_choice(value, choice) for choice in choices):
        names = [str(c) for c in choices]
        listed = ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]
        raise ParameterError(f"{name} must be {listed}, not {value!r}")
    return value


def param(default, *, minimum=None, maximum=None, choices=None, power_of_two=False,
          optional=False, doc=""):
    """A checked dataclass field of a :class:`UnitParams` subclass.

    ``choices``: the value must be one of them; else an integer in ``[minimum, maximum]``
    (``minimum`` defaults to 0), a power of two when ``power_of_two``. ``optional``: ``None``
    is allowed too (a block's own default). ``doc`` is shown by ``gen list``.
    """
    return dataclasses.field(default=default, metadata={
        "minimum": minimum, "maximum": maximum, "choices": choices,
        "power_of_two": power_of_two, "optional": optional, "doc": doc})


def canonical_name(name, params_class=None):
    """The vocabulary's name for ``name``; an old alias gives a deprecation warning."""
    aliases = {**ALIASES, **getattr(params_class, "ALIASES", {})}
    new = aliases.get(name)
    if new is None:
        return name
    if params_class is not None and new not in {f.name for f in dataclasses.fields(params_class)}:
        return name
    warnings.warn(f"parameter {name!r} is deprecated; it is now called {new!r} (the old name "
                  "is accepted for this release only)", DeprecationWarning, stacklevel=3)
    return new


@dataclasses.dataclass(frozen=True)
class UnitParams:
    """Base of every unit's frozen parameter dataclass: checks every :func:`param` field,
    then calls :meth:`check` for the rules that tie fields together."""

    def __post_init__(self):
        for field in dataclasses.fields(self):
            meta = field.metadata
            if not meta:
                continue
            value = getattr(self, field.name)
            if value is None and meta["optional"]:
                continue
            if meta["choices"] is not None:
                check_choice(field.name, value, meta["choices"])
                continue
            minimum = 0 if meta["minimum"] is None else meta["minimum"]
            value = check_int(field.name, value, minimum=minimum, maximum=meta["maximum"])
            if meta["power_of_two"] and value & (value - 1):
                raise ParameterError(f"{field.name} must be a power of two, not {value}")
        self.check()

    def check(self):
        """Rules across fields; subclasses override (the fields are already checked)."""

    def check_signed_fits(self, width_name, *names):
        """Each of ``names`` (a maximum) must fit the signed field of ``width_name`` bits."""
        width = getattr(self, width_name)
        for name in names:
            if getattr(self, name) > 1 << (width - 1):
                raise ParameterError(
                    f"{width_name} must hold {name} ({getattr(self, name)}) as a signed value, "
                    f"not {width}")

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


def resolve_params(params_class, params, kwargs):
    """A unit's parameter object: ``params`` as given, or built from keyword parameters
    (old names accepted with a deprecation warning)."""
    if params is None:
        return params_class(**{canonical_name(k, params_class): v for k, v in kwargs.items()})
    if kwargs:
        raise TypeError(f"Pass either a {params_class.__name__} or keyword parameters, "
                        "not both")
    return params
