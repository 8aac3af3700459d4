# The Debian packages, built from a configured and built tree with `cpack -G DEB` (in the build
# directory; docs/install.md):
#   dtrain         the `dtrain` command (libtorch-free), its fork server, the PySpark driver
#   libdtrain-dev  headers, static libraries, the CMake package (find_package(dtrain)) and the
#                  `dtrain-zero` helper; depends on dtrain of the same version and on Debian's
#                  libtorch-dev, libgloo-dev, nlohmann-json3-dev and libcurl4-openssl-dev
# Installed under /usr. Run-time library dependencies come from dpkg-shlibdeps (dpkg-dev).
# Only a build on Debian's libtorch makes packages: one on another libtorch (a wheel's) would
# depend on files no Debian package provides - that build's route is the pip wheel.
if(DTRAIN_LIBTORCH)
  message(STATUS "dtrain: no Debian packages from this build (libtorch ${DTRAIN_LIBTORCH} is not "
    "Debian's); build on Debian's libtorch for `cpack -G DEB`")
  return()
endif()

set(CPACK_PACKAGE_NAME dtrain)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "dtrain")
set(CPACK_PACKAGE_CONTACT "dtrain developers <dtrain@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "distributed training for the libtorch C++ frontend")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/packages)
set(CPACK_GENERATOR DEB)
set(CPACK_COMPONENTS_ALL cli dev)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)

set(CPACK_DEBIAN_CLI_PACKAGE_NAME dtrain)
set(CPACK_DEBIAN_CLI_PACKAGE_SECTION utils)
set(CPACK_COMPONENT_CLI_DESCRIPTION
  "dtrain's launcher: `dtrain run` (torchrun-compatible), horovodrun, ZeRO config checks, Spark\n"
  "and cluster engines. It links no libtorch: it runs libtorch C++ programs and unchanged\n"
  "PyTorch scripts on N processes, on one machine or a cluster.")
set(CPACK_DEBIAN_CLI_PACKAGE_SUGGESTS "python3, openjdk-17-jre-headless")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libdtrain-dev)
set(CPACK_COMPONENT_DEV_DESCRIPTION
  "dtrain's C++ library for libtorch: process groups on Gloo or shared memory, DDP, ZeRO,\n"
  "Horovod's API, the Distributor, tune; headers, static libraries and the CMake package\n"
  "(find_package(dtrain) gives dtrain::dtrain).")
set(CPACK_COMPONENT_DEV_DEPENDS cli)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
  "libtorch-dev, libgloo-dev, nlohmann-json3-dev, libcurl4-openssl-dev")
if(DTRAIN_HAVE_DATA)
  # dtrain::data's static library reads Delta deletion vectors with CRoaring and zlib.
  string(APPEND CPACK_DEBIAN_DEV_PACKAGE_DEPENDS ", libroaring-dev, zlib1g-dev")
endif()
set(CPACK_DEBIAN_DEV_PACKAGE_RECOMMENDS "libopenblas0-pthread, g++, cmake")
include(CPack)
