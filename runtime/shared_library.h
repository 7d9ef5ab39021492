// Messages and paths for libraries kforge loads with dlopen (the CUDA driver, NVRTC, CPU kernels).
// Internal to the runtime.
#pragma once

#include <string>

namespace kforge {

// dlerror()'s text, or "unknown dlopen error" when it has none.
std::string dl_error_text();
// "<path>: <dlerror>", without repeating the path when dlerror() already starts with it.
std::string dl_failure(const std::string& path);
// The file the loader mapped for `handle` (absolute when it could tell), else `requested`: so
// messages and `kforge env` show the real path even when a bare soname was asked for.
std::string loaded_library_path(void* handle, const std::string& requested);

}  // namespace kforge
