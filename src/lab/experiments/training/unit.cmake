# The training unit needs libtorch (Debian libtorch-dev). Without it (or in sanitizer and fuzz
# builds: libtorch is not instrumented, and those builds stay fast) the rest builds and
# `attnscale experiment training` is absent; its registry line is wrapped in ATTNSCALE_HAVE_TORCH.
if(NOT ATTNSCALE_SANITIZE AND NOT ATTNSCALE_FUZZ)
  find_package(Torch CONFIG QUIET)
endif()
if(NOT Torch_FOUND AND ATTNSCALE_REQUIRE_TORCH AND NOT ATTNSCALE_SANITIZE AND NOT ATTNSCALE_FUZZ)
  message(FATAL_ERROR "ATTNSCALE_REQUIRE_TORCH=ON but libtorch was not found (Debian: apt-get install "
    "libtorch-dev, or `make deps`); without it the training and recall experiments, their tests and "
    "the report's training section would be left out. Configure with -DATTNSCALE_REQUIRE_TORCH=OFF "
    "to build without them.")
endif()
if(NOT Torch_FOUND)
  message(STATUS "libtorch not found (or a sanitizer build): the training experiment is left out")
  return()
endif()
message(STATUS "libtorch ${Torch_VERSION}: the training experiment is built")
# torch's imported targets are seen by every directory that links the unit's libtorch code (tests/,
# bench/).
get_property(ATTNSCALE_TORCH_TARGETS DIRECTORY PROPERTY IMPORTED_TARGETS)
foreach(t ${ATTNSCALE_TORCH_TARGETS})
  get_target_property(is_global ${t} IMPORTED_GLOBAL)
  if(NOT is_global)
    set_target_properties(${t} PROPERTIES IMPORTED_GLOBAL TRUE)
  endif()
endforeach()

# The unit in two parts (torch_module.h). What needs libtorch (the model, the autograd op, the
# tasks' batches, the training loop, the module's entry point) is attnscale_training; the rest (the
# sweep as an experiment, its flags and their checks, the fortunes text, the module's loader) goes
# into the lab, which links no libtorch.
set(ATTNSCALE_TRAINING_TORCH_SOURCES)
foreach(name attention_function model tasks train_run torch_module_entry)
  list(APPEND ATTNSCALE_TRAINING_TORCH_SOURCES ${UNIT_DIR}/${name}.cc)
endforeach()
file(GLOB ATTNSCALE_TRAINING_LAB_SOURCES CONFIGURE_DEPENDS ${UNIT_DIR}/*.cc)
list(REMOVE_ITEM ATTNSCALE_TRAINING_LAB_SOURCES ${UNIT_DIR}/report.cc ${ATTNSCALE_TRAINING_TORCH_SOURCES})
target_sources(attnscale_lab PRIVATE ${ATTNSCALE_TRAINING_LAB_SOURCES})
target_compile_definitions(attnscale_lab PUBLIC ATTNSCALE_HAVE_TORCH=1)
target_link_libraries(attnscale_lab PRIVATE ${CMAKE_DL_LIBS})
target_sources(attnscale_report PRIVATE ${UNIT_DIR}/report.cc)
target_compile_definitions(attnscale_report PUBLIC ATTNSCALE_HAVE_TORCH=1)

# attnscale_training: the libtorch code, compiled once for the module and for the tests and the
# bench that call it directly (tests/training, bench/training_step.cc). Each file including
# torch/torch.h spends about 20 s parsing it, most of this unit's build time: its files are
# compiled as one (a unity build), which parses it once (so names in their anonymous namespaces
# must differ from file to file). Hidden symbols: of our own, the module exports its entry point alone.
add_library(attnscale_training OBJECT ${ATTNSCALE_TRAINING_TORCH_SOURCES})
target_link_libraries(attnscale_training PUBLIC attnscale_lab ${TORCH_LIBRARIES})
set_target_properties(attnscale_training PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 0
                      CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)

# libattnscale_torch_units.so: the module the lab opens on the first training run. It holds its
# own copy of what it uses of the lab and the library (static, its symbols kept local: no
# process-wide symbol of ours is bound to the module's, or the other way round) and links
# libtorch; --no-undefined checks that it needs nothing from the process that opens it.
add_library(attnscale_torch_units MODULE)
target_link_libraries(attnscale_torch_units PRIVATE attnscale_training)
target_link_options(attnscale_torch_units PRIVATE -Wl,--exclude-libs,ALL -Wl,--no-undefined -Wl,--as-needed)
# Its folder relative to an executable's is the installed one (bin → lib/attnscale), and the build
# tree has the same (build/bin → build/lib/attnscale), so an executable finds it the same way in
# both; a shared object holding the lab (the Python module) has a copy next to it (python/). A
# program's private folder, lib/attnscale, not under the libraries' (on Debian lib/<triplet>:
# cmake/multiarch_libdir.cmake), which holds what other projects link.
set(ATTNSCALE_TORCH_MODULE_INSTALL_DIR lib/attnscale)
file(RELATIVE_PATH ATTNSCALE_TORCH_MODULE_DIR ${CMAKE_INSTALL_FULL_BINDIR}
     ${CMAKE_INSTALL_PREFIX}/${ATTNSCALE_TORCH_MODULE_INSTALL_DIR})
set(ATTNSCALE_TORCH_MODULE_FILE ${CMAKE_SHARED_MODULE_PREFIX}attnscale_torch_units${CMAKE_SHARED_MODULE_SUFFIX})
# For python/ (its copy) and cmake/install.cmake.
set(ATTNSCALE_TORCH_MODULE_FILE ${ATTNSCALE_TORCH_MODULE_FILE} PARENT_SCOPE)
set(ATTNSCALE_TORCH_MODULE_INSTALL_DIR ${ATTNSCALE_TORCH_MODULE_INSTALL_DIR} PARENT_SCOPE)
if(CMAKE_RUNTIME_OUTPUT_DIRECTORY)
  set(executables_dir ${CMAKE_RUNTIME_OUTPUT_DIRECTORY})
else()  # under add_subdirectory: the CLI's folder, one below the project's build folder
  set(executables_dir ${PROJECT_BINARY_DIR}/cli)
endif()
cmake_path(ABSOLUTE_PATH ATTNSCALE_TORCH_MODULE_DIR BASE_DIRECTORY ${executables_dir} NORMALIZE
           OUTPUT_VARIABLE module_build_dir)
set_target_properties(attnscale_torch_units PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${module_build_dir})
set_property(SOURCE ${UNIT_DIR}/torch_module.cc APPEND PROPERTY COMPILE_DEFINITIONS
             ATTNSCALE_TORCH_MODULE_FILE="${ATTNSCALE_TORCH_MODULE_FILE}"
             ATTNSCALE_TORCH_MODULE_DIR="${ATTNSCALE_TORCH_MODULE_DIR}")
# Whatever links the lab (the CLI, the tests, the Python module) gets the module built with it.
add_dependencies(attnscale_internal attnscale_torch_units)
