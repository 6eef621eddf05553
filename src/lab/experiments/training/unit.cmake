# The training unit needs libtorch (Debian libtorch-dev). Without it (or in sanitizer and fuzz
# builds: libtorch is not instrumented, and those builds stay fast) the rest builds and
# `attnscale experiment training` is absent; its registry line is wrapped in ATTNSCALE_HAVE_TORCH.
if(NOT ATTNSCALE_SANITIZE AND NOT ATTNSCALE_FUZZ)
  find_package(Torch CONFIG QUIET)
endif()
if(NOT Torch_FOUND)
  message(STATUS "libtorch not found (or a sanitizer build): the training experiment is left out")
  return()
endif()
message(STATUS "libtorch ${Torch_VERSION}: the training experiment is built")
# torch's imported targets are seen by every directory that links the lab (cli/, python/, tests/).
get_property(ATTNSCALE_TORCH_TARGETS DIRECTORY PROPERTY IMPORTED_TARGETS)
foreach(t ${ATTNSCALE_TORCH_TARGETS})
  get_target_property(is_global ${t} IMPORTED_GLOBAL)
  if(NOT is_global)
    set_target_properties(${t} PROPERTIES IMPORTED_GLOBAL TRUE)
  endif()
endforeach()
# libattnscale_training: the model, the autograd op, the tasks, the training loop and the
# experiment. The lab's registry lists the experiment, so attnscale_lab and attnscale_training link
# each other (a cycle of static libraries, which CMake repeats on the link line).
file(GLOB ATTNSCALE_TRAINING_SOURCES CONFIGURE_DEPENDS ${UNIT_DIR}/*.cc)
list(REMOVE_ITEM ATTNSCALE_TRAINING_SOURCES ${UNIT_DIR}/report.cc)
add_library(attnscale_training STATIC ${ATTNSCALE_TRAINING_SOURCES})
target_link_libraries(attnscale_training PUBLIC attnscale_lab ${TORCH_LIBRARIES} ${CMAKE_DL_LIBS})
# Each file including torch/torch.h spends about 20 s parsing it, most of this unit's build time:
# its files are compiled as one (a unity build), which parses it once (so names in their anonymous
# namespaces must differ from file to file).
set_target_properties(attnscale_training PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 0)
target_compile_definitions(attnscale_lab PUBLIC ATTNSCALE_HAVE_TORCH=1)
target_link_libraries(attnscale_lab PUBLIC attnscale_training)
target_sources(attnscale_report PRIVATE ${UNIT_DIR}/report.cc)
target_compile_definitions(attnscale_report PUBLIC ATTNSCALE_HAVE_TORCH=1)
