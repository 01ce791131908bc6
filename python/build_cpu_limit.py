"""The C++ part of the native core: csrc/cpu_limit.cpp, built into gmux/_cpu_limit*.so (setup.py asks here).

It is a c10::Allocator, so it is compiled against the torch it will run with (headers, libc10, the C++ ABI
torch was built with) and finds libc10 there at run time (rpath). Optional: without torch at build time, or
when it fails to compile, gmux installs without it and a job on a virtual GPU runs without its memory limit
enforced, saying so (gmux/job/memory/limit.py). It has no Python module init: it is loaded with ctypes.
"""
import os


def extension():
    try:
        import torch
    except ImportError:
        return None
    from setuptools import Extension

    torch_dir = os.path.dirname(torch.__file__)
    lib = os.path.join(torch_dir, "lib")
    return Extension(
        "gmux._cpu_limit",
        sources=[os.path.join("csrc", "cpu_limit.cpp")],
        include_dirs=[os.path.join(torch_dir, "include")],
        library_dirs=[lib],
        runtime_library_dirs=[lib],
        libraries=["c10"],
        language="c++",
        extra_compile_args=["-std=c++17", "-O2", "-Wall",
                            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"],
        optional=True,
    )
