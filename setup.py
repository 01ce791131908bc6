"""gmux: a GPU multiplexer for PyTorch training. Builds the Python package and its native core (gmux._native)."""
import os

from setuptools import find_packages, setup

here = os.path.dirname(os.path.abspath(__file__))
native_build = os.path.join("python", "build_native.py")


def _cpu_limit():
    """The memory limit of jobs on virtual GPUs (csrc/cpu_limit.cpp), built against the installed torch."""
    import sys
    sys.path.insert(0, os.path.join(here, "python"))
    try:
        from build_cpu_limit import extension
    finally:
        sys.path.pop(0)
    ext = extension()
    return [ext] if ext is not None else []


setup(
    name="gmux",
    version="0.1.0",
    description="Time-slice, pack and migrate PyTorch training jobs on shared GPUs",
    packages=find_packages(include=["gmux", "gmux.*"]),
    python_requires=">=3.10",
    install_requires=[
        # A range, not a pin: a GPU machine keeps the torch it has; CPU machines get 2.13.0 from requirements-cpu.txt.
        "torch>=2.4",
        "numpy",
        "pyzmq>=25",
        "msgpack>=1.0",
        "cffi>=1.15",
        "rich>=13",
        "prometheus-client>=0.17",
        "nvidia-ml-py>=12",
        "matplotlib>=3.7",
        "cryptography>=42",   # AES-GCM for a transfer's bulk bytes (gmux.wire.sealed)
    ],
    # The frameworks are for tests only (tests/node/test_e2e_frameworks.py): gmux imports them only when the script
    # does. Pinned to versions that install beside torch 2.13.0 without pulling another torch (about 50 s here).
    extras_require={"test": ["pytest>=7", "pytest-timeout", "pytest-xdist>=3", "hypothesis>=6",
                             "transformers==5.24.0", "accelerate==1.15.0", "lightning==2.6.6"]},
    setup_requires=["cffi>=1.15"],
    ext_modules=_cpu_limit(),
    cffi_modules=[native_build + ":ffibuilder"] if os.path.exists(os.path.join(here, native_build)) else [],
    entry_points={
        "console_scripts": [
            "gmux=gmux.cli.gmux:main",
            "gmuxd=gmux.cli.gmuxd:main",
            "gmux-launch=gmux.cli.launch:main",
            "gmux-scheduler=gmux.cli.scheduler:main",
            "gmux-sim=gmux.cli.sim:main",
        ]
    },
)
