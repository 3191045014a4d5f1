# Cross build for linux-ppc64le (Power8 and later, little-endian) with Debian's
# gcc-powerpc64le-linux-gnu: cmake -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-powerpc64le-linux-gnu.cmake
set(DDL_CROSS_TRIPLE powerpc64le-linux-gnu)
set(CMAKE_SYSTEM_PROCESSOR ppc64le)
include(${CMAKE_CURRENT_LIST_DIR}/cross-debian.cmake)
