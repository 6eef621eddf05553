"""One short TypeError for a call that the extension's signature rejects.

pybind11 answers attention(q, k, v, casual=True) with the signature it expected and the repr of
every argument it was given, arrays included: thousands of characters around one misspelt word.
A function wrapped by `short_errors` raises one line naming the argument instead:

    TypeError: attention() got an unexpected keyword argument 'casual' (did you mean 'causal'?)

The accepted names are read from pybind11's own message (its "1. (q: handle, ..., *, scale: handle
= None, ...)" line), so keywords added to the extension are known here without a second list.
"""
import difflib
import functools
import inspect
import re

_SIGNATURE = re.compile(r"^\s*1\. \((.*)\) -> ", re.M)
_PARAMETER = re.compile(r"^(\w+): (\w+)( = .*)?$")
_TYPES = {"bool": bool, "int": int, "float": (int, float), "str": str}


def _parameters(message):
    """[(name, type name, has default, keyword only)] from pybind11's message, or None."""
    found = _SIGNATURE.search(message)
    if not found:
        return None
    params, keyword_only = [], False
    for part in found.group(1).split(", "):
        if part == "*":
            keyword_only = True
            continue
        m = _PARAMETER.match(part)
        if m:  # other parts continue a type or a default that holds ", "
            params.append((m.group(1), m.group(2), m.group(3) is not None, keyword_only))
    return params


def unexpected_keyword(name, key, names):
    """Python's message for a keyword function `name` lacks, with the nearest of `names`."""
    close = difflib.get_close_matches(key, list(names), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"{name}() got an unexpected keyword argument '{key}'{hint}"


def _diagnosis(name, params, args, kwargs):
    names = [p[0] for p in params]
    for key in kwargs:
        if key not in names:
            return unexpected_keyword(name, key, names)
    positional = [p[0] for p in params if not p[3]]
    if len(args) > len(positional):
        return (
            f"{name}() takes {len(positional)} positional arguments ({', '.join(positional)}), "
            f"got {len(args)}; the others are keyword-only"
        )
    given = dict(zip(positional, args), **kwargs)
    for pname, ptype, has_default, _ in params:
        if pname not in given and not has_default:
            return f"{name}() missing required argument '{pname}'"
        if pname in given and ptype in _TYPES:
            value = given[pname]
            if not isinstance(value, _TYPES[ptype]) or (ptype != "bool" and isinstance(value, bool)):
                return f"{pname}: expected {ptype}, got {type(value).__name__}"
    return None


def signature_error(fn, args, kwargs):
    """The one-line message of the TypeError that calling fn (a Python function) with args and kwargs
    raises for its signature: a keyword it does not take (with the nearest it takes), a missing
    argument, too many positional ones; None when the signature takes them."""
    signature = inspect.signature(fn)
    try:
        signature.bind(*args, **kwargs)
        return None
    except TypeError as e:
        params = [(p.name, "", p.default is not p.empty, p.kind is p.KEYWORD_ONLY)
                  for p in signature.parameters.values()]
        return _diagnosis(fn.__name__, params, args, kwargs) or f"{fn.__name__}(): {e}"


def _integers(value):
    """The Python integers in value (itself, or the items of a tuple or list), bools aside."""
    items = value if isinstance(value, (tuple, list)) else (value,)
    return [x for x in items if isinstance(x, int) and not isinstance(x, bool)]


def _out_of_range(kwargs):
    """'name: value is out of range ...' for the first keyword holding an integer that the
    extension's C++ integers cannot hold (past 32 bits signed, or negative, which its unsigned
    seeds and counts refuse), or None."""
    for key, value in kwargs.items():
        for x in _integers(value):
            if not -(2**31) <= x < 2**31:
                return f"{key}: {x} is out of range (too large for the extension's integers)"
    for key, value in kwargs.items():
        for x in _integers(value):
            if x < 0:
                return f"{key}: {x} is out of range (expected an integer >= 0)"
    return None


def short_errors(fn):
    """fn with pybind11's "incompatible function arguments" TypeError cut to one line, and its
    failed conversion of an integer too large for C++ named by its keyword."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TypeError as e:
            message = str(e)
            if "incompatible function arguments" not in message:
                raise
            params = _parameters(message)
            short = _diagnosis(fn.__name__, params, args, kwargs) if params else None
            if short is None:
                short = _out_of_range(kwargs) or message.split("\n")[0]
            raise TypeError(short) from None
        except RuntimeError as e:  # pybind11's cast of a keyword's value inside the call
            short = _out_of_range(kwargs) if "Unable to cast" in str(e) else None
            if short is None:
                raise
            raise TypeError(short) from None

    return call
