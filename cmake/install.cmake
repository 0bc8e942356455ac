# cmake --install: the kiln program, the library with its headers, a CMake package
# (find_package(kiln) -> kiln::kiln), a pkg-config file (kiln.pc), and the files kiln reads at
# run time (src/io/kiln_files.h): the make-random recipes and the bundled tiny checkpoint with
# the fixture tokenizers make-random copies.
include(CMakePackageConfigHelpers)

install(TARGETS kiln EXPORT kilnTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS kiln_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY src/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln FILES_MATCHING PATTERN "*.h")

set(KILN_SHARE ${CMAKE_INSTALL_DATADIR}/kiln)
install(DIRECTORY data/make_random DESTINATION ${KILN_SHARE}/data)
install(DIRECTORY tests/fixtures/flux1_tiny_arch/pipeline DESTINATION ${KILN_SHARE}/fixtures/flux1_tiny_arch)
foreach(tokenizer flux2_tiny/pipeline/tokenizer flux2_klein_tiny/pipeline/tokenizer)
  get_filename_component(parent ${tokenizer} DIRECTORY)
  install(DIRECTORY tests/fixtures/${tokenizer} DESTINATION ${KILN_SHARE}/fixtures/${parent})
endforeach()

set(KILN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)
install(EXPORT kilnTargets NAMESPACE kiln:: DESTINATION ${KILN_CMAKE_DIR})
configure_package_config_file(cmake/kilnConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/kilnConfig.cmake
                              INSTALL_DESTINATION ${KILN_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/kilnConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kilnConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/kilnConfigVersion.cmake
        DESTINATION ${KILN_CMAKE_DIR})

# kiln.pc: the static library's own dependencies go in Libs.private (pkg-config --static).
set(KILN_PC_LIBS_PRIVATE "${DNNL_LIBRARY} ${OPENBLAS_LIBRARY} -ldl")
if(KILN_WITH_CUDA)
  string(APPEND KILN_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -lrt -lpthread")
endif()
configure_file(cmake/kiln.pc.in ${CMAKE_CURRENT_BINARY_DIR}/kiln.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kiln.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
