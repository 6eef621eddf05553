# Run at every build (src/CMakeLists.txt): writes OUT, a header defining ATTNSCALE_GIT_HASH as the
# commit the sources are at ("+changes" when tracked files differ from it, "unknown" outside a git
# checkout), so that results and `--version` name the commit that was built rather than the one
# the build directory was configured at. OUT is rewritten only when the text changes, so an
# unchanged commit recompiles nothing.
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE hash OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT hash)
  set(hash unknown)
else()
  execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SRC}
                  OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(changes)
    string(APPEND hash "+changes")
  endif()
endif()
file(WRITE ${OUT}.new "#define ATTNSCALE_GIT_HASH \"${hash}\"\n")
file(COPY_FILE ${OUT}.new ${OUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUT}.new)
