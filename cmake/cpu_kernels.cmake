# The CPU kernels (src/devices/cpu/kernels), compiled once per instruction-set level.
#
# Everything else in kiln is compiled for plain x86-64; only the kernels use wider instructions,
# and the CPU device picks at run time the most capable copy this processor runs
# (src/devices/cpu/kernel_set.h). A native build (KILN_NATIVE=ON) has one copy, compiled with
# -march=native; a portable build (KILN_NATIVE=OFF) has one per level below, so one binary runs
# on any x86-64-v2 machine with the kernels it would get had it been built there.
#
# Each copy lives in its own inline namespace (kernels/level.h), but the inline functions and
# templates of the headers it shares with the rest of kiln (std::vector, core/…) are compiled
# into every copy with that copy's instructions. A static link keeps one definition of each, any
# one: an AVX-512 std::vector method could end up called from plain x86-64 code. So each copy is
# first linked into one relocatable object whose own weak functions and vtables are then made
# local (cmake/isolate_objects.sh): every copy and the rest of kiln call only their own. Their
# data (the statics of inline functions, typeinfo) stays shared: weak, one definition linked.

file(GLOB KILN_CPU_KERNEL_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/devices/cpu/kernels/*.cc)

# A portable build's levels, most capable first, and each level's compiler flags. The floor is
# x86-64-v2 (SSE4.2; below it Highway has only its one-lane scalar target). Each level adds AES
# and CLMUL, which every CPU of these levels has since 2010: Highway's SSE4 and AVX2 targets
# require them, and without them a copy would fall back to narrower vectors than the native
# copy of the same CPU uses, and sum in another order.
set(KILN_CPU_PORTABLE_LEVELS avx512_bf16 x86_64_v4 x86_64_v3 x86_64_v2)
set(KILN_CPU_HIGHWAY_FLAGS -maes -mpclmul)
# Zen 4, Sapphire Rapids and later: AVX-512 with BF16 dot products and the Ice Lake additions.
# AMX is chosen at run time inside any copy (kernels/amx_gemm.h).
set(KILN_CPU_FLAGS_avx512_bf16 -march=x86-64-v4 ${KILN_CPU_HIGHWAY_FLAGS} -mavx512bf16 -mavx512vnni -mavx512vbmi
    -mavx512vbmi2 -mavx512bitalg -mavx512vpopcntdq -mavx512ifma -mgfni -mvaes -mvpclmulqdq)
# Skylake-SP, Cascade Lake: AVX-512 F/BW/CD/DQ/VL.
set(KILN_CPU_FLAGS_x86_64_v4 -march=x86-64-v4 ${KILN_CPU_HIGHWAY_FLAGS})
# Haswell, Zen 1-3: AVX2, FMA, F16C.
set(KILN_CPU_FLAGS_x86_64_v3 -march=x86-64-v3 ${KILN_CPU_HIGHWAY_FLAGS})
# Westmere, Bulldozer and later: SSE4.2, POPCNT.
set(KILN_CPU_FLAGS_x86_64_v2 -march=x86-64-v2 ${KILN_CPU_HIGHWAY_FLAGS})
set(KILN_CPU_FLAGS_native -march=native)

# kiln_add_cpu_kernels(<library> LEVELS <level>...): adds one copy of the kernels per level to
# <library> and the list its CPU device chooses from, in the order given.
function(kiln_add_cpu_kernels library)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "" "" "LEVELS")
  foreach(level IN LISTS ARG_LEVELS)
    set(copy kiln_cpu_${level})
    set(object ${CMAKE_CURRENT_BINARY_DIR}/${copy}.o)
    if(NOT TARGET ${copy})
      string(REPLACE "_" "-" name ${level})
      add_library(${copy} STATIC EXCLUDE_FROM_ALL ${KILN_CPU_KERNEL_SOURCES})
      target_compile_definitions(${copy} PRIVATE KILN_CPU_LEVEL=${level} KILN_CPU_LEVEL_NAME="${name}")
      # No multiply-add the source does not write (Highway's MulAdd): whether the compiler would
      # fuse one depends on how it tunes for a CPU (GCC avoids FMA chains on Zen), so without
      # this a native copy and the portable copy of the same width would round differently.
      target_compile_options(${copy} PRIVATE ${KILN_WARNINGS} ${KILN_CPU_FLAGS_${level}} -ffp-contract=off)
      kiln_use_dependencies(${copy})
      add_custom_command(OUTPUT ${object}
                         COMMAND bash ${PROJECT_SOURCE_DIR}/cmake/isolate_objects.sh ${CMAKE_LINKER} ${CMAKE_NM}
                                 ${CMAKE_OBJCOPY} $<TARGET_FILE:${copy}> ${object}
                         DEPENDS ${copy} ${PROJECT_SOURCE_DIR}/cmake/isolate_objects.sh
                         COMMENT "The ${name} CPU kernels as one object with their own inline functions")
    endif()
    target_sources(${library} PRIVATE ${object})
  endforeach()
  kiln_add_cpu_kernel_list(${library} ${ARG_LEVELS})
endfunction()

# kiln_add_cpu_kernel_list(<library> <level>...): the list of kernel sets <library>'s CPU device
# chooses from (devices/cpu/kernel_set.h), in the order given.
function(kiln_add_cpu_kernel_list library)
  set(KILN_CPU_SET_DECLARATIONS "")
  set(KILN_CPU_SET_POINTERS "")
  foreach(level IN LISTS ARGN)
    string(APPEND KILN_CPU_SET_DECLARATIONS "namespace ${level} { extern const CpuKernelSet kernel_set; }\n")
    string(APPEND KILN_CPU_SET_POINTERS "&${level}::kernel_set, ")
  endforeach()
  set(list_source ${CMAKE_CURRENT_BINARY_DIR}/${library}_cpu_kernel_sets.cc)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/cpu_kernel_sets.cc.in ${list_source} @ONLY)
  target_sources(${library} PRIVATE ${list_source})
endfunction()
