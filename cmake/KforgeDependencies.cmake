# Finds every third-party dependency. A missing one stops configuration with one line that names
# it and the command that installs it (scripts/bootstrap.sh installs them all).

function(kforge_missing what)
  message(FATAL_ERROR "kforge: missing dependency: ${what} (run scripts/bootstrap.sh)")
endfunction()

find_package(PkgConfig QUIET)
if(NOT PkgConfig_FOUND)
  kforge_missing("pkg-config (Debian: pkg-config)")
endif()

pkg_check_modules(ZMQ QUIET IMPORTED_TARGET libzmq)
if(NOT ZMQ_FOUND)
  kforge_missing("libzmq (Debian: libzmq3-dev)")
endif()
find_path(CPPZMQ_INCLUDE_DIR zmq.hpp)
if(NOT CPPZMQ_INCLUDE_DIR)
  kforge_missing("cppzmq header zmq.hpp (Debian: cppzmq-dev)")
endif()

# msgpack-c is header-only; its CMake package drags in Boost, which we do not need.
find_path(MSGPACK_INCLUDE_DIR msgpack.hpp)
if(NOT MSGPACK_INCLUDE_DIR)
  kforge_missing("msgpack-c C++ (Debian: libmsgpack-cxx-dev)")
endif()
add_library(kforge_msgpack INTERFACE)
target_include_directories(kforge_msgpack SYSTEM INTERFACE ${MSGPACK_INCLUDE_DIR})
target_compile_definitions(kforge_msgpack INTERFACE MSGPACK_NO_BOOST MSGPACK_DEFAULT_API_VERSION=3)

find_path(XXHASH_INCLUDE_DIR xxhash.h)
if(NOT XXHASH_INCLUDE_DIR)
  kforge_missing("xxHash (Debian: libxxhash-dev)")
endif()

find_package(FlatBuffers QUIET CONFIG)
find_program(FLATC flatc)
if(NOT FlatBuffers_FOUND OR NOT FLATC)
  kforge_missing("FlatBuffers with flatc (Debian: libflatbuffers-dev flatbuffers-compiler)")
endif()

find_package(TBB QUIET CONFIG)
if(NOT TBB_FOUND)
  kforge_missing("Intel TBB (Debian: libtbb-dev)")
endif()

find_package(CURL QUIET)
if(NOT CURL_FOUND)
  kforge_missing("libcurl (Debian: libcurl4-openssl-dev)")
endif()

pkg_check_modules(SODIUM QUIET IMPORTED_TARGET libsodium)
if(NOT SODIUM_FOUND)
  kforge_missing("libsodium (Debian: libsodium-dev)")
endif()

pkg_check_modules(ZSTD QUIET IMPORTED_TARGET libzstd)
if(NOT ZSTD_FOUND)
  kforge_missing("zstd (Debian: libzstd-dev)")
endif()

find_package(nlohmann_json QUIET CONFIG)
if(NOT nlohmann_json_FOUND)
  kforge_missing("nlohmann-json (Debian: nlohmann-json3-dev)")
endif()

# The daemon: its configuration file (TOML), and HTTP for its metrics and GUI endpoints (and the
# scripted LLM server of the tests).
find_package(tomlplusplus QUIET CONFIG)
if(NOT tomlplusplus_FOUND)
  kforge_missing("toml++ (Debian: libtomlplusplus-dev)")
endif()
pkg_check_modules(HTTPLIB QUIET IMPORTED_TARGET cpp-httplib)
if(NOT HTTPLIB_FOUND)
  kforge_missing("cpp-httplib (Debian: libcpp-httplib-dev)")
endif()

if(KFORGE_BUILD_TESTS)
  find_package(Catch2 QUIET CONFIG)
  if(NOT Catch2_FOUND)
    kforge_missing("Catch2 (Debian: catch2)")
  endif()
endif()

# CUDA: headers only at build time. libcuda and libnvrtc are loaded with dlopen at run time, so
# the same binaries run on hosts without a GPU and use the host's own driver and NVRTC.
find_package(CUDAToolkit QUIET)
if(NOT CUDAToolkit_FOUND)
  kforge_missing("CUDA toolkit headers (cuda.h, nvrtc.h; set CUDAToolkit_ROOT or put nvcc on PATH)")
endif()
if(NOT EXISTS "${CUDAToolkit_INCLUDE_DIRS}/nvrtc.h")
  kforge_missing("nvrtc.h in ${CUDAToolkit_INCLUDE_DIRS}")
endif()
add_library(kforge_cuda_headers INTERFACE)
target_include_directories(kforge_cuda_headers SYSTEM INTERFACE ${CUDAToolkit_INCLUDE_DIRS})

find_package(Threads REQUIRED)
