# The folder of the libraries, the CMake package and the pkg-config files (GNUInstallDirs'
# CMAKE_INSTALL_LIBDIR), chosen before GNUInstallDirs is included (CMakeLists.txt). On Debian and
# its derivatives it is the multiarch folder lib/<triplet>, the triplet the compiler reports
# (CMAKE_LIBRARY_ARCHITECTURE: x86_64-linux-gnu on amd64), under every prefix:
#   - the .deb (cmake/package.cmake) installs under /usr, where Debian keeps libraries in
#     /usr/lib/<triplet>, and it is made from the same build as `cmake --install --prefix P`;
#   - the CMake package's paths (install(EXPORT)) are fixed when the build is configured, while the
#     prefix is only named at install time, so one build cannot choose its library folder by prefix.
#     (GNUInstallDirs picks lib/<triplet> only when CMAKE_INSTALL_PREFIX is /usr at configure time;
#     `make`'s build keeps the default /usr/local.)
# /usr/local/lib/<triplet> is on Debian's search paths too (ld.so.conf.d, pkg-config, CMake's
# find_package). -DCMAKE_INSTALL_LIBDIR=lib keeps the plain folder. Elsewhere GNUInstallDirs decides.
if(NOT PROJECT_IS_TOP_LEVEL OR NOT CMAKE_LIBRARY_ARCHITECTURE OR NOT EXISTS /etc/debian_version)
  return()
endif()
set(ATTNSCALE_MULTIARCH_LIBDIR lib/${CMAKE_LIBRARY_ARCHITECTURE})
if(NOT DEFINED CMAKE_INSTALL_LIBDIR)
  set(CMAKE_INSTALL_LIBDIR ${ATTNSCALE_MULTIARCH_LIBDIR} CACHE PATH "Object code libraries (${ATTNSCALE_MULTIARCH_LIBDIR})")
elseif(NOT DEFINED ATTNSCALE_LIBDIR_CHOSEN AND DEFINED _GNUInstallDirs_LAST_CMAKE_INSTALL_PREFIX
       AND CMAKE_INSTALL_LIBDIR STREQUAL "lib")
  # A build folder configured before this file existed holds GNUInstallDirs' own default, "lib":
  # moved once to the multiarch folder (a value set later with -D stays).
  set_property(CACHE CMAKE_INSTALL_LIBDIR PROPERTY VALUE ${ATTNSCALE_MULTIARCH_LIBDIR})
endif()
set(ATTNSCALE_LIBDIR_CHOSEN ON CACHE INTERNAL "cmake/multiarch_libdir.cmake has chosen CMAKE_INSTALL_LIBDIR")
