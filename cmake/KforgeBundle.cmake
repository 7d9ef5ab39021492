# `cmake --build <dir> --target bundle` makes dist/kforge-<version>-linux-x86_64.tar.gz: the
# installed tree (bin/, lib/, share/) plus the non-system shared libraries our binaries need,
# runnable after unpacking anywhere. See scripts/make_bundle.sh for what "non-system" means.
set(KFORGE_BUNDLE_NAME "kforge-${PROJECT_VERSION}-linux-${CMAKE_SYSTEM_PROCESSOR}")
set(KFORGE_BUNDLE_TARBALL "${CMAKE_BINARY_DIR}/dist/${KFORGE_BUNDLE_NAME}.tar.gz")
add_custom_target(bundle
  COMMAND ${CMAKE_COMMAND} -E rm -rf ${CMAKE_BINARY_DIR}/bundle-stage
  COMMAND ${CMAKE_COMMAND} --install ${CMAKE_BINARY_DIR} --strip --prefix ${CMAKE_BINARY_DIR}/bundle-stage/${KFORGE_BUNDLE_NAME}
  COMMAND ${PROJECT_SOURCE_DIR}/scripts/make_bundle.sh
          ${CMAKE_BINARY_DIR}/bundle-stage/${KFORGE_BUNDLE_NAME} ${KFORGE_BUNDLE_TARBALL}
  COMMENT "Building the relocatable bundle ${KFORGE_BUNDLE_TARBALL}"
  VERBATIM)
install(FILES README.md docs/ARCHITECTURE.md docs/REFERENCE.md docs/BENCHMARKS.md DESTINATION share/kforge/doc)

# `cmake --install` copies what is built and builds nothing: without these dependencies a bundle
# made after a source change ships the binaries of the last full build (the CUDA runs of stop 41
# got a kforged without the template changes the bundle's test binary had). Called at the end of
# the top-level CMakeLists.txt, once every directory's targets exist: the bundle depends on every
# executable and shared or module library of the project.
function(kforge_bundle_depends_on_everything)
  set(dirs "${PROJECT_SOURCE_DIR}")
  set(built "")
  while(dirs)
    list(POP_FRONT dirs dir)
    get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
    foreach(t IN LISTS targets)
      get_target_property(type ${t} TYPE)
      if(type STREQUAL "EXECUTABLE" OR type STREQUAL "SHARED_LIBRARY" OR type STREQUAL "MODULE_LIBRARY")
        list(APPEND built ${t})
      endif()
    endforeach()
    get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
    list(APPEND dirs ${subdirs})
  endwhile()
  if(built)
    add_dependencies(bundle ${built})
  endif()
endfunction()
