"""memgate's build backend for pip (pyproject.toml's build-backend): scikit-build-core's, after a check that what it
needs before CMake runs is there. Without it, a missing CMake is a Python traceback ending in "Could not find CMake
with version >=3.25", and a missing scikit-build-core is pip's "Cannot import 'scikit_build_core.build'"; here each is
one message naming it and the line that installs it, as CMake's configure says the rest
(cmake/MemgateDependencies.cmake).
"""
import sys

CMAKE_VERSION = ">=3.25"  # as pyproject.toml's cmake.version
SCIKIT_BUILD_CORE = "scikit-build-core==0.11.6"  # as pyproject.toml's build-system.requires


def _stop(missing, install):
    print(f"memgate: missing prerequisites:\n  - {missing}\n{install}\n"
          "Every prerequisite, for each system: README.md, 'Install'.", file=sys.stderr)
    raise SystemExit(1)


def _backend():
    try:
        from scikit_build_core import build
    except ImportError:
        _stop(f"scikit-build-core in {sys.executable}, the Python pip runs in (pip install --no-build-isolation uses "
              "its packages to build)", f"Install it there:\n  {sys.executable} -m pip install {SCIKIT_BUILD_CORE}")
    return build


def _require_cmake():
    from packaging.specifiers import SpecifierSet
    from scikit_build_core.cmake import CMake
    from scikit_build_core.errors import CMakeNotFoundError

    try:
        CMake.default_search(version=SpecifierSet(CMAKE_VERSION))
    except CMakeNotFoundError as e:
        _stop(f"CMake {CMAKE_VERSION} ({e})", "Install it (Debian, Ubuntu):\n  sudo apt-get install cmake\n"
              f"or into this Python's environment:\n  {sys.executable} -m pip install 'cmake{CMAKE_VERSION}'")


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    backend = _backend()
    _require_cmake()
    return backend.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    backend = _backend()
    _require_cmake()
    return backend.build_editable(wheel_directory, config_settings, metadata_directory)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    backend = _backend()
    _require_cmake()
    return backend.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    backend = _backend()
    _require_cmake()
    return backend.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_sdist(sdist_directory, config_settings=None):
    return _backend().build_sdist(sdist_directory, config_settings)


def get_requires_for_build_wheel(config_settings=None):
    return _backend().get_requires_for_build_wheel(config_settings)


def get_requires_for_build_editable(config_settings=None):
    return _backend().get_requires_for_build_editable(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    return _backend().get_requires_for_build_sdist(config_settings)
