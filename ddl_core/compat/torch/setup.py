"""Builds ddl_torch._C against the torch that is installed (no build isolation: the
extension must match that torch's C++ ABI and its bundled pybind11 exactly)."""

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    ext_modules=[CppExtension("ddl_torch._C", ["csrc/backend.cpp"],
                              extra_compile_args=["-O2", "-Wall", "-Wextra", "-Werror",
                                                  "-Wno-unused-parameter"],
                              # libc10, libtorch_cpu, libtorch_python: torch's own lib/ beside
                              # this package in site-packages, found without torch loaded
                              # first (envtools validate checks every library resolves)
                              extra_link_args=["-Wl,-rpath,$ORIGIN/../torch/lib"])],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
)
