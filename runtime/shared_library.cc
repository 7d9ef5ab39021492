#include "runtime/shared_library.h"

#include <dlfcn.h>
#include <link.h>

namespace kforge {

std::string dl_error_text() {
  const char* e = dlerror();
  return e != nullptr ? std::string(e) : std::string("unknown dlopen error");
}

std::string dl_failure(const std::string& path) {
  std::string error = dl_error_text();
  if (error.rfind(path + ": ", 0) == 0) return error;
  return path + ": " + error;
}

std::string loaded_library_path(void* handle, const std::string& requested) {
  struct link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] != '\0') {
    return map->l_name;
  }
  return requested;
}

}  // namespace kforge
