"""attnscale.lab: the lab's experiments from Python, with the numbers the command line writes.

Every experiment of ``attnscale experiment NAME`` is a function here, built from the library's
registry: keyword arguments are the command line's flags (``d=[1, 2, 4]`` is ``--d 1,2,4``; a
flag spelled with a dash takes an underscore), plus seed, trials, threads and progress. The same
seed and flags give the same numbers as the command line, bit for bit, for any thread count.

    >>> from attnscale import lab
    >>> rows = lab.saturation(n=50, d=[4, 64], scaling="sqrt", trials=20, seed=0, as_frame=False)
    >>> sorted({r["metric"] for r in rows})
    ['entropy', 'max_weight', 'participation', 'top_p_95']
    >>> {k: rows[0][k] for k in ("n", "d", "scaling", "metric")}
    {'n': 50, 'd': 4, 'scaling': 'sqrt', 'metric': 'top_p_95'}

Each row is a dict: the sweep's parameters by name, then metric, mean (the row's statistic: a
mean, a variance, a median, a kurtosis or a slope, as lab.md lists per metric; docs/ in the source,
share/doc/attnscale/ installed), ci_low, ci_high (its 95% confidence interval; NaN where the sample
is too small for one) and theory (None where no closed form exists). With pandas
importable, the rows come as a DataFrame unless as_frame=False.
"""
import inspect
import numbers
import re

from . import _lab
from .keywords import unexpected_keyword

__all__ = ["experiments", "run", "Rows"]


class Rows(list):
    """A list of row dicts, with the run's metadata and the texts the command line writes.

    Attributes:
        param_names: the sweep's parameter columns, e.g. ['n', 'd', 'scaling']
        metadata:    experiment, seed, trials, threads, version, git_hash, cpu_target, seconds, flags
        csv, json:   the run as ``attnscale experiment NAME --format csv`` (or json) writes it
    """

    def __init__(self, rows, param_names, metadata, csv, json):
        super().__init__(rows)
        self.param_names = param_names
        self.metadata = metadata
        self.csv = csv
        self.json = json


def _flag_text(name, value):
    """A keyword argument as its command-line text: lists become comma-separated."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return repr(float(value))
    try:
        items = list(value)
    except TypeError:
        raise TypeError(f"{name}: expected a string, a number or a list of them, got {type(value).__name__}") from None
    return ",".join(_flag_text(name, v) for v in items)


_INT = re.compile(r"[+-]?\d+\Z")


def _param_value(text):
    """A parameter column's text as int or float when it is one ('64' -> 64), else the text."""
    if _INT.match(text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


_MAX_THREADS = 4096  # as the command line's --threads (and ATTNSCALE_THREADS)


def _integer_in(value, low, high):
    """Whether value is an integer (not a bool, not a float such as 1.5) in [low, high]."""
    return not isinstance(value, bool) and isinstance(value, numbers.Integral) and low <= value <= high


def _pandas():
    try:
        import pandas
    except ImportError:
        return None
    return pandas


def experiments():
    """The lab's experiments: a list of dicts with name, summary, flags [(name, default, help)],
    default_trials and param_names."""
    return _lab.lab_experiments()


def run(name, *, seed=0, trials=None, threads=0, progress=None, as_frame=None, **flags):
    """run(name, *, seed=0, trials=None, threads=0, progress=None, as_frame=None, **flags)

    Runs the experiment `name` and returns its rows.

        seed:     master seed of the random streams (an integer >= 0)
        trials:   Monte Carlo trials per sweep point (None: the experiment's default)
        threads:  worker threads (0: $ATTNSCALE_THREADS, else every core); results do not depend on it
        progress: None or a callable progress(done, total), called after each sweep point
        as_frame: None (a pandas DataFrame when pandas is importable, else Rows), True, or False (Rows)
        flags:    the experiment's flags, e.g. d=[1, 2, 4] for --d 1,2,4

    A keyword the experiment does not have raises TypeError (as Python does for a function's
    unknown keyword); a bad value raises ValueError with the command line's message, its flags
    spelt as this module's keywords (x_mean: ..., not --x-mean: ...).
    """
    if not _integer_in(seed, 0, 2**64 - 1):
        raise ValueError(f"seed: must be an integer from 0 to 2**64 - 1, got {seed!r}")
    if trials is None:
        trials = 0
    elif not _integer_in(trials, 1, 2**31):
        raise ValueError(f"trials: must be an integer from 1 to 2**31, got {trials!r}")
    if not _integer_in(threads, 0, _MAX_THREADS):
        raise ValueError(f"threads: must be an integer from 0 to {_MAX_THREADS}, got {threads!r}")
    names = _flag_names(name)
    if names:  # a known experiment: a keyword it lacks is refused as Python refuses one
        for key in flags:
            if key not in names:
                raise TypeError(unexpected_keyword(name.replace("-", "_"), key, names))
    texts = {names.get(key, key): _flag_text(key, value) for key, value in flags.items()}
    try:
        result = _lab.lab_run(name, texts, int(seed), int(trials), int(threads), progress)
    except ValueError as e:
        raise ValueError(_in_keywords(str(e), names)) from None
    param_names = list(result["param_names"])
    rows = []
    for params, metric, mean, ci_low, ci_high, theory in result["rows"]:
        row = {p: _param_value(v) for p, v in zip(param_names, params)}
        row.update(metric=metric, mean=mean, ci_low=ci_low, ci_high=ci_high, theory=theory)
        rows.append(row)
    rows = Rows(rows, param_names, result["metadata"], result["csv"], result["json"])
    pandas = _pandas() if as_frame is not False else None
    if as_frame and pandas is None:
        raise ImportError("as_frame=True needs pandas (Debian: python3-pandas)")
    if pandas is None:
        return rows
    frame = pandas.DataFrame(list(rows), columns=param_names + ["metric", "mean", "ci_low", "ci_high", "theory"])
    frame.attrs["metadata"] = rows.metadata
    return frame


_COMMON_FLAGS = ("seed", "trials", "threads")


def _in_keywords(message, names):
    """The command line's message in this module's words: each --flag that is a keyword here
    (the experiment's flags, seed, trials, threads) as that keyword (--x-mean: ... -> x_mean: ...);
    flags with no keyword (--out, --resume) stay as they are."""
    keywords = {flag: key for key, flag in names.items()}
    keywords.update({flag: flag for flag in _COMMON_FLAGS})
    return re.sub(r"--([a-z][a-z0-9-]*)", lambda m: keywords.get(m.group(1), m.group(0)), message)


def _flag_names(name):
    """Python keyword -> flag name for one experiment (dashes become underscores)."""
    for e in experiments():
        if e["name"] == name:
            return {f[0].replace("-", "_"): f[0] for f in e["flags"]}
    return {}


def _make(spec):
    """One function per experiment, with its flags as keyword arguments and their help as docs."""
    name = spec["name"]

    def experiment(**kwargs):
        return run(name, **kwargs)

    common = [
        inspect.Parameter("seed", inspect.Parameter.KEYWORD_ONLY, default=0),
        inspect.Parameter("trials", inspect.Parameter.KEYWORD_ONLY, default=None),
        inspect.Parameter("threads", inspect.Parameter.KEYWORD_ONLY, default=0),
        inspect.Parameter("progress", inspect.Parameter.KEYWORD_ONLY, default=None),
        inspect.Parameter("as_frame", inspect.Parameter.KEYWORD_ONLY, default=None),
    ]
    own = [
        inspect.Parameter(flag.replace("-", "_"), inspect.Parameter.KEYWORD_ONLY, default=default)
        for flag, default, _ in spec["flags"]
    ]
    experiment.__signature__ = inspect.Signature(own + common)
    experiment.__name__ = experiment.__qualname__ = name.replace("-", "_")
    lines = [
        f"{spec['summary']}",
        "",
        f"Same as `attnscale experiment {name}`; returns rows with columns "
        f"{', '.join(spec['param_names'] + ['metric', 'mean', 'ci_low', 'ci_high', 'theory'])}.",
        "",
        "Flags (a list is passed as a comma-separated value; defaults as on the command line):",
    ]
    lines += [f"    {flag.replace('-', '_')} = {default!r}: {help}" for flag, default, help in spec["flags"]]
    lines += [
        "",
        f"Common: seed=0, trials=None (default {spec['default_trials']}), threads=0, progress=None, "
        "as_frame=None; see attnscale.lab.run.",
    ]
    experiment.__doc__ = "\n".join(lines)
    return experiment


for _spec in experiments():
    _fn = _make(_spec)
    globals()[_fn.__name__] = _fn
    __all__.append(_fn.__name__)
del _spec, _fn
