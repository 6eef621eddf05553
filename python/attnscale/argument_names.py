"""Messages in the caller's words: the checks and kernels under the torch wrappers name the
arguments as attnscale does (q, k, v, mask); a wrapper whose signature names them otherwise raises
its errors under its own names, as the command line does with its flags (cli/library_names.h).

    with caller_names({"q": "query", "k": "key", "v": "value"}):
        attend(query, key, value, ...)    # ValueError("k: last dimension dk = 3 must equal q's dk = 8")
                                          # comes out as "key: last dimension dk = 3 must equal query's dk = 8"
"""
import contextlib
import re


def renamed(message, names):
    """message with every word that is a key of `names` (attnscale's name of an argument) replaced
    by its value (the caller's): "q, k: ...", "q's dk", "(q [2, 4], k [2, 3])". A word inside
    another (dq, Hkv) or quoted ('q', as the caller typed it) stays."""
    words = re.compile(r"(?<![\w'])(" + "|".join(map(re.escape, names)) + r")(?![\w])")
    return words.sub(lambda m: names[m.group(1)], message)


@contextlib.contextmanager
def caller_names(names):
    """Re-raises a TypeError or ValueError of the block with its message renamed(message, names)."""
    try:
        yield
    except (TypeError, ValueError) as e:
        raise type(e)(renamed(str(e), names)) from None
