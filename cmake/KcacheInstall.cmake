# Install rules for the C++ client: `cmake --install` puts libkcache_client.a,
# libkcache_proto.a, their headers (under include/kcache/), a CMake package
# (find_package(kcache) -> kcache::client) and a pkg-config file
# (kcache-client.pc) under the prefix. The daemon and tools install beside
# them in a full build.
include(CMakePackageConfigHelpers)
set(_cmakedir ${CMAKE_INSTALL_LIBDIR}/cmake/kcache)
set(_incdir ${CMAKE_INSTALL_INCLUDEDIR}/kcache)

install(TARGETS kcache_client kcache_proto EXPORT kcacheTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${PROJECT_SOURCE_DIR}/client/client.h ${PROJECT_SOURCE_DIR}/client/cuda_loader.h
  ${PROJECT_SOURCE_DIR}/client/discovery.h
  ${PROJECT_SOURCE_DIR}/client/raw_launch.h
  DESTINATION ${_incdir}/client)
install(FILES ${PROJECT_SOURCE_DIR}/kernels/attention_params.h DESTINATION ${_incdir}/kernels)
install(DIRECTORY ${KCACHE_PROTO_GEN_DIR}/kcache DESTINATION ${_incdir}
  FILES_MATCHING PATTERN "*.h")
install(EXPORT kcacheTargets NAMESPACE kcache:: DESTINATION ${_cmakedir})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kcacheConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/kcacheConfig.cmake INSTALL_DESTINATION ${_cmakedir})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/kcacheConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kcacheConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/kcacheConfigVersion.cmake DESTINATION ${_cmakedir})

configure_file(${PROJECT_SOURCE_DIR}/cmake/kcache-client.pc.in
  ${CMAKE_CURRENT_BINARY_DIR}/kcache-client.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kcache-client.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

if(NOT KCACHE_CLIENT_ONLY)
  install(TARGETS kcached kcache kcache-compile-worker kcache-compile
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
