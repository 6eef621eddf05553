# The recall experiment trains with the training unit's machinery (libtorch, attnscale_training).
# That unit's unit.cmake is included after this one (the folders go in name order), so these sources
# are added once the directory is processed; without libtorch (or in sanitizer and fuzz builds)
# neither experiment is built, and the registry line is wrapped in ATTNSCALE_HAVE_TORCH.
set(ATTNSCALE_RECALL_DIR ${UNIT_DIR})
function(attnscale_recall_sources)
  if(TARGET attnscale_training)
    target_sources(attnscale_training PRIVATE ${ATTNSCALE_RECALL_DIR}/experiment.cc)
    target_sources(attnscale_report PRIVATE ${ATTNSCALE_RECALL_DIR}/report.cc)
  endif()
endfunction()
cmake_language(DEFER CALL attnscale_recall_sources)
