"""Builds ddl_torch._C against the torch that is installed (no build isolation: the
extension must match that torch's C++ ABI and its bundled pybind11 exactly)."""

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    ext_modules=[CppExtension("ddl_torch._C", ["csrc/backend.cpp"],
                              extra_compile_args=["-O2", "-Wall", "-Wextra", "-Werror",
                                                  "-Wno-unused-parameter"])],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
)
