# Warnings, sanitizers and ccache, applied to every kforge target through kforge_target_defaults().

find_program(KFORGE_CCACHE ccache)
if(KFORGE_CCACHE)
  set(CMAKE_C_COMPILER_LAUNCHER ${KFORGE_CCACHE})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${KFORGE_CCACHE})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${KFORGE_CCACHE})
endif()

set(KFORGE_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
                    -Wnon-virtual-dtor -Wold-style-cast -Wcast-align
                    -Wimplicit-fallthrough)
set(KFORGE_C_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion)

set(KFORGE_SAN_FLAGS "")
if(KFORGE_SANITIZE)
  if("thread" IN_LIST KFORGE_SANITIZE AND ("address" IN_LIST KFORGE_SANITIZE))
    message(FATAL_ERROR "KFORGE_SANITIZE: 'thread' cannot be combined with 'address'")
  endif()
  foreach(s IN LISTS KFORGE_SANITIZE)
    if(NOT s MATCHES "^(address|undefined|thread)$")
      message(FATAL_ERROR "KFORGE_SANITIZE: unknown sanitizer '${s}' (use address, undefined or thread)")
    endif()
  endforeach()
  list(JOIN KFORGE_SANITIZE "," _san)
  set(KFORGE_SAN_FLAGS -fsanitize=${_san} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_compile_options(${KFORGE_SAN_FLAGS})
  add_link_options(${KFORGE_SAN_FLAGS})
endif()

# GCC 12's -Wnull-dereference reports false positives inside libstdc++ at -O2, so it is not in
# the set above.

# Fuzz builds instrument everything (not just the fuzz drivers) for coverage and ASan/UBSan:
# the decoders under test live in kforge_runtime.
if(KFORGE_FUZZ)
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
endif()

function(kforge_target_defaults target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${KFORGE_WARNINGS}>
    $<$<COMPILE_LANGUAGE:C>:${KFORGE_C_WARNINGS}>)
  if(KFORGE_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX,C>:-Werror>)
  endif()
endfunction()
