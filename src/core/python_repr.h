// Python's repr() of a float, for text a Python peer writes the same way (MLflow params, Ray
// Tune's result files, DeepSpeed's progress line):
//
//     python_float_repr(0.001) == "0.001"; python_float_repr(1e-05) == "1e-05";
//     python_float_repr(100.0) == "100.0"; python_float_repr(1e16) == "1e+16"
//
// The shortest digits that read back as the value, in Python's layout (positional for decimal
// exponents -4..15, else d.ddde[+-]XX); "nan", "inf", "-inf". Thread-safe; never throws.
#pragma once

#include <string>

namespace dtrain::detail {

std::string python_float_repr(double value);

}  // namespace dtrain::detail
