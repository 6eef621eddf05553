#include "mask_options.h"

#include <fmt/format.h>

#include "attnscale/error.h"
#include "input_files.h"
#include "subcommands.h"

namespace attnscale::cli {
namespace {


}  // namespace

void MaskFlags::add_to(CLI::App& app, bool with_mask_file) {
  app.add_option("--scale", scale, "Scale s: none (1), sqrt (1/sqrt(dk)), linear (1/dk) or a number")
      ->capture_default_str();
  app.add_option("--causal", causal, "Causal mask aligned top-left (key j <= query i) or bottom-right "
                                     "(j <= i + Nkv - Nq)")
      ->type_name("ALIGN");
  app.add_option("--window", window,
                 "Sliding window L,R, each -1 to 2^62: keys diag-L..diag+R are visible (-1: unbounded)")
      ->option_text("L,R")  // not CLI11's "INT x 2"
      ->delimiter(',')
      ->expected(2)
      ->check(integer_in<std::int64_t>(-1, std::int64_t{1} << 62));  // also refuses what overflows int64
  app.add_option("--align", align, "Diagonal of --window when --causal is not given (default top-left)")
      ->type_name("ALIGN");
  if (with_mask_file)
    app.add_option("--mask", mask_path, "Mask .npy, [Nq,Nkv] or [B|1,H|1,Nq,Nkv]: bool/uint8 (nonzero = "
                                        "keep) or float (added to the scaled scores)")
        ->type_name("FILE");
  app.add_option("--threads", threads, "Worker threads, 0 to 4096 (0: $ATTNSCALE_THREADS or all cores)")
      ->check(threads_range());
}

Options MaskFlags::options(Tensor& mask_storage) const {
  Options o;
  try {
    o.scale = Scale::parse(scale);
  } catch (const Error& e) {
    throw Error(std::string("--") + e.what());
  }
  o.threads = threads;
  if (!causal.empty()) {
    o.mask.causal = true;
    o.mask.align = parse_align(causal, "--causal");
  }
  if (!align.empty()) {
    const Align a = parse_align(align, "--align");
    if (!causal.empty() && a != o.mask.align)
      throw Error(fmt::format("--align: conflicts with --causal {} (they share one diagonal)", causal));
    o.mask.align = a;
  }
  if (!window.empty()) {  // two values, each >= -1 (CLI11 checked them)
    o.mask.window_left = window[0];
    o.mask.window_right = window[1];
  }
  if (!mask_path.empty()) {
    mask_storage = read_input("--mask", mask_path, InputDtypes::mask);
    o.mask.explicit_mask = mask_storage.view();
  }
  return o;
}

}  // namespace attnscale::cli
