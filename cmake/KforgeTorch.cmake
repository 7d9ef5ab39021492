# Finds the torch Python package the dispatcher hook is built against, without find_package(Torch)
# (its CUDA toolkit detection is fragile and the hook needs none of it: CUDA dispatch keys live in
# c10, and CUDA calls go through the runtime's dlopen'ed driver).
#
# Options and cache variables:
#   KFORGE_BUILD_HOOK      build the hook at all (default ON; OFF when KFORGE_FUZZ)
#   KFORGE_TORCH_DIR       the torch package directory (.../site-packages/torch). Empty: ask
#                          KFORGE_TORCH_PYTHON where torch is.
#   KFORGE_TORCH_PYTHON    the interpreter asked (default: the project venv's python)
# Results:
#   KFORGE_TORCH_FOUND         TRUE when the hook can be built
#   KFORGE_TORCH_VERSION       torch.__version__, "2.11.0+cu130"
#   KFORGE_TORCH_VERSION_MM    major.minor, "2.11": the hook is libkforge_hook-torch<major.minor>.so
#   kforge::torch              INTERFACE target: torch's headers (SYSTEM), its C++ ABI define, and
#                              libtorch_cpu, libc10, libtorch by name. Nothing of torch's lib/
#                              directory reaches a RUNPATH: the hook is loaded into a process that
#                              already has torch, and the loader matches those by soname.
include_guard(GLOBAL)

# Off by default in fuzzing builds (clang, instrumented for libFuzzer): the hook is not fuzzed, and
# torch's headers would only slow those builds down.
if(KFORGE_FUZZ)
  set(_kforge_build_hook_default OFF)
else()
  set(_kforge_build_hook_default ON)
endif()
option(KFORGE_BUILD_HOOK "Build the dispatcher hook libkforge_hook-torch<version>.so (needs torch)"
       ${_kforge_build_hook_default})
set(KFORGE_TORCH_DIR "" CACHE PATH "torch package directory; empty: ask KFORGE_TORCH_PYTHON")
set(KFORGE_TORCH_PYTHON "${PROJECT_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH
    "Python interpreter asked where torch is, its version and its C++ ABI")

set(KFORGE_TORCH_FOUND FALSE)

function(kforge_torch_not_found why)
  message(STATUS "kforge: torch not found, the hook is not built (set KFORGE_TORCH_DIR)${why}")
endfunction()

function(kforge_find_torch)
  set(dir "${KFORGE_TORCH_DIR}")
  set(version "")
  set(abi "")
  if(EXISTS "${KFORGE_TORCH_PYTHON}")
    # One interpreter start (about 2 s: it imports torch) answers all three questions.
    execute_process(
      COMMAND "${KFORGE_TORCH_PYTHON}" -c
              "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
      OUTPUT_VARIABLE out RESULT_VARIABLE rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(rc EQUAL 0)
      string(REPLACE "\n" ";" out "${out}")
      list(LENGTH out n)
      if(n EQUAL 3)
        list(GET out 0 py_dir)
        if(NOT dir)
          set(dir "${py_dir}")
        endif()
        # The interpreter's answers describe KFORGE_TORCH_DIR only when it is the same torch.
        file(REAL_PATH "${py_dir}" py_real)
        file(REAL_PATH "${dir}" dir_real)
        if(py_real STREQUAL dir_real)
          list(GET out 1 version)
          list(GET out 2 abi)
        endif()
      endif()
    endif()
  endif()
  if(NOT dir OR NOT EXISTS "${dir}/include/torch/library.h" OR NOT EXISTS "${dir}/lib/libtorch_cpu.so"
     OR NOT EXISTS "${dir}/lib/libc10.so")
    kforge_torch_not_found("")
    return()
  endif()
  if(NOT version)
    # An explicit KFORGE_TORCH_DIR with no interpreter for it: version.py is torch's own record.
    file(STRINGS "${dir}/version.py" line REGEX "^__version__ *= *'[^']+'" LIMIT_COUNT 1)
    if(line MATCHES "'([^']+)'")
      set(version "${CMAKE_MATCH_1}")
    endif()
  endif()
  if(abi STREQUAL "")
    # libc10 exports std::string in its interface; the new ABI mangles it as std::__cxx11.
    file(STRINGS "${dir}/lib/libc10.so" cxx11 REGEX "St7__cxx11" LIMIT_COUNT 1)
    if(cxx11)
      set(abi 1)
    else()
      set(abi 0)
    endif()
  endif()
  if(NOT version MATCHES "^([0-9]+)\\.([0-9]+)")
    kforge_torch_not_found(": cannot read torch's version in ${dir}")
    return()
  endif()
  set(mm "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
  if(NOT abi EQUAL 1)
    # The hook passes std::string and std::vector to libkforge_runtime, which is built with the
    # compiler's default (C++11) ABI: a pre-C++11-ABI torch cannot share a hook with it.
    message(STATUS "kforge: torch ${version} in ${dir} uses the pre-C++11 ABI; the hook is not built")
    return()
  endif()

  add_library(kforge_torch INTERFACE IMPORTED GLOBAL)
  add_library(kforge::torch ALIAS kforge_torch)
  # Imported targets' include directories are SYSTEM for their users: torch's headers do not
  # trip kforge's warning flags.
  set_target_properties(kforge_torch PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${dir}/include;${dir}/include/torch/csrc/api/include"
    INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=${abi}"
    # By name, not by path, so CMake puts no torch directory into the build RUNPATH; -rpath-link
    # lets the linker follow libtorch_cpu's own dependencies without recording anything.
    INTERFACE_LINK_OPTIONS "-L${dir}/lib;-Wl,-rpath-link,${dir}/lib"
    INTERFACE_LINK_LIBRARIES "-ltorch_cpu;-lc10;-ltorch")

  set(KFORGE_TORCH_FOUND TRUE PARENT_SCOPE)
  set(KFORGE_TORCH_VERSION "${version}" PARENT_SCOPE)
  set(KFORGE_TORCH_VERSION_MM "${mm}" PARENT_SCOPE)
  message(STATUS "kforge: torch ${version} (C++11 ABI ${abi}) in ${dir}")
endfunction()

if(KFORGE_BUILD_HOOK)
  kforge_find_torch()
else()
  message(STATUS "kforge: the hook is not built (KFORGE_BUILD_HOOK=OFF)")
endif()
