# kvrelay_llama.cmake — find llama.cpp for `--engine llama` (docs/llama.md).
#
# Order: a system llama.cpp (find_package(llama), e.g. one built and
# installed from source) wins; else the pinned build scripts/setup-llama
# puts in the cache (KVRELAY_LLAMA_DIR, default
# ${XDG_CACHE_HOME:-~/.cache}/kvrelay/llama.cpp-<version>). Found, it defines
# the target kvrelay::llama and KVRELAY_HAVE_LLAMA=ON; not found, the build
# goes on without it and `--engine llama` says why (src/llama/llama_missing.cc).
set(KVRELAY_LLAMA_VERSION 3.22.1)   # scripts/setup-llama's VERSION
set(_kv_cache "$ENV{XDG_CACHE_HOME}")
if(NOT _kv_cache)
  set(_kv_cache "$ENV{HOME}/.cache")
endif()
if(DEFINED ENV{KVRELAY_LLAMA_CACHE})
  set(_kv_cache_root "$ENV{KVRELAY_LLAMA_CACHE}")
else()
  set(_kv_cache_root "${_kv_cache}/kvrelay")
endif()
set(KVRELAY_LLAMA_DIR "${_kv_cache_root}/llama.cpp-${KVRELAY_LLAMA_VERSION}"
    CACHE PATH "The pinned llama.cpp build scripts/setup-llama installs")
option(KVRELAY_LLAMA "Build the llama.cpp engine when llama.cpp is found" ON)

set(KVRELAY_HAVE_LLAMA OFF)
set(KVRELAY_LLAMA_WHY "built with -DKVRELAY_LLAMA=OFF")
if(KVRELAY_LLAMA AND (KVRELAY_SANITIZE OR KVRELAY_TSAN))   # KVRELAY_FUZZ implies SANITIZE
  # The prebuilt libraries are not instrumented: TSan would report their
  # threads' accesses as races, and the fuzzers never reach them.
  set(KVRELAY_LLAMA OFF)
  set(KVRELAY_LLAMA_WHY "sanitizer and fuzz builds leave the prebuilt llama.cpp out")
endif()
if(KVRELAY_LLAMA)
  find_package(llama CONFIG QUIET)
  if(llama_FOUND)
    add_library(kvrelay_llama_lib INTERFACE)
    target_link_libraries(kvrelay_llama_lib INTERFACE llama)
    add_library(kvrelay::llama ALIAS kvrelay_llama_lib)
    set(KVRELAY_HAVE_LLAMA ON)
    set(KVRELAY_LLAMA_FROM "system (find_package)")
  elseif(EXISTS "${KVRELAY_LLAMA_DIR}/.complete")
    set(_lib "${KVRELAY_LLAMA_DIR}/lib")
    add_library(kvrelay_llama_lib INTERFACE)
    target_include_directories(kvrelay_llama_lib SYSTEM INTERFACE "${KVRELAY_LLAMA_DIR}/include")
    target_link_libraries(kvrelay_llama_lib INTERFACE
      "${_lib}/libllama.so" "${_lib}/libggml.so" "${_lib}/libggml-base.so")
    # The binaries find the libraries (and ggml its CPU variants, loaded at
    # run time from the same folder) without LD_LIBRARY_PATH.
    target_link_options(kvrelay_llama_lib INTERFACE "-Wl,-rpath,${_lib}")
    target_compile_definitions(kvrelay_llama_lib INTERFACE
      KVRELAY_LLAMA_BACKEND_DIR="${_lib}")
    add_library(kvrelay::llama ALIAS kvrelay_llama_lib)
    set(KVRELAY_HAVE_LLAMA ON)
    set(KVRELAY_LLAMA_FROM "${KVRELAY_LLAMA_DIR}")
  else()
    set(KVRELAY_LLAMA_WHY "llama.cpp was not found when kvrelay was built: run scripts/setup-llama, then rebuild")
  endif()
endif()
if(KVRELAY_HAVE_LLAMA)
  message(STATUS "kvrelay: llama.cpp engine ON (${KVRELAY_LLAMA_FROM})")
else()
  message(STATUS "kvrelay: llama.cpp engine OFF (${KVRELAY_LLAMA_WHY})")
endif()
