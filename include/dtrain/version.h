// dtrain's version: the one number that the CMake package (find_package(dtrain 0.1)), the
// Debian packages, the pip wheel and `dtrain --version` all take from here (CMakeLists.txt and
// pyproject.toml read this file). Say what changed in CHANGELOG.md when it moves.
//
//   #include <dtrain/version.h>
//   #if DTRAIN_VERSION_NUMBER >= 100  // 0.1.0 or later
//
// DTRAIN_VERSION_NUMBER is MAJOR * 10000 + MINOR * 100 + PATCH (0.1.0 -> 100). DTRAIN_VERSION is
// the same number as a string; CMake refuses to configure when the two disagree.
#pragma once

#define DTRAIN_VERSION_MAJOR 0
#define DTRAIN_VERSION_MINOR 1
#define DTRAIN_VERSION_PATCH 0
#define DTRAIN_VERSION "0.1.0"
#define DTRAIN_VERSION_NUMBER \
  (DTRAIN_VERSION_MAJOR * 10000 + DTRAIN_VERSION_MINOR * 100 + DTRAIN_VERSION_PATCH)
