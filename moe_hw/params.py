"""Validation of generation-time parameters.

Every unit takes a frozen parameter object; its ``__post_init__`` calls these checks so that an
impossible value fails before any hardware is built, with one line naming the parameter and
the value, in the style "lanes must be 1, 2, 4, 8 or 16, not 3".
"""

import operator

__all__ = ["ParameterError", "check_int", "check_choice", "resolve_params", "LANES"]

LANES = (1, 2, 4, 8, 16)


class ParameterError(ValueError):
    """A generation-time parameter has an impossible value."""


def _describe(name):
    return name  # as the user spells it in --set and in the parameter object


def check_int(name, value, *, minimum=0, maximum=None):
    """``value`` as an int in ``[minimum, maximum]``, else a ParameterError naming ``name``."""
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise ParameterError(f"{_describe(name)} must be an integer, not {value!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"at least {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise ParameterError(f"{_describe(name)} must be an integer {bound}, not {value!r}")
    return value


def check_choice(name, value, choices):
    if value not in choices:
        names = [str(c) for c in choices]
        listed = ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]
        raise ParameterError(f"{_describe(name)} must be {listed}, not {value!r}")
    return value


def resolve_params(params_class, params, kwargs):
    """A unit's parameter object: ``params`` as given, or built from keyword parameters."""
    if params is None:
        return params_class(**kwargs)
    if kwargs:
        raise TypeError(f"Pass either a {params_class.__name__} or keyword parameters, "
                        "not both")
    return params
