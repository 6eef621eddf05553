# The recall experiment trains with the training unit's machinery: its sweep in the lab, its runs in
# the libtorch module (training/torch_module.h). That unit's unit.cmake is included after this one
# (the folders go in name order), so these sources are added once the directory is processed;
# without libtorch (or in sanitizer and fuzz builds) neither experiment is built, and the registry
# line is wrapped in ATTNSCALE_HAVE_TORCH.
set(ATTNSCALE_RECALL_DIR ${UNIT_DIR})
function(attnscale_recall_sources)
  if(TARGET attnscale_torch_units)
    target_sources(attnscale_lab PRIVATE ${ATTNSCALE_RECALL_DIR}/experiment.cc)
    target_sources(attnscale_report PRIVATE ${ATTNSCALE_RECALL_DIR}/report.cc)
  endif()
endfunction()
cmake_language(DEFER CALL attnscale_recall_sources)
