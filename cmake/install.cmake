# Install rules (included by the top-level CMakeLists.txt when ATTNSCALE_INSTALL is ON).
#   cmake --install build --prefix P   (`make install`: P = /usr/local)
# puts under P: include/attnscale/*.h; LIBDIR/libattnscale.{a,so} (LIBDIR: lib/<triplet> on Debian,
# lib/x86_64-linux-gnu on amd64: cmake/multiarch_libdir.cmake); bin/attnscale with the lab's
# libtorch module lib/attnscale/libattnscale_torch_units.so (where bin/attnscale looks for it:
# src/lab/experiments/training/torch_module.h); the CMake package
# LIBDIR/cmake/attnscale/ (find_package(attnscale CONFIG) → attnscale::attnscale); the pkg-config
# files LIBDIR/pkgconfig/attnscale.pc and attnscale-distributed.pc; and the Python package attnscale/ in Debian's layout (see below),
# with a symbolic link to the module next to _lab; the documentation, docs/*.md, as
# share/doc/attnscale/*.md (the CLI's help and the Python docstrings name docs/lab.md,
# docs/distributed.md ...).
# Components (`cmake --install build --component C`), each complete on its own:
#   runtime      libattnscale.so.0
#   development  headers, the libraries, the CMake package, the pkg-config files
#   cli          bin/attnscale, its manual page, the libtorch module and the documentation
#   python       the Python package, the libtorch module, the package's link to it and the documentation
include(CMakePackageConfigHelpers)

set(ATTNSCALE_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/attnscale)

set(ATTNSCALE_HEADER_FILTER)
if(NOT TARGET attnscale_distributed)
  set(ATTNSCALE_HEADER_FILTER PATTERN distributed.h EXCLUDE)
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/attnscale DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT development ${ATTNSCALE_HEADER_FILTER})
set(ATTNSCALE_INSTALLED_LIBRARIES attnscale)
if(TARGET attnscale_shared)
  list(APPEND ATTNSCALE_INSTALLED_LIBRARIES attnscale_shared)
endif()
install(TARGETS ${ATTNSCALE_INSTALLED_LIBRARIES} EXPORT attnscaleTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT development)
if(TARGET attnscale_shared)  # development builds against it: the CMake package checks it is there
  install(TARGETS attnscale_shared LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
          NAMELINK_SKIP)
endif()
install(EXPORT attnscaleTargets NAMESPACE attnscale:: DESTINATION ${ATTNSCALE_INSTALL_CMAKEDIR}
        COMPONENT development)
# Context-parallel attention (include/attnscale/distributed.h) when MPI was found:
# attnscale::distributed, in a file of its own that the package reads only for COMPONENTS distributed.
set(ATTNSCALE_WITH_MPI OFF)
if(TARGET attnscale_distributed)
  set(ATTNSCALE_WITH_MPI ON)
  set_target_properties(attnscale_distributed PROPERTIES EXPORT_NAME distributed)
  install(TARGETS attnscale_distributed EXPORT attnscaleDistributedTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development)
  install(EXPORT attnscaleDistributedTargets NAMESPACE attnscale:: DESTINATION ${ATTNSCALE_INSTALL_CMAKEDIR}
          COMPONENT development)
endif()
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/attnscaleConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/attnscaleConfig.cmake
                              INSTALL_DESTINATION ${ATTNSCALE_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/attnscaleConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)  # 0.x: a minor release may break
install(FILES ${PROJECT_BINARY_DIR}/attnscaleConfig.cmake ${PROJECT_BINARY_DIR}/attnscaleConfigVersion.cmake
        DESTINATION ${ATTNSCALE_INSTALL_CMAKEDIR} COMPONENT development)

# pkg-config: attnscale.pc, and attnscale-distributed.pc where the distributed library is built,
# in LIBDIR/pkgconfig. Under /usr (the .deb) they name prefix=/usr, so that pkg-config recognises
# Debian's own folders and prints neither -I/usr/include nor -L/usr/lib/<triplet>; under any other
# prefix the prefix is found from the file's own place (${pcfiledir}), so the prefix given to
# `cmake --install --prefix` at install time (not the one configured) is the one it names, and the
# installed tree may be moved. Both variants are written now; the install picks one.
set(ATTNSCALE_PC_FILES attnscale.pc)
if(ATTNSCALE_WITH_MPI)
  list(APPEND ATTNSCALE_PC_FILES attnscale-distributed.pc)
endif()
file(RELATIVE_PATH ATTNSCALE_PC_TO_PREFIX /root/${CMAKE_INSTALL_LIBDIR}/pkgconfig /root)
foreach(variant relocatable usr)
  if(variant STREQUAL "usr")
    set(ATTNSCALE_PC_PREFIX /usr)
  else()
    set(ATTNSCALE_PC_PREFIX "\${pcfiledir}/${ATTNSCALE_PC_TO_PREFIX}")
  endif()
  foreach(pc ${ATTNSCALE_PC_FILES})
    configure_file(${CMAKE_CURRENT_LIST_DIR}/${pc}.in ${PROJECT_BINARY_DIR}/pkgconfig/${variant}/${pc} @ONLY)
  endforeach()
endforeach()
list(TRANSFORM ATTNSCALE_PC_FILES PREPEND "${PROJECT_BINARY_DIR}/pkgconfig/\${variant}/")
install(CODE "
  set(variant relocatable)
  if(CMAKE_INSTALL_PREFIX MATCHES \"^/usr/?$\")
    set(variant usr)
  endif()
  file(INSTALL DESTINATION \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig\" TYPE FILE
       FILES ${ATTNSCALE_PC_FILES})" COMPONENT development)

if(TARGET attnscale_cli)
  # No run path of its own: its libraries are the system's, and the one MPI's link flags carry
  # (-Wl,-rpath) stays as it is instead of being rewritten at install time.
  set_target_properties(attnscale_cli PROPERTIES SKIP_BUILD_RPATH ON)
  install(TARGETS attnscale_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)
endif()
if(TARGET attnscale_man)  # its manual page (cli/man_page.cmake)
  install(FILES ${PROJECT_BINARY_DIR}/man/attnscale.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT cli)
endif()
# The documentation the CLI's help, its manual page and the Python docstrings point to, in both
# components that name it (a whole install writes it once).
file(GLOB ATTNSCALE_DOCS ${PROJECT_SOURCE_DIR}/docs/*.md)
foreach(component cli python)
  install(FILES ${ATTNSCALE_DOCS} DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT ${component})
endforeach()
# The lab's libtorch module, one file: lib/attnscale/, where bin/attnscale looks for it. The Python
# package's _lab, which looks next to itself, finds it through a symbolic link (below). Both
# components that open it install it, so each works installed alone (a whole install writes it once).
if(TARGET attnscale_torch_units)
  foreach(component cli python)
    install(TARGETS attnscale_torch_units LIBRARY DESTINATION ${ATTNSCALE_TORCH_MODULE_INSTALL_DIR}
            COMPONENT ${component})
  endforeach()
endif()

# The Python package goes where Debian's python3 looks for it, chosen when installing (the prefix
# is only known then): lib/python3/dist-packages under /usr (Debian packages, the .deb), else
# lib/python3.X/dist-packages (/usr/local/lib/python3.X/dist-packages is on Debian's sys.path;
# under another prefix P, set PYTHONPATH=P/lib/python3.X/dist-packages). `pip install .` is the
# other way in (setup.py).
if(TARGET _attnscale)
  install(CODE "
    if(CMAKE_INSTALL_PREFIX STREQUAL \"/usr\")
      set(ATTNSCALE_PYTHON_DIR lib/python3/dist-packages)
    else()
      set(ATTNSCALE_PYTHON_DIR lib/python${ATTNSCALE_PYTHON_VERSION}/dist-packages)
    endif()" COMPONENT python)
  set(torch_module_copy)
  if(TARGET attnscale_torch_units)
    set(torch_module_copy PATTERN ${ATTNSCALE_TORCH_MODULE_FILE} EXCLUDE)
  endif()
  install(DIRECTORY ${ATTNSCALE_PYTHON_PACKAGE_DIR} DESTINATION "\${ATTNSCALE_PYTHON_DIR}" COMPONENT python
          PATTERN __pycache__ EXCLUDE ${torch_module_copy})
  # Its extension modules as install(TARGETS) leaves the other installed targets, which
  # install(DIRECTORY) does not: without the build tree's run path (the folder of MPI's libmpi.so
  # link, which the installed libmpi.so.40 does not need on Debian, where it lies in the default
  # search path), and stripped under `cmake --install --strip` (in the .deb, CPACK_STRIP_FILES).
  install(CODE "
    file(GLOB modules \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/\${ATTNSCALE_PYTHON_DIR}/attnscale/_*.so\")
    foreach(module \${modules})
      file(RPATH_REMOVE FILE \${module})
      if(CMAKE_INSTALL_DO_STRIP)
        execute_process(COMMAND \"${CMAKE_STRIP}\" --strip-unneeded \${module} COMMAND_ERROR_IS_FATAL ANY)
      endif()
    endforeach()" COMPONENT python)
  if(TARGET attnscale_torch_units)
    # attnscale/libattnscale_torch_units.so → ../../../attnscale/libattnscale_torch_units.so (the
    # path between the two folders, whichever Python folder was chosen): the build tree's copy
    # beside _lab is not installed. The wheel, which has no lib/attnscale, keeps a copy (setup.py).
    install(CODE "
      set(link \"\${ATTNSCALE_PYTHON_DIR}/attnscale/${ATTNSCALE_TORCH_MODULE_FILE}\")
      file(RELATIVE_PATH target \"/\${ATTNSCALE_PYTHON_DIR}/attnscale\"
           \"/${ATTNSCALE_TORCH_MODULE_INSTALL_DIR}/${ATTNSCALE_TORCH_MODULE_FILE}\")
      set(link \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/\${link}\")
      message(STATUS \"Installing: \${link} -> \${target}\")
      file(CREATE_LINK \${target} \${link} SYMBOLIC)
      list(APPEND CMAKE_INSTALL_MANIFEST_FILES \${link})" COMPONENT python)
  endif()
endif()
