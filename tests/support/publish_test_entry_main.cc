// kforge-publish-test-entry: see tests/support/publish_test_entry.h.
#include <iostream>
#include <string>
#include <vector>

#include "tests/support/publish_test_entry.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return kforge::test_support::run_publish_test_entry(args, std::cout, std::cerr);
}
