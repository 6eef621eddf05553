"""How many threads a kernel call from attnscale.torch runs on.

A PyTorch user expects every CPU operation to honour torch.set_num_threads (data-loader workers,
serving processes and tests set it to 1). The kernels have their own control, the threads= keyword
and $ATTNSCALE_THREADS; the drop-ins have no threads= keyword. The count, in order of precedence:

    1. threads=N > 0 given to attnscale.torch.attention: N;
    2. $ATTNSCALE_THREADS set (not empty): the library reads it (and refuses a bad value);
    3. else torch.get_num_threads(), read at each kernel call (so an autograd backward follows the
       count in force when it runs, as PyTorch's own operations do).

A torch count of every core or more is passed as 0, the library's own default (every core), which
keeps its rule of one thread for a decode call that reads little of the cache; more threads than
cores would only take turns on them. Results do not depend on the count.
"""
import operator
import os

import torch

# The machine's cores, read once: os.cpu_count() reads /sys on every call (about 10 µs, a tenth of a
# small drop-in call's time).
_CORES = os.cpu_count() or 1


def kernel_threads(requested=0):
    """The threads keyword for a kernel call, given the caller's `requested` (0: not chosen)."""
    try:
        chosen = isinstance(requested, bool) or operator.index(requested) != 0
    except TypeError:
        chosen = True  # not an integer: left to the kernels' check, which names threads
    if chosen or os.environ.get("ATTNSCALE_THREADS"):
        return requested
    count = torch.get_num_threads()
    return 0 if count >= _CORES else count


def with_threads(options):
    """options (the kernels' keywords) with threads resolved by kernel_threads."""
    return dict(options, threads=kernel_threads(options.get("threads", 0)))
