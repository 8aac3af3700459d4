#include "dtrain/error.h"

namespace dtrain {

void throw_internal(const char* file, int line, const char* cond, const std::string& msg) {
  throw InternalError(std::string("internal error (a dtrain bug, please report it): ") + cond +
                      " failed at " + file + ":" + std::to_string(line) + ": " + msg);
}

}  // namespace dtrain
