// libkforge_preload.so: the LD_PRELOAD shim that brings kforge's hook into a PyTorch process.
//
//   LD_PRELOAD=/opt/kforge/lib/libkforge_preload.so python serve.py
//
// Promises:
// - Harmless everywhere. It is C and links only libc and libdl, so it can sit in every process of a
//   session (shells, compilers, data-loader children, plain python). In a process without torch it
//   changes nothing a program can observe: same output, same exit code, the same dlopen() results
//   (names are resolved against the caller's RPATH/RUNPATH and $ORIGIN as before, see
//   Note [dlopen keeps its caller]), nothing printed.
// - Once torch is in the process it loads the hook built for that torch version, exactly once, at a
//   point where torch is fully initialized (Note [When torch is ready]):
//     - Python: right after the dlopen() of torch/_C*.so returned (before PyInit__C runs);
//     - programs linked against libtorch: just before main(), after every static initializer ran
//       (it interposes __libc_start_main and wraps main).
// - If no hook matches, it prints one line to stderr and does nothing else, ever. A hook that fails
//   to load costs one line with dlerror(); the process goes on without kforge. It never exits or
//   aborts a process that has started.
//
// Which hook, first match wins:
//   1. $KFORGE_HOOK, a full path (used as given), whatever the torch version.
//   2. libkforge_hook-torch<X.Y>.so in $KFORGE_HOOK_DIR if set, else in this shim's own directory.
//      X.Y is the major.minor of the torch in the process, read next to its libtorch_cpu.so:
//      <lib dir>/../version.py (pip wheels: __version__ = '2.11.0+cu130'), else
//      <lib dir>/../build-version (libtorch zip distributions: 2.11.0+cu130).
//
// Environment, read once when the shim is loaded:
//   KFORGE_DISABLE   any value but "" or "0": the shim does nothing at all.
//   KFORGE_LOG       any value but "" or "0": also print "kforge: loaded hook ... for torch ...".
//                    Problems (no hook, unknown version, hook failed to load) are always printed.
//   KFORGE_HOOK      explicit hook path (above).
//   KFORGE_HOOK_DIR  where to look for libkforge_hook-torchX.Y.so (above).
//
// Note [dlopen keeps its caller]
// glibc resolves a dlopen() name relative to the object that called dlopen: a name without '/' is
// searched in the caller's DT_RPATH/DT_RUNPATH, and $ORIGIN in a name is the caller's directory.
// torch relies on it (libtorch_cpu.so has DT_RPATH $ORIGIN/../../nvidia/...; NVRTC and cuDNN
// dlopen their own parts by name). glibc knows the caller from dlopen's return address, so a C
// wrapper that calls the real dlopen makes the shim the caller and breaks those loads. Here dlopen
// is a few instructions of assembly that ask kforge_shim_route_dlopen() where to go and then jump
// there with the caller's return address untouched:
// - to the real dlopen, whenever kforge has nothing to check (disabled, hook settled) or the name
//   is resolved relative to the caller (no '/', or a '$' token): the load is exactly what it would
//   have been without the shim;
// - to dlopen_then_look_for_torch() for a name with a path (what Python's import uses) while torch
//   is not found yet. A path is not searched, so the one difference is that the shim is recorded
//   as the new object's loader: the DT_RPATH (not RUNPATH) entries of the real caller's loader
//   chain are not searched for the new object's own dependencies.
// Consequence: a torch brought in by a caller-relative name (dlopen("libtorch.so")) is noticed at
// the next dlopen of a path, or never; Python's import and linked programs are always noticed.
// On architectures without the assembly (not x86-64 or AArch64) dlopen is a C function that calls
// the routed function, so the caller is kept only if the compiler emits a tail call.
//
// Note [When torch is ready]
// The hook registers kernels with torch's dispatcher, so it must load after torch's static
// initializers ran, never from inside torch's own load. dlopen_then_look_for_torch() counts
// nesting per thread and looks only at depth 0, after the outermost dlopen returned (a dlopen made
// by a constructor during torch's load would already see torch's link map). When another thread
// sees torch while its load is still running, its dlopen of the hook waits: glibc holds its loader
// lock until that load's initializers have finished. Torch is looked for with dl_iterate_phdr (no
// file-system access, unlike a RTLD_NOLOAD dlopen of a bare name), and not at all when no object
// was added since the last look (dlpi_adds). One atomic state decides who loads the hook: the
// thread that moves it from WATCHING to SETTLED; every dlopen after that, including those made by
// the hook's own initializers, goes straight to the real dlopen.
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KFORGE_EXPORT __attribute__((visibility("default")))
#define KFORGE_INTERNAL __attribute__((visibility("hidden")))

typedef void *(*dlopen_fn)(const char *file, int mode);

// ---- configuration and state ------------------------------------------------------------------

enum shim_state {
  SHIM_STARTING,  // before the constructor: every dlopen goes straight through
  SHIM_WATCHING,  // looking for torch after dlopens of paths and before main
  SHIM_SETTLED,   // disabled, or torch was found and the hook question answered: nothing more
};

struct shim_config {
  bool verbose;                  // KFORGE_LOG
  const char *hook_path;         // KFORGE_HOOK, or NULL
  const char *hook_dir_env;      // KFORGE_HOOK_DIR, or NULL
  char shim_dir[PATH_MAX];       // where this shim was loaded from ("" if unknown)
};

// Written once by the constructor before g_state leaves SHIM_STARTING (release); read only by
// code that saw SHIM_WATCHING (acquire).
static struct shim_config g_config;
static _Atomic int g_state = SHIM_STARTING;
static _Atomic(dlopen_fn) g_real_dlopen;
static _Atomic unsigned long long g_adds_seen;  // dlpi_adds of the last fruitless look for torch
static _Thread_local unsigned t_checked_depth;   // nesting of dlopen_then_look_for_torch()

// Note [The hook's thread block]
// The hook keeps what its interceptors need per thread in one block (HookThread, Note [One
// thread-local block] in interposer/hook/hook_work.h) and reads it on every intercepted call. The
// hook is dlopen'd, so a thread_local of its own is dynamic TLS: every access is a call of
// __tls_get_addr, which reads the thread's DTV and the loader's generation count, lines of memory
// that are cold between a model's operator calls. This shim is preloaded, so its TLS is in every
// thread's static TLS block, at one fixed offset from the thread pointer in every thread (the
// initial-exec model says so to the compiler and the loader). It reserves this block for the
// hook, zero-filled in every thread as all TLS starts, and kforge_shim_thread_block() tells the
// hook its offset and size; the hook then reaches its block with one read of the thread pointer
// and an add. The shim itself never touches the block. A hook loaded without the shim (tests that
// dlopen it directly), or one whose HookThread outgrew the block, uses its own thread_local
// instead. 4 KiB per thread of every process under the shim.
#define KFORGE_THREAD_BLOCK_BYTES 4096
static _Thread_local unsigned char t_hook_block[KFORGE_THREAD_BLOCK_BYTES]
    __attribute__((tls_model("initial-exec"), aligned(64)));

// The block's offset from the thread pointer (the same in every thread); its size and alignment
// in *bytes and *align.
KFORGE_EXPORT long kforge_shim_thread_block(size_t *bytes, size_t *align);
KFORGE_EXPORT long kforge_shim_thread_block(size_t *bytes, size_t *align) {
  *bytes = sizeof t_hook_block;
  *align = 64;
  return (long)((char *)t_hook_block - (char *)__builtin_thread_pointer());
}

static bool env_flag(const char *name) {
  const char *v = getenv(name);
  return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
}

static const char *env_path(const char *name) {
  const char *v = getenv(name);
  return v != NULL && v[0] != '\0' ? v : NULL;
}

// One line to stderr in one write(), so lines from several processes do not interleave.
__attribute__((format(printf, 1, 2))) static void log_line(const char *fmt, ...) {
  char line[2048];
  va_list args;
  va_start(args, fmt);
  int n = vsnprintf(line, sizeof line - 1, fmt, args);
  va_end(args);
  if (n < 0) return;
  size_t len = (size_t)n < sizeof line - 1 ? (size_t)n : sizeof line - 2;
  line[len++] = '\n';
  for (size_t done = 0; done < len;) {
    ssize_t w = write(STDERR_FILENO, line + done, len - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    done += (size_t)w;
  }
}

// The next definition of a libc function after this shim. The current version first, then the
// base versions of x86-64 and AArch64, then whatever the default is.
static void *next_definition(const char *name) {
  static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
  for (size_t i = 0; i < sizeof versions / sizeof versions[0]; ++i) {
    void *p = dlvsym(RTLD_NEXT, name, versions[i]);
    if (p != NULL) return p;
    (void)dlerror();  // a failed lookup must not show up in the program's next dlerror()
  }
  void *p = dlsym(RTLD_NEXT, name);
  if (p == NULL) (void)dlerror();
  return p;
}

static dlopen_fn real_dlopen(void) {
  dlopen_fn fn = atomic_load_explicit(&g_real_dlopen, memory_order_relaxed);
  if (fn == NULL) {  // resolving twice from two threads is harmless: both find the same function
    void *p = next_definition("dlopen");
    memcpy(&fn, &p, sizeof fn);
    atomic_store_explicit(&g_real_dlopen, fn, memory_order_relaxed);
  }
  return fn;
}

// ---- finding torch and its version -------------------------------------------------------------

static const char *base_name(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash != NULL ? slash + 1 : path;
}

static bool names_libtorch_cpu(const char *path) {
  static const char kName[] = "libtorch_cpu.so";
  const char *base = base_name(path);
  return strncmp(base, kName, sizeof kName - 1) == 0 &&
         (base[sizeof kName - 1] == '\0' || base[sizeof kName - 1] == '.');
}

struct torch_search {
  bool first_object;
  bool nothing_new;
  unsigned long long adds;
  char *path;  // where libtorch_cpu.so was found, when found
  size_t path_size;
  bool found;
};

static int visit_loaded_object(struct dl_phdr_info *info, size_t size, void *data) {
  struct torch_search *s = data;
  if (s->first_object) {
    s->first_object = false;
    if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) {
      s->adds = info->dlpi_adds;
      if (s->adds == atomic_load_explicit(&g_adds_seen, memory_order_relaxed)) {
        s->nothing_new = true;
        return 1;
      }
    }
  }
  if (info->dlpi_name == NULL || !names_libtorch_cpu(info->dlpi_name)) return 0;
  size_t len = strlen(info->dlpi_name);
  if (len >= s->path_size) return 0;  // a path we could not hold: treat it as absent
  memcpy(s->path, info->dlpi_name, len + 1);
  s->found = true;
  return 1;
}

// Whether libtorch_cpu.so is in the process; its path goes to `path`.
static bool find_loaded_torch(char *path, size_t path_size) {
  struct torch_search s = {.first_object = true, .path = path, .path_size = path_size};
  dl_iterate_phdr(visit_loaded_object, &s);
  if (!s.found && !s.nothing_new && s.adds != 0) {
    atomic_store_explicit(&g_adds_seen, s.adds, memory_order_relaxed);
  }
  return s.found;
}

// Reads up to size-1 bytes of a small file; false if it cannot be opened or read.
static bool read_small_file(const char *path, char *buf, size_t size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  size_t len = 0;
  while (len < size - 1) {
    ssize_t n = read(fd, buf + len, size - 1 - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    len += (size_t)n;
  }
  close(fd);
  buf[len] = '\0';
  return len > 0;
}

// Copies a version token ("2.11.0+cu130") that starts at `s` into `out`; false if there is none.
static bool copy_version_token(const char *s, char *out, size_t out_size) {
  size_t len = 0;
  while (s[len] != '\0' && s[len] != '\'' && s[len] != '"' && s[len] != '\n' && s[len] != '\r' &&
         s[len] != ' ' && s[len] != '\t') {
    ++len;
  }
  if (len == 0 || len >= out_size || s[0] < '0' || s[0] > '9') return false;
  memcpy(out, s, len);
  out[len] = '\0';
  return true;
}

// The version of the torch whose libraries are in `lib_dir`, e.g. "2.11.0+cu130".
static bool read_torch_version(const char *lib_dir, char *version, size_t version_size) {
  char path[PATH_MAX];
  char text[8192];
  if (snprintf(path, sizeof path, "%s/../version.py", lib_dir) < (int)sizeof path &&
      read_small_file(path, text, sizeof text)) {
    for (const char *p = strstr(text, "__version__"); p != NULL; p = strstr(p + 1, "__version__")) {
      const char *q = p + strlen("__version__");
      while (*q == ' ' || *q == '\t') ++q;
      if (*q == ':') {  // an annotated assignment: __version__: str = '...'
        while (*q != '\0' && *q != '=' && *q != '\n') ++q;
      }
      if (*q != '=') continue;
      ++q;
      while (*q == ' ' || *q == '\t') ++q;
      if (*q != '\'' && *q != '"') continue;
      if (copy_version_token(q + 1, version, version_size)) return true;
    }
  }
  if (snprintf(path, sizeof path, "%s/../build-version", lib_dir) < (int)sizeof path &&
      read_small_file(path, text, sizeof text)) {
    const char *q = text;
    while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r') ++q;
    if (copy_version_token(q, version, version_size)) return true;
  }
  return false;
}

// "2.11.0+cu130" -> "2.11".
static bool major_minor(const char *version, char *out, size_t out_size) {
  const char *p = version;
  while (*p >= '0' && *p <= '9') ++p;
  if (p == version || *p != '.') return false;
  const char *minor = ++p;
  while (*p >= '0' && *p <= '9') ++p;
  if (p == minor) return false;
  size_t len = (size_t)(p - version);
  if (len >= out_size) return false;
  memcpy(out, version, len);
  out[len] = '\0';
  return true;
}

// "torch2.10, torch2.11" for the hooks in `dir`, or "none".
static void list_hooks(const char *dir, char *out, size_t out_size) {
  static const char kPrefix[] = "libkforge_hook-";
  static const char kSuffix[] = ".so";
  size_t len = 0;
  out[0] = '\0';
  DIR *d = opendir(dir);
  if (d != NULL) {
    for (struct dirent *e = readdir(d); e != NULL; e = readdir(d)) {
      size_t n = strlen(e->d_name);
      if (n <= sizeof kPrefix - 1 + sizeof kSuffix - 1 ||
          strncmp(e->d_name, kPrefix, sizeof kPrefix - 1) != 0 ||
          strcmp(e->d_name + n - (sizeof kSuffix - 1), kSuffix) != 0) {
        continue;
      }
      int tag_len = (int)(n - (sizeof kPrefix - 1) - (sizeof kSuffix - 1));
      int w = snprintf(out + len, out_size - len, "%s%.*s", len > 0 ? ", " : "", tag_len,
                       e->d_name + sizeof kPrefix - 1);
      if (w < 0 || (size_t)w >= out_size - len) {  // enough names for one line
        out[len] = '\0';
        break;
      }
      len += (size_t)w;
    }
    closedir(d);
  }
  if (len == 0) snprintf(out, out_size, "none");
}

// ---- loading the hook --------------------------------------------------------------------------

// Runs once per process, on the thread that settled the state. Prints at most one line.
static void load_hook_for(const char *torch_lib) {
  char lib_dir[PATH_MAX];
  size_t dir_len = (size_t)(base_name(torch_lib) - torch_lib);
  if (dir_len == 0) {
    snprintf(lib_dir, sizeof lib_dir, ".");
  } else {
    memcpy(lib_dir, torch_lib, dir_len - 1);  // torch_lib fits in PATH_MAX, so does its directory
    lib_dir[dir_len - 1] = '\0';
  }
  char version[64];
  bool known_version = read_torch_version(lib_dir, version, sizeof version);

  char hook[PATH_MAX];
  if (g_config.hook_path != NULL) {
    if (snprintf(hook, sizeof hook, "%s", g_config.hook_path) >= (int)sizeof hook) {
      log_line("kforge: KFORGE_HOOK is longer than PATH_MAX; running without kforge");
      return;
    }
  } else {
    char wanted[32];
    if (!known_version || !major_minor(version, wanted, sizeof wanted)) {
      log_line("kforge: cannot tell the version of the torch in %s (no ../version.py or "
               "../build-version); running without kforge", lib_dir);
      return;
    }
    const char *dir = g_config.hook_dir_env != NULL ? g_config.hook_dir_env : g_config.shim_dir;
    if (dir[0] == '\0') {
      log_line("kforge: cannot tell where libkforge_preload.so is; set KFORGE_HOOK_DIR; "
               "running without kforge");
      return;
    }
    if (snprintf(hook, sizeof hook, "%s/libkforge_hook-torch%s.so", dir, wanted) >=
            (int)sizeof hook ||
        access(hook, F_OK) != 0) {
      char have[512];
      list_hooks(dir, have, sizeof have);
      log_line("kforge: no hook for torch %s in %s (have: %s); running without kforge", wanted, dir,
               have);
      return;
    }
  }

  // Never closed: the hook registers with torch for the life of the process.
  void *handle = real_dlopen()(hook, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == NULL) {
    const char *why = dlerror();
    log_line("kforge: cannot load hook %s: %s; running without kforge", hook,
             why != NULL ? why : "unknown error");
    return;
  }
  if (g_config.verbose) {
    log_line("kforge: loaded hook %s for torch %s", hook, known_version ? version : "(unknown)");
  }
}

// Called where torch, if present, is fully initialized (Note [When torch is ready]).
static void look_for_torch(void) {
  if (atomic_load_explicit(&g_state, memory_order_acquire) != SHIM_WATCHING) return;
  int saved_errno = errno;
  char torch_lib[PATH_MAX];
  if (find_loaded_torch(torch_lib, sizeof torch_lib)) {
    int expected = SHIM_WATCHING;
    if (atomic_compare_exchange_strong_explicit(&g_state, &expected, SHIM_SETTLED,
                                                memory_order_acq_rel, memory_order_acquire)) {
      load_hook_for(torch_lib);
    }
  }
  errno = saved_errno;
}

// ---- dlopen ------------------------------------------------------------------------------------

static void *dlopen_then_look_for_torch(const char *file, int mode) {
  ++t_checked_depth;
  void *handle = real_dlopen()(file, mode);
  --t_checked_depth;
  if (handle != NULL && t_checked_depth == 0) look_for_torch();
  return handle;
}

static void *dlopen_unavailable(const char *file, int mode) {
  (void)file;
  (void)mode;
  return NULL;
}

// A name glibc resolves relative to the caller (Note [dlopen keeps its caller]).
static bool is_caller_relative(const char *file) {
  return strchr(file, '/') == NULL || strchr(file, '$') != NULL;
}

// Where dlopen(file, mode) goes. Hot for every dlopen of the process: two atomic loads and, while
// watching, two strchr. Called from the assembly below, hence `used`.
KFORGE_INTERNAL dlopen_fn kforge_shim_route_dlopen(const char *file, int mode);
KFORGE_INTERNAL __attribute__((used)) dlopen_fn kforge_shim_route_dlopen(const char *file,
                                                                          int mode) {
  (void)mode;
  dlopen_fn real = real_dlopen();
  if (real == NULL) return dlopen_unavailable;
  if (atomic_load_explicit(&g_state, memory_order_acquire) != SHIM_WATCHING) return real;
  if (file != NULL && is_caller_relative(file)) return real;
  return dlopen_then_look_for_torch;
}

// dlopen: save the arguments, ask the router, restore them and jump (not call) to its answer.
#if defined(__x86_64__) && defined(__LP64__)
#if defined(__CET__) && (__CET__ & 1)
#define KFORGE_ENDBR "endbr64\n"
#else
#define KFORGE_ENDBR ""
#endif
__asm__(
    ".pushsection .text\n"
    ".globl dlopen\n"
    ".type dlopen, @function\n"
    ".p2align 4\n"
    "dlopen:\n"
    ".cfi_startproc\n"
    KFORGE_ENDBR
    "  pushq %rdi\n"
    ".cfi_adjust_cfa_offset 8\n"
    "  pushq %rsi\n"
    ".cfi_adjust_cfa_offset 8\n"
    "  subq $8, %rsp\n"  // 16-byte alignment at the call
    ".cfi_adjust_cfa_offset 8\n"
    "  call kforge_shim_route_dlopen\n"
    "  addq $8, %rsp\n"
    ".cfi_adjust_cfa_offset -8\n"
    "  popq %rsi\n"
    ".cfi_adjust_cfa_offset -8\n"
    "  popq %rdi\n"
    ".cfi_adjust_cfa_offset -8\n"
    "  jmp *%rax\n"
    ".cfi_endproc\n"
    ".size dlopen, .-dlopen\n"
    ".popsection\n");
#elif defined(__aarch64__)
__asm__(
    ".pushsection .text\n"
    ".globl dlopen\n"
    ".type dlopen, %function\n"
    ".p2align 2\n"
    "dlopen:\n"
    ".cfi_startproc\n"
    "  hint #34\n"  // BTI c: a landing pad where branch protection is on, a no-op elsewhere
    "  stp x29, x30, [sp, #-32]!\n"
    ".cfi_def_cfa_offset 32\n"
    ".cfi_offset 29, -32\n"
    ".cfi_offset 30, -24\n"
    "  mov x29, sp\n"
    "  stp x0, x1, [sp, #16]\n"
    "  bl kforge_shim_route_dlopen\n"
    "  mov x16, x0\n"
    "  ldp x0, x1, [sp, #16]\n"
    "  ldp x29, x30, [sp], #32\n"
    ".cfi_restore 30\n"
    ".cfi_restore 29\n"
    ".cfi_def_cfa_offset 0\n"
    "  br x16\n"
    ".cfi_endproc\n"
    ".size dlopen, .-dlopen\n"
    ".popsection\n");
#else
KFORGE_EXPORT void *dlopen(const char *file, int mode) {
  return kforge_shim_route_dlopen(file, mode)(file, mode);
}
#endif

// ---- programs linked against libtorch ----------------------------------------------------------

typedef int (*main_fn)(int argc, char **argv, char **envp);
typedef int (*libc_start_main_fn)(main_fn program_main, int argc, char **argv, main_fn init,
                                  void (*fini)(void), void (*rtld_fini)(void), void *stack_end);

static main_fn g_program_main;

static int main_after_hook(int argc, char **argv, char **envp) {
  look_for_torch();  // every static initializer has run, and no dlopen is in progress
  return g_program_main(argc, argv, envp);
}

#if defined(__x86_64__) || defined(__aarch64__)
// glibc's own prototype (csu/libc-start.c); no public header declares it.
KFORGE_EXPORT int __libc_start_main(main_fn program_main, int argc, char **argv, main_fn init,
                                    void (*fini)(void), void (*rtld_fini)(void), void *stack_end);
KFORGE_EXPORT int __libc_start_main(main_fn program_main, int argc, char **argv, main_fn init,
                                    void (*fini)(void), void (*rtld_fini)(void), void *stack_end) {
  libc_start_main_fn real;
  void *p = next_definition("__libc_start_main");
  memcpy(&real, &p, sizeof real);
  if (real == NULL) {  // cannot happen with glibc; without it the program cannot start at all
    log_line("kforge: libkforge_preload.so cannot find __libc_start_main; unset LD_PRELOAD");
    _exit(127);
  }
  // Libraries' initializers (libtorch's among them) have run by now; the program's own run inside
  // the real __libc_start_main, before main. Only programs with torch get their main wrapped.
  char torch_lib[PATH_MAX];
  if (atomic_load_explicit(&g_state, memory_order_acquire) == SHIM_WATCHING &&
      find_loaded_torch(torch_lib, sizeof torch_lib)) {
    g_program_main = program_main;
    program_main = main_after_hook;
  }
  return real(program_main, argc, argv, init, fini, rtld_fini, stack_end);
}
#endif

// ---- start -------------------------------------------------------------------------------------

static void find_own_directory(char *out, size_t out_size) {
  out[0] = '\0';
  Dl_info info;
  char resolved[PATH_MAX];
  if (dladdr(&g_config, &info) == 0 || info.dli_fname == NULL ||
      realpath(info.dli_fname, resolved) == NULL) {
    return;
  }
  size_t dir_len = (size_t)(base_name(resolved) - resolved);
  if (dir_len < 2 || dir_len > out_size) return;  // "/x.so" would give "", which we do not expect
  memcpy(out, resolved, dir_len - 1);
  out[dir_len - 1] = '\0';
}

__attribute__((constructor)) static void shim_start(void) {
  int saved_errno = errno;
  if (env_flag("KFORGE_DISABLE")) {
    atomic_store_explicit(&g_state, SHIM_SETTLED, memory_order_release);
    errno = saved_errno;
    return;
  }
  g_config.verbose = env_flag("KFORGE_LOG");
  g_config.hook_path = env_path("KFORGE_HOOK");
  g_config.hook_dir_env = env_path("KFORGE_HOOK_DIR");
  // Resolved now, while relative paths still mean what they meant at exec.
  find_own_directory(g_config.shim_dir, sizeof g_config.shim_dir);
  (void)real_dlopen();
  atomic_store_explicit(&g_state, SHIM_WATCHING, memory_order_release);
  errno = saved_errno;
}
