// The registry: every experiment of the lab, one line each, in the report's order.
//
// ATTNSCALE_UNIT(name, id) means: src/lab/experiments/<name>/ holds the experiment (its .cc files
// define lab::make_<name>()) and its report unit (report.cc defines report::unit_<name>(), and
// section.md is its section). Both the lab's registry (lab/experiment.cc) and the report's
// (report/unit.cc) expand this list; a unit that needs an optional dependency is wrapped in the
// #if its unit.cmake defines. `id` is the experiment's stream id (lab::k_<name>, the top 8 bits of
// its random stream numbers, rng.h): the next free number, never reused, so experiments never share
// random numbers and recorded results stay valid.
ATTNSCALE_UNIT(moments, 1)
ATTNSCALE_UNIT(variance, 2)
ATTNSCALE_UNIT(saturation, 3)
ATTNSCALE_UNIT(gradients, 4)
ATTNSCALE_UNIT(heatmap, 5)
ATTNSCALE_UNIT(projections, 6)
ATTNSCALE_UNIT(length, 7)
ATTNSCALE_UNIT(columns, 8)
#ifdef ATTNSCALE_HAVE_TORCH
ATTNSCALE_UNIT(training, 9)
ATTNSCALE_UNIT(recall, 10)
#endif
