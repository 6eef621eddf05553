# The Debian package: `cpack -G DEB` in the build folder, or `make deb`, writes
# build/packages/attnscale_<version>_<arch>.deb holding everything `cmake --install` installs,
# under /usr (the libraries, the CMake package and the pkg-config files in Debian's multiarch
# folder, /usr/lib/<triplet>: cmake/multiarch_libdir.cmake). Its dependencies on shared libraries (libhwy, libstdc++, libfmt, libcmark-gfm ...)
# are computed by dpkg-shlibdeps (Debian's dpkg-dev); the rest are named here.
set(CPACK_PACKAGE_NAME attnscale)
set(CPACK_PACKAGE_VENDOR attnscale)
set(CPACK_PACKAGE_CONTACT "attnscale maintainers <attnscale@example.org>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "scaled dot-product attention on the CPU, with a lab and a CLI")
set(CPACK_PACKAGE_DESCRIPTION "A CPU attention library (forward, backward, masks, GQA, fp32/fp64/bf16,
Highway SIMD), the command-line tool attnscale (attend, explain, experiment,
report, bench) and the Python module attnscale.")
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/packages)
set(CPACK_GENERATOR DEB)
# Installed with DESTDIR and the prefix /usr, so the install rules see the real prefix (the
# Python package's folder depends on it: cmake/install.cmake).
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# Stripped, as Debian ships binaries (the symbol tables go; the dynamic symbols the lab looks up stay).
set(CPACK_STRIP_FILES ON)
# Control files (cmake/debian/): libattnscale.so.0's shlibs entry, the trigger that runs ldconfig
# once dpkg is done, the postinst that compiles the Python modules (py3compile), the prerm that
# removes that bytecode again, and a postrm that does nothing: without one CPack writes its own,
# which calls ldconfig (a second time, after the trigger) for any package with libraries under
# /usr/lib, and lintian warns of it (maintscript-calls-ldconfig).
configure_file(${CMAKE_CURRENT_LIST_DIR}/debian/shlibs.in ${PROJECT_BINARY_DIR}/debian/shlibs @ONLY)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${PROJECT_BINARY_DIR}/debian/shlibs ${CMAKE_CURRENT_LIST_DIR}/debian/triggers
    ${CMAKE_CURRENT_LIST_DIR}/debian/postinst ${CMAKE_CURRENT_LIST_DIR}/debian/prerm
    ${CMAKE_CURRENT_LIST_DIR}/debian/postrm)
# The changelog Debian asks of a native package (usr/share/doc/attnscale/changelog.gz), compressed
# as dpkg-deb expects (gzip -9n: no name or time stamp, so the same bytes from every build).
configure_file(${CMAKE_CURRENT_LIST_DIR}/debian/changelog.in ${PROJECT_BINARY_DIR}/debian/changelog @ONLY)
execute_process(COMMAND gzip -9nf ${PROJECT_BINARY_DIR}/debian/changelog COMMAND_ERROR_IS_FATAL ANY)
install(FILES ${PROJECT_BINARY_DIR}/debian/changelog.gz DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT runtime)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
if(TARGET _attnscale)
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "python3 (>= ${ATTNSCALE_PYTHON_VERSION}), python3 (<< ${ATTNSCALE_PYTHON_NEXT}), python3-numpy (>= 1:${ATTNSCALE_NUMPY_VERSION}), python3-numpy-abi9")
endif()
# attnscale report draws with gnuplot; attnscale bench opens OpenBLAS; attnscale.torch needs torch;
# building against the static library needs Highway's development files, and attnscale::distributed
# Open MPI's (docs/install.md). The shared library needs neither.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "gnuplot-nox, libopenblas0")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "python3-torch, libhwy-dev, libopenmpi-dev")
include(CPack)
