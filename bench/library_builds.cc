// Two builds of libattnscale.so, each in a process of its own, their float32 forward (or backward)
// calls alternated in lockstep, so that both see the same minutes of a shared machine: on a host
// whose FMA loop moves 171-353 GFLOP/s between the rounds of one run, the per-pair ratio resolves
// 1-2% where whole runs of two processes one after the other do not. (One process holding both
// libraries would share their GNU-unique statics, such as the per-type scratch caches, between
// builds whose types differ.)
//
//   build/bin/library_builds --old OLD/build/src/libattnscale.so --new build/src/libattnscale.so
//       [--n 4096] [--d 128] [--heads 8] [--causal] [--backward] [--layout bhnd|bnhd]
//       [--new-layout bhnd|bnhd] [--pairs 20]
//
// Inputs are uniform in [-1, 1), in the library's own blocks (Tensor: huge pages, as a call's
// outputs); --layout bnhd views [B, N, H, d] buffers as [B, H, N, d] (FlashAttention's and
// PyTorch's layout); --new-layout gives the new build's process another layout (the same build as
// --old and --new: the layouts' times side by side). Prints each build's median time and the
// median [quartiles] of the per-pair ratio new / old, the order of the two calls alternating
// between pairs (two untimed pairs first).
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "attnscale/attention.h"

namespace {
using namespace attnscale;
using Forward = void (*)(const TensorView&, const TensorView&, const TensorView&, const Outputs&, const Options&);
using Backward = void (*)(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                          const TensorView&, const TensorView&, const Gradients&, const Options&);

struct Build {
  Forward forward;
  Backward backward;
};
// The library at path, its own symbols first (RTLD_DEEPBIND) over the tool's own copy of the library.
Build open_build(const std::string& path) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (!lib) throw std::runtime_error(dlerror());
  // attnscale::forward and attnscale::backward (attention.h), by their mangled names.
  auto* f = dlsym(lib, "_ZN9attnscale7forwardERKNS_10TensorViewES2_S2_RKNS_7OutputsERKNS_7OptionsE");
  auto* b = dlsym(lib, "_ZN9attnscale8backwardERKNS_10TensorViewES2_S2_S2_S2_S2_RKNS_9GradientsERKNS_7OptionsE");
  if (!f || !b) throw std::runtime_error(path + ": no attnscale::forward or attnscale::backward");
  return {reinterpret_cast<Forward>(f), reinterpret_cast<Backward>(b)};
}

// n floats uniform in [-1, 1) from a hash of the index (attention_bench's values).
Tensor filled(std::int64_t n) {
  Tensor t(DType::f32, {n});
  for (std::int64_t i = 0; i < n; ++i) t.as<float>()[i] = static_cast<float>((i * 2654435761u) % 20001) / 10000.0f - 1.0f;
  return t;
}

double median(std::vector<double> x, double at = 0.5) {
  std::sort(x.begin(), x.end());
  return x[static_cast<std::size_t>(at * (x.size() - 1) + 0.5)];
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Two builds of libattnscale.so, each in its own process, calls alternated in lockstep");
  std::string old_path, new_path, layout = "bhnd", new_layout;
  std::int64_t N = 4096, d = 128, H = 8;
  int pairs = 20;
  bool causal = false, backward = false;
  app.add_option("--old", old_path, "the old build's libattnscale.so")->required();
  app.add_option("--new", new_path, "the new build's libattnscale.so")->required();
  app.add_option("--n", N, "sequence length (queries and keys)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--d", d, "head dimension")->check(CLI::Range(1, 1024));
  app.add_option("--heads", H, "heads")->check(CLI::Range(1, 1024));
  app.add_option("--pairs", pairs, "timed pairs of calls")->check(CLI::Range(1, 100000));
  app.add_option("--layout", layout, "bhnd or bnhd (a [B, N, H, d] buffer)")->check(CLI::IsMember({"bhnd", "bnhd"}));
  app.add_option("--new-layout", new_layout, "the new build's layout (default: --layout)")
      ->check(CLI::IsMember({"bhnd", "bnhd"}));
  app.add_flag("--causal", causal, "causal mask");
  app.add_flag("--backward", backward, "time the backward (out and lse from one forward) instead");
  CLI11_PARSE(app, argc, argv);
  // One child per build: it opens the library and fills its inputs, then times one call for each
  // byte the parent writes, answering with the milliseconds (a negative number: an error).
  struct Child {
    pid_t pid;
    int to, from;
  };
  if (new_layout.empty()) new_layout = layout;
  const auto start_child = [&](const std::string& path, const std::string& layout) {
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) throw std::runtime_error("pipe failed");
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid > 0) {
      close(down[0]), close(up[1]);
      return Child{pid, down[1], up[0]};
    }
    close(down[1]), close(up[0]);
    double ms = -1;
    try {
      const Build build = open_build(path);
      const std::int64_t n = H * N * d;
      Tensor q = filled(n), k = filled(n), v = filled(n), out = filled(n), lse = filled(H * N), dout = filled(n),
             dq = filled(n), dk = filled(n), dv = filled(n);
      const auto view = [&](Tensor& t) {
        void* p = t.data();
        return layout == "bnhd" ? TensorView::strided(p, DType::f32, {1, H, N, d}, {N * H * d, d, H * d, 1})
                                : TensorView::contiguous(p, DType::f32, {1, H, N, d});
      };
      Options opt;
      opt.mask.causal = causal;
      const Outputs outputs{view(out), TensorView::contiguous(lse.data(), DType::f32, {1, H, N}), {}};
      const Gradients grads{view(dq), view(dk), view(dv), {}, {}};
      if (backward) build.forward(view(q), view(k), view(v), outputs, opt);
      char go;
      while (read(down[0], &go, 1) == 1) {
        const auto t0 = std::chrono::steady_clock::now();
        if (backward)
          build.backward(view(q), view(k), view(v), outputs.out, outputs.lse, view(dout), grads, opt);
        else
          build.forward(view(q), view(k), view(v), outputs, opt);
        ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (write(up[1], &ms, sizeof ms) != sizeof ms) break;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "library_builds: %s\n", e.what());
      if (write(up[1], &ms, sizeof ms) != sizeof ms) _exit(2);
    }
    _exit(0);
  };
  try {
    const Child children[2] = {start_child(old_path, layout), start_child(new_path, new_layout)};
    const auto call = [&](const Child& c) {
      const char go = 1;
      double ms = -1;
      if (write(c.to, &go, 1) != 1 || read(c.from, &ms, sizeof ms) != sizeof ms || ms < 0)
        throw std::runtime_error("");  // the child said why
      return ms;
    };
    std::vector<double> ms[2], ratio;
    for (int pair = -2; pair < pairs; ++pair) {
      double t[2];
      for (int turn = 0; turn < 2; ++turn) {
        const int which = pair % 2 == 0 ? turn : 1 - turn;
        t[which] = call(children[which]);
      }
      if (pair < 0) continue;
      ms[0].push_back(t[0]), ms[1].push_back(t[1]), ratio.push_back(t[1] / t[0]);
    }
    // Every write end closed first: the second child holds a copy of the first one's.
    for (const Child& c : children) close(c.to);
    for (const Child& c : children) waitpid(c.pid, nullptr, 0);
    const std::string layouts = layout == new_layout ? layout : layout + " / " + new_layout;
    std::printf("%s N=%lld d=%lld H=%lld%s %s: old %.3f ms, new %.3f ms (medians); new / old %.4f [%.4f, %.4f], %d pairs\n",
                backward ? "backward" : "forward", static_cast<long long>(N), static_cast<long long>(d),
                static_cast<long long>(H), causal ? " causal" : "", layouts.c_str(), median(ms[0]), median(ms[1]),
                median(ratio), median(ratio, 0.25), median(ratio, 0.75), pairs);
  } catch (const std::exception& e) {
    if (*e.what()) std::fprintf(stderr, "library_builds: %s\n", e.what());
    return 2;
  }
  return 0;
}
