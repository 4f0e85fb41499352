# Install and export rules: `cmake --install <build> --prefix <dir>` gives a memgate that other CMake projects use
# with find_package(memgate) (memgateConfig.cmake.in).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(MEMGATE_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/memgate")
set(MEMGATE_INSTALL_DATADIR "${CMAKE_INSTALL_DATADIR}/memgate")

foreach(layer base bench_tools allocator report spec models backend estimate distributed measure launch gate advise plan child
              memory_suite core warnings fmt)
  set_target_properties(memgate_${layer} PROPERTIES EXPORT_NAME ${layer})
endforeach()
set_target_properties(memgate_verdicts PROPERTIES EXPORT_NAME verdicts)
set_target_properties(memgate PROPERTIES EXPORT_NAME cli)

install(TARGETS memgate_base memgate_bench_tools memgate_allocator memgate_report memgate_spec memgate_models memgate_backend
                memgate_estimate memgate_distributed memgate_measure memgate_launch memgate_gate memgate_advise
                memgate_plan memgate_child
                memgate_memory_suite memgate_core memgate_warnings memgate_fmt memgate_verdicts memgate
  EXPORT memgateTargets
  ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}"
  LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}"
  RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}"
  INCLUDES DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
# The measuring half of the memgate command, which bin/memgate hands profile, estimate, advise, check and ranks to.
install(TARGETS memgate_measure_cli RUNTIME DESTINATION "${CMAKE_INSTALL_LIBEXECDIR}/memgate")
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/memgate" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
# The GPU fixtures (budgets and advice of every project), and memgate's own fixtures and suites as examples.
install(DIRECTORY "${PROJECT_SOURCE_DIR}/fixtures/gpus" "${PROJECT_SOURCE_DIR}/fixtures/models"
                  "${PROJECT_SOURCE_DIR}/fixtures/suites"
        DESTINATION "${MEMGATE_INSTALL_DATADIR}/fixtures")
install(EXPORT memgateTargets NAMESPACE memgate:: DESTINATION "${MEMGATE_INSTALL_CMAKEDIR}")

set(MEMGATE_TORCH_VERSION "${Torch_VERSION}")
configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/memgateConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/memgateConfig.cmake"
  INSTALL_DESTINATION "${MEMGATE_INSTALL_CMAKEDIR}"
  PATH_VARS MEMGATE_INSTALL_DATADIR)
write_basic_package_version_file("${PROJECT_BINARY_DIR}/memgateConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/memgateConfig.cmake" "${PROJECT_BINARY_DIR}/memgateConfigVersion.cmake"
              "${PROJECT_SOURCE_DIR}/cmake/MemgateFindTorch.cmake" "${PROJECT_SOURCE_DIR}/cmake/MemgateMemorySuite.cmake"
              "${PROJECT_SOURCE_DIR}/cmake/MemgateListMemoryTests.cmake"
        DESTINATION "${MEMGATE_INSTALL_CMAKEDIR}")
