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
