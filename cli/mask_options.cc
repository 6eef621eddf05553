#include "mask_options.h"

#include <cerrno>
#include <cstdlib>

#include "attnscale/error.h"
#include "attnscale/npy.h"

namespace attnscale::cli {
namespace {

Align parse_align(const std::string& flag, const std::string& text) {
  if (text == "top-left") return Align::top_left;
  if (text == "bottom-right") return Align::bottom_right;
  throw Error(flag + ": expected top-left or bottom-right, got '" + text + "'");
}

std::int64_t parse_size(const std::string& text, const std::string& whole) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || v < -1)
    throw Error("--window: expected L,R with integers >= 0 (or -1 for unbounded), got '" + whole + "'");
  return v;
}

}  // namespace

void MaskFlags::add_to(CLI::App& app, bool with_mask_file) {
  app.add_option("--scale", scale, "Scale s: none (1), sqrt (1/sqrt(dk)), linear (1/dk) or a number")
      ->capture_default_str();
  app.add_option("--causal", causal, "Causal mask aligned top-left (key j <= query i) or bottom-right "
                                     "(j <= i + Nkv - Nq)")
      ->type_name("ALIGN");
  app.add_option("--window", window, "Sliding window L,R: keys diag-L..diag+R are visible (-1: unbounded)")
      ->type_name("L,R");
  app.add_option("--align", align, "Diagonal of --window when --causal is not given (default top-left)")
      ->type_name("ALIGN");
  if (with_mask_file)
    app.add_option("--mask", mask_path, "Mask .npy, [Nq,Nkv] or [B|1,H|1,Nq,Nkv]: bool/uint8 (nonzero = "
                                        "keep) or float (added to the scaled scores)")
        ->type_name("FILE");
  app.add_option("--threads", threads, "Worker threads (0: $ATTNSCALE_THREADS or all cores)")
      ->check(CLI::Validator(
          [](std::string& text) {
            char* end = nullptr;
            errno = 0;
            const long v = std::strtol(text.c_str(), &end, 10);
            if (text.empty() || *end != '\0' || errno == ERANGE || v < 0 || v > 1 << 20)
              return "expected an integer from 0 to 1048576, got '" + text + "'";
            return std::string();
          },
          "INT>=0"));
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
    o.mask.align = parse_align("--causal", causal);
  }
  if (!align.empty()) {
    const Align a = parse_align("--align", align);
    if (!causal.empty() && a != o.mask.align)
      throw Error("--align: conflicts with --causal " + causal + " (they share one diagonal)");
    o.mask.align = a;
  }
  if (!window.empty()) {
    const auto comma = window.find(',');
    if (comma == std::string::npos)
      throw Error("--window: expected L,R with integers >= 0 (or -1 for unbounded), got '" + window + "'");
    o.mask.window_left = parse_size(window.substr(0, comma), window);
    o.mask.window_right = parse_size(window.substr(comma + 1), window);
  }
  if (!mask_path.empty()) {
    mask_storage = read_npy(mask_path);
    o.mask.explicit_mask = mask_storage.view();
  }
  return o;
}

}  // namespace attnscale::cli
