"""dtrain's Python side: dtrain.spark runs dtrain programs on a Spark cluster; dtrain.run is the
`dtrain run` launcher (`python -m dtrain.run`, as torch.distributed.run is torchrun's).

Installed from the pip wheel, the package also holds dtrain's C++ library, built against the
torch wheel's libtorch: `cmake -DCMAKE_PREFIX_PATH="$(python -c 'import dtrain;
print(dtrain.cmake_prefix_path)')"` lets a CMake project find_package(dtrain), as
torch.utils.cmake_prefix_path does for find_package(Torch).
"""

import os as _os

try:  # written into the wheel from include/dtrain/version.h (pyproject.toml)
    from dtrain._version import __version__
except ImportError:  # the source tree's python/ on PYTHONPATH
    __version__ = None

# The install prefix inside the wheel's package: bin/dtrain, include/, lib/, lib/cmake/dtrain.
cmake_prefix_path = _os.path.dirname(_os.path.abspath(__file__))
