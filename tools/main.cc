// kforge CLI entry point; everything else is in cli.cc.
#include <iostream>

#include "tools/cli.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  return kforge::run_cli(args, std::cout, std::cerr);
}
