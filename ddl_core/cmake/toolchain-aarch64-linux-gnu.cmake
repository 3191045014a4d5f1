# Cross build for linux-aarch64 (Grace, Graviton, Ampere) with Debian's gcc-aarch64-linux-gnu:
# cmake -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64-linux-gnu.cmake
set(DDL_CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
include(${CMAKE_CURRENT_LIST_DIR}/cross-debian.cmake)
