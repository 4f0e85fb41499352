// memgate's one exception type, for bad input (fixtures, baselines, flags) and a missing device.
#pragma once

#include <stdexcept>
#include <string>

namespace memgate {

/// Every error memgate raises. Messages name the file, the key, the line and what was expected.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace memgate
