#include "lab/experiments/training/torch_module.h"

#include <dlfcn.h>
#include <link.h>

#include <filesystem>

#include "attnscale/error.h"
#include "attnscale/version.h"

// Set by unit.cmake: the module's file name, and its folder relative to an executable's.
#ifndef ATTNSCALE_TORCH_MODULE_FILE
#error "ATTNSCALE_TORCH_MODULE_FILE: the module's file name (unit.cmake)"
#endif
#ifndef ATTNSCALE_TORCH_MODULE_DIR
#error "ATTNSCALE_TORCH_MODULE_DIR: the module's folder relative to an executable's (unit.cmake)"
#endif

namespace attnscale::lab::training {
namespace {

using Entry = decltype(&attnscale_torch_train);
using Build = decltype(&attnscale_torch_module_build);

// dlerror() without the path it starts with, when it does (the message names the path already).
std::string reason(const std::string& path) {
  const char* e = dlerror();
  std::string text = e ? e : "unknown error";
  if (text.rfind(path + ": ", 0) == 0) text.erase(0, path.size() + 2);
  return text;
}

Entry open_module() {
  const std::string path = torch_module_path();
  void* module = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  const auto entry = module ? reinterpret_cast<Entry>(dlsym(module, "attnscale_torch_train")) : nullptr;
  const auto build = entry ? reinterpret_cast<Build>(dlsym(module, "attnscale_torch_module_build")) : nullptr;
  if (!build) throw Error("cannot load the lab's libtorch module " + path + ": " + reason(path));
  if (const std::string theirs = build(); theirs != build_stamp())
    throw Error("the lab's libtorch module " + path + " is of attnscale " + theirs + ", not of this " +
                build_stamp() + ": rebuild or reinstall attnscale");
  return entry;
}

}  // namespace

std::string build_stamp() { return std::string(attnscale::version()) + " (" + attnscale::git_hash() + ")"; }

std::string torch_module_path() {
  // The object this code was linked into: the executable (its path from /proc/self/exe, as the
  // dynamic loader's $ORIGIN), or the shared object that holds the lab (its path as it was opened).
  namespace fs = std::filesystem;
  Dl_info info;
  link_map* object = nullptr;
  if (dladdr1(reinterpret_cast<void*>(&torch_module_path), &info, reinterpret_cast<void**>(&object),
              RTLD_DL_LINKMAP) == 0 || object == nullptr)
    throw Error("cannot find the program that holds the lab (dladdr)");
  const bool executable = object->l_name[0] == '\0';  // the main program's link map has no name
  std::error_code error;
  const fs::path holder = executable ? fs::read_symlink("/proc/self/exe", error) : fs::absolute(info.dli_fname, error);
  if (error) throw Error("cannot find the program that holds the lab: " + error.message());
  const fs::path folder = executable ? holder.parent_path() / ATTNSCALE_TORCH_MODULE_DIR : holder.parent_path();
  return (folder / ATTNSCALE_TORCH_MODULE_FILE).lexically_normal().string();
}

RunRecord train_in_torch_module(const RunConfig& c) {
  static const Entry entry = open_module();  // once; tried again by the next run after a failure
  RunRecord record;
  entry(&c, &record);
  return record;
}

}  // namespace attnscale::lab::training
