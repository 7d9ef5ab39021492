"""libkforge_preload.so, the LD_PRELOAD shim (interposer/preload_shim.c).

What must hold, and why:
- It sits in every process of a session (shells, compilers, plain python), so without torch it
  must be invisible: same output, same exit code, nothing printed, and dlopen() must resolve names
  exactly as before, including names resolved through the caller's RPATH/RUNPATH or $ORIGIN
  (torch's own libraries load NVRTC and cuDNN parts that way).
- With torch in the process it loads the hook for that torch version exactly once, after torch
  has finished loading; with no matching hook it prints one line and the program runs unchanged.

The "hook" loaded here is a stand-in library built by these tests: its constructor appends one line
to $KFORGE_TEST_MARKER saying whether libtorch_cpu.so and torch/_C were in the process at that
moment. The shim treats it like any hook; what it proves is when and how often the shim loads one.
"""
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

TORCH_DIR = pathlib.Path(importlib.util.find_spec("torch").origin).parent
TORCH_LIB = TORCH_DIR / "lib"
TORCH_MAJOR_MINOR = "2.11"
SHIM_VARIABLES = ("LD_PRELOAD", "KFORGE_DISABLE", "KFORGE_LOG", "KFORGE_HOOK", "KFORGE_HOOK_DIR",
                  "KFORGE_TEST_MARKER")
IMPORT_TORCH = "import torch; print(int(torch.arange(4).sum()))"

STAND_IN_HOOK_C = r"""
// Stand-in for the hook: records, once per load, which parts of torch were already loaded and,
// for the stand-in libtorch_cpu.so of these tests, whether its constructor had finished.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char torch_path[4096];

static int note_torch(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  int *seen = data;
  if (strstr(info->dlpi_name, "/libtorch_cpu.so") != NULL) {
    seen[0] = 1;
    snprintf(torch_path, sizeof torch_path, "%s", info->dlpi_name);
  }
  if (strstr(info->dlpi_name, "/torch/_C.") != NULL) seen[1] = 1;
  return 0;
}

// "1"/"0": the stand-in libtorch_cpu.so's constructor had / had not finished; "na": a real torch.
static const char *torch_ready(void) {
  void *torch = torch_path[0] != '\0' ? dlopen(torch_path, RTLD_NOLOAD | RTLD_LAZY) : NULL;
  const int *ready = torch != NULL ? (const int *)dlsym(torch, "stand_in_torch_ready") : NULL;
  (void)dlerror();
  return ready == NULL ? "na" : *ready ? "1" : "0";
}

__attribute__((constructor)) static void announce(void) {
  int seen[2] = {0, 0};
  dl_iterate_phdr(note_torch, seen);
  const char *ready = torch_ready();
  // A real hook's initializers dlopen libraries too; the shim must not load anything for those.
  void *m = dlopen("libm.so.6", RTLD_NOW);
  void *z = dlopen("/lib/x86_64-linux-gnu/libz.so.1", RTLD_NOW);
  if (m != NULL) dlclose(m);
  if (z != NULL) dlclose(z);
  const char *marker = getenv("KFORGE_TEST_MARKER");
  if (marker == NULL) return;
  char line[128];
  int n = snprintf(line, sizeof line, "loaded pid=%d libtorch_cpu=%d torch_C=%d ready=%s\n",
                   (int)getpid(), seen[0], seen[1], ready);
  int fd = open(marker, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    if (write(fd, line, (size_t)n) != n) {}
    close(fd);
  }
}
"""


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in SHIM_VARIABLES}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(args, shim=None, cwd=None, **extra_env):
    env = clean_env(**extra_env)
    if shim is not None:
        env["LD_PRELOAD"] = str(shim)
    return subprocess.run([str(a) for a in args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def compile_c(tmp, name, source, *flags, compiler="cc"):
    src = tmp / f"{name}.c"
    src.write_text(textwrap.dedent(source))
    out = tmp / name
    proc = subprocess.run([compiler, "-O1", "-o", str(out), str(src), *flags], capture_output=True,
                          text=True, env=clean_env())
    assert proc.returncode == 0, proc.stderr
    return out


def marker_lines(marker):
    return marker.read_text().splitlines() if marker.exists() else []


@pytest.fixture(scope="session")
def shim(build_dir):
    path = build_dir / "interposer" / "libkforge_preload.so"
    if not path.exists():
        pytest.fail(f"{path} is missing: cmake --build {build_dir} --target kforge_preload")
    return path


@pytest.fixture(scope="session")
def stand_in_hook(tmp_path_factory):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    return compile_c(tmp_path_factory.mktemp("stand_in_hook"), "libstand_in_hook.so",
                     STAND_IN_HOOK_C, "-shared", "-fPIC")


@pytest.fixture(scope="session")
def torch_run_without_shim():
    """`import torch` without the shim: what every run with the shim is compared with."""
    proc = run([sys.executable, "-c", IMPORT_TORCH])
    assert proc.returncode == 0, proc.stderr
    return proc


def assert_same_result(with_shim, without_shim):
    assert (with_shim.returncode, with_shim.stdout, with_shim.stderr) == (
        without_shim.returncode, without_shim.stdout, without_shim.stderr)


def stderr_without_kforge_lines(proc):
    return "".join(l for l in proc.stderr.splitlines(keepends=True) if not l.startswith("kforge:"))


def kforge_lines(proc):
    return [l for l in proc.stderr.splitlines() if l.startswith("kforge:")]


# ---- invisible without torch -------------------------------------------------------------------

def test_the_shim_links_nothing_but_libc_and_exports_only_its_interpositions(shim):
    dynamic = subprocess.run(["readelf", "-d", str(shim)], capture_output=True, text=True,
                             check=True).stdout
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic))
    assert needed <= {"libc.so.6", "libdl.so.2", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}
    assert "RPATH" not in dynamic and "RUNPATH" not in dynamic
    exported = subprocess.run(["nm", "-D", "--defined-only", str(shim)], capture_output=True,
                              text=True, check=True).stdout.split()
    assert sorted(s for s in exported if not re.fullmatch(r"[0-9a-f]+|[A-Za-z]", s)) == [
        "__libc_start_main", "dlopen", "kforge_shim_thread_block"]


THREAD_BLOCK_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef long (*query_fn)(size_t *, size_t *);
static query_fn query;
static long offsets[3];
static int zero[3], own[3];

static unsigned char *block(long offset) { return (unsigned char *)__builtin_thread_pointer() + offset; }

static void *look(void *arg) {
  long i = (long)arg;
  size_t bytes = 0, align = 0;
  offsets[i] = query(&bytes, &align);
  unsigned char *b = block(offsets[i]);
  zero[i] = 1;
  for (size_t k = 0; k < bytes; ++k) zero[i] &= b[k] == 0;   /* every thread's block starts zeroed */
  memset(b, (int)i + 1, bytes);                                /* and is its own */
  own[i] = b[0] == i + 1 && b[bytes - 1] == i + 1 && ((unsigned long)b % align) == 0;
  return NULL;
}

int main(void) {
  query = (query_fn)dlsym(RTLD_DEFAULT, "kforge_shim_thread_block");
  if (query == NULL) { printf("none\n"); return 0; }
  size_t bytes = 0, align = 0;
  query(&bytes, &align);
  look((void *)0);
  pthread_t t[2];
  for (long i = 1; i < 3; ++i) pthread_create(&t[i - 1], NULL, look, (void *)i);
  for (int i = 0; i < 2; ++i) pthread_join(t[i], NULL);
  int kept = block(offsets[0])[0] == 1;                        /* the other threads did not touch it */
  printf("bytes=%zu align=%zu same_offset=%d zero=%d%d%d own=%d%d%d kept=%d\n", bytes, align,
         offsets[0] == offsets[1] && offsets[1] == offsets[2] && offsets[0] != 0, zero[0], zero[1],
         zero[2], own[0], own[1], own[2], kept);
  return 0;
}
"""


def test_the_shim_reserves_a_zeroed_thread_block_at_one_offset_in_every_thread(shim, tmp_path):
    # Note [The hook's thread block] in preload_shim.c: the hook reaches its per-thread block at
    # the thread pointer plus one offset, the same in every thread, including threads started
    # after the process did; each thread's block starts zero-filled and is its own.
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    program = compile_c(tmp_path, "thread_block", THREAD_BLOCK_C, "-pthread", "-ldl")
    assert run([program]).stdout == "none\n"          # without the shim there is no block
    proc = run([program], shim=shim)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "bytes=4096 align=64 same_offset=1 zero=111 own=111 kept=1\n"


@pytest.mark.parametrize("args", [
    ["bash", "-c", "echo hi"],
    ["bash", "-c", "echo to-stderr >&2; exit 3"],
    ["cc", "--version"],
    ["python3", "-c", "print(1)"],
    [sys.executable, "-c", "import ctypes, json; ctypes.CDLL('libm.so.6'); print(json.dumps(1))"],
], ids=["bash", "bash-exit-3", "cc-version", "system-python", "venv-python-no-torch"])
def test_processes_without_torch_are_unchanged(shim, args):
    if shutil.which(args[0]) is None:
        pytest.skip(f"no {args[0]}")
    assert_same_result(run(args, shim=shim), run(args))


def test_compiling_and_running_a_c_program_is_unchanged(shim, tmp_path):
    source = tmp_path / "hello.c"
    source.write_text('#include <stdio.h>\nint main(void) { puts("hello"); return 7; }\n')
    results = []
    for name, preload in (("plain", None), ("shimmed", shim)):
        exe = tmp_path / f"hello-{name}"
        build = run(["cc", "-O2", "-o", exe, source], shim=preload)
        assert build.returncode == 0, build.stderr
        results.append((build.returncode, build.stdout, build.stderr))
        ran = run([exe], shim=preload)
        results.append((ran.returncode, ran.stdout, ran.stderr))
    assert results[0:2] == results[2:4]
    assert results[1] == (7, "hello\n", "")


CALLER_RELATIVE_MAIN = r"""
// dlopen()s a library (argv[1], a path) whose own dlopen calls must resolve against its RPATH or
// RUNPATH and $ORIGIN, as torch's do; also prints the dlerror() of a failed dlopen.
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
  if (argc < 2) return 2;
  void *caller = dlopen(argv[1], RTLD_NOW);
  if (caller == NULL) { printf("caller: %s\n", dlerror()); return 1; }
  int (*open_dep)(const char *) = (int (*)(const char *))dlsym(caller, "open_dep");
  printf("bare name: %d\n", open_dep("libdep_bare.so"));
  printf("$ORIGIN name: %d\n", open_dep("$ORIGIN/deps/libdep_origin.so"));
  printf("missing: %s\n", dlopen("/nonexistent/libmissing.so", RTLD_NOW) ? "loaded" : dlerror());
  printf("missing bare: %s\n", dlopen("libmissing-kforge.so", RTLD_NOW) ? "loaded" : dlerror());
  return 0;
}
"""

CALLER_LIBRARY = r"""
#include <dlfcn.h>
#include <stdio.h>
int open_dep(const char *name) {
  void *h = dlopen(name, RTLD_NOW);
  if (h == NULL) { printf("  %s\n", dlerror()); return -1; }
  int (*value)(void) = (int (*)(void))dlsym(h, "dep_value");
  return value();
}
"""


@pytest.mark.parametrize("dtags", ["--disable-new-dtags", "--enable-new-dtags"],
                         ids=["rpath", "runpath"])
def test_dlopen_still_resolves_names_against_its_caller(shim, tmp_path, dtags):
    # glibc searches a bare name in the *calling* object's RPATH/RUNPATH and expands $ORIGIN to
    # the caller's directory; a shim that wrapped dlopen with an ordinary call would become the
    # caller and both loads would fail.
    deps = tmp_path / "deps"
    deps.mkdir()
    for name, value in (("dep_bare", 41), ("dep_origin", 42)):
        compile_c(deps, f"lib{name}.so", f"int dep_value(void) {{ return {value}; }}\n",
                  "-shared", "-fPIC")
    caller = compile_c(tmp_path, "libcaller.so", CALLER_LIBRARY, "-shared", "-fPIC",
                       f"-Wl,{dtags},-rpath,$ORIGIN/deps")
    program = compile_c(tmp_path, "open_through_caller", CALLER_RELATIVE_MAIN, "-ldl")
    without = run([program, caller])
    assert "bare name: 41\n$ORIGIN name: 42\n" in without.stdout, without.stdout
    assert_same_result(run([program, caller], shim=shim), without)


# ---- torch without a hook ----------------------------------------------------------------------

def test_torch_without_a_matching_hook_prints_one_line_and_runs_unchanged(
        shim, tmp_path, torch_run_without_shim):
    (tmp_path / "libkforge_hook-torch2.10.so").write_bytes(b"")
    proc = run([sys.executable, "-c", IMPORT_TORCH], shim=shim, KFORGE_HOOK_DIR=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == torch_run_without_shim.stdout == "6\n"
    assert kforge_lines(proc) == [
        f"kforge: no hook for torch {TORCH_MAJOR_MINOR} in {tmp_path} (have: torch2.10); "
        "running without kforge"]
    assert stderr_without_kforge_lines(proc) == torch_run_without_shim.stderr


def test_an_empty_hook_directory_is_reported_as_having_none(shim, tmp_path):
    proc = run([sys.executable, "-c", IMPORT_TORCH], shim=shim, KFORGE_HOOK_DIR=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert kforge_lines(proc) == [
        f"kforge: no hook for torch {TORCH_MAJOR_MINOR} in {tmp_path} (have: none); "
        "running without kforge"]


def test_a_hook_that_fails_to_load_costs_one_line(shim, tmp_path, torch_run_without_shim):
    broken = tmp_path / "libkforge_hook-torch2.11.so"
    broken.write_text("not an ELF file\n")
    proc = run([sys.executable, "-c", IMPORT_TORCH], shim=shim, KFORGE_HOOK_DIR=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == torch_run_without_shim.stdout
    lines = kforge_lines(proc)
    assert len(lines) == 1
    assert re.fullmatch(rf"kforge: cannot load hook {re.escape(str(broken))}: .*; "
                        r"running without kforge", lines[0]), lines


# ---- torch with a hook -------------------------------------------------------------------------

def test_the_hook_named_for_the_torch_version_is_found_next_to_the_shim(
        shim, stand_in_hook, tmp_path, torch_run_without_shim):
    lib = tmp_path / "lib"
    lib.mkdir()
    shutil.copy(shim, lib / "libkforge_preload.so")
    shutil.copy(stand_in_hook, lib / f"libkforge_hook-torch{TORCH_MAJOR_MINOR}.so")
    marker = tmp_path / "marker"
    proc = run([sys.executable, "-c", IMPORT_TORCH], shim=lib / "libkforge_preload.so",
               KFORGE_TEST_MARKER=marker)
    assert_same_result(proc, torch_run_without_shim)
    assert len(marker_lines(marker)) == 1


def test_kforge_hook_dir_and_kforge_log(shim, stand_in_hook, tmp_path):
    hook = tmp_path / f"libkforge_hook-torch{TORCH_MAJOR_MINOR}.so"
    shutil.copy(stand_in_hook, hook)
    marker = tmp_path / "marker"
    proc = run([sys.executable, "-c", IMPORT_TORCH], shim=shim, KFORGE_HOOK_DIR=tmp_path,
               KFORGE_LOG=1, KFORGE_TEST_MARKER=marker)
    assert proc.returncode == 0, proc.stderr
    assert len(marker_lines(marker)) == 1
    assert kforge_lines(proc) == [f"kforge: loaded hook {hook} for torch 2.11.0+cu130"]


def test_python_loads_the_hook_once_right_after_torch_c(shim, stand_in_hook, tmp_path):
    # Eight threads import torch at once, then all of them keep dlopen()ing torch's libraries and
    # others, while the stand-in's constructor dlopen()s too: one load, after torch/_C.
    script = textwrap.dedent(f"""
        import ctypes, threading
        barrier = threading.Barrier(8)
        def work():
            barrier.wait()
            import torch
            for _ in range(25):
                ctypes.CDLL({str(TORCH_LIB / "libtorch_cpu.so")!r})
                ctypes.CDLL("libm.so.6")
                ctypes.CDLL({str(TORCH_LIB / "libc10.so")!r})
        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads: t.start()
        for t in threads: t.join()
        import torch
        print(int(torch.ones(5).sum()))
    """)
    marker = tmp_path / "marker"
    proc = run([sys.executable, "-c", script], shim=shim, KFORGE_HOOK=stand_in_hook,
               KFORGE_TEST_MARKER=marker)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "5\n"
    assert kforge_lines(proc) == []
    lines = marker_lines(marker)
    assert len(lines) == 1, lines
    assert re.fullmatch(r"loaded pid=\d+ libtorch_cpu=1 torch_C=1 ready=na", lines[0]), lines


CONCURRENT_DLOPEN_MAIN = r"""
// Sixteen threads dlopen() libtorch_cpu.so (argv[1]) and other libraries at the same moment.
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
static const char *torch_path;
static pthread_barrier_t start;
static void *work(void *arg) {
  (void)arg;
  pthread_barrier_wait(&start);
  for (int i = 0; i < 20; ++i) {
    if (dlopen(torch_path, RTLD_NOW | RTLD_GLOBAL) == NULL) { puts(dlerror()); return arg; }
    dlopen("libm.so.6", RTLD_NOW);
    dlopen("/lib/x86_64-linux-gnu/libz.so.1", RTLD_LAZY);
  }
  return NULL;
}
int main(int argc, char **argv) {
  if (argc < 2) return 2;
  torch_path = argv[1];
  pthread_t threads[16];
  pthread_barrier_init(&start, NULL, 16);
  for (int i = 0; i < 16; ++i) pthread_create(&threads[i], NULL, work, NULL);
  for (int i = 0; i < 16; ++i) pthread_join(threads[i], NULL);
  puts("done");
  return 0;
}
"""


def test_concurrent_dlopens_of_torch_load_the_hook_once(shim, stand_in_hook, tmp_path):
    program = compile_c(tmp_path, "concurrent_dlopen", CONCURRENT_DLOPEN_MAIN, "-pthread", "-ldl")
    marker = tmp_path / "marker"
    proc = run([program, TORCH_LIB / "libtorch_cpu.so"], shim=shim, KFORGE_HOOK=stand_in_hook,
               KFORGE_TEST_MARKER=marker)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "done\n", "")
    lines = marker_lines(marker)
    assert len(lines) == 1 and lines[0].endswith("libtorch_cpu=1 torch_C=0 ready=na"), lines


def test_kforge_disable_makes_the_shim_do_nothing(shim, stand_in_hook, tmp_path,
                                                  torch_run_without_shim):
    marker = tmp_path / "marker"
    proc = run([sys.executable, "-c", IMPORT_TORCH], shim=shim, KFORGE_DISABLE=1,
               KFORGE_HOOK=stand_in_hook, KFORGE_LOG=1, KFORGE_HOOK_DIR=tmp_path,
               KFORGE_TEST_MARKER=marker)
    assert_same_result(proc, torch_run_without_shim)
    assert not marker.exists()


# ---- programs linked against libtorch ----------------------------------------------------------

LINKED_PROGRAM = r"""
// Linked against libtorch_cpu.so, so torch is in the process from the start; it reports whether
// the hook's marker existed when main() began.
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
int main() {
  const char *marker = std::getenv("KFORGE_TEST_MARKER");
  std::printf("hook loaded before main: %s\n",
              marker != nullptr && access(marker, F_OK) == 0 ? "yes" : "no");
  return 0;
}
"""


@pytest.fixture(scope="module")
def torch_linked_program(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("no C++ compiler")
    tmp = tmp_path_factory.mktemp("linked")
    src = tmp / "linked.cc"
    src.write_text(LINKED_PROGRAM)
    exe = tmp / "linked_to_libtorch"
    proc = subprocess.run(
        ["g++", "-O1", "-D_GLIBCXX_USE_CXX11_ABI=1", "-o", str(exe), str(src), f"-L{TORCH_LIB}",
         "-Wl,--no-as-needed", "-ltorch_cpu", "-lc10", "-Wl,--as-needed",
         f"-Wl,-rpath,{TORCH_LIB}", "-Wl,--allow-shlib-undefined"],
        capture_output=True, text=True, env=clean_env())
    assert proc.returncode == 0, proc.stderr
    needed = subprocess.run(["readelf", "-d", str(exe)], capture_output=True, text=True).stdout
    assert "libtorch_cpu.so" in needed
    return exe


def test_a_program_linked_to_libtorch_gets_the_hook_before_main(shim, stand_in_hook, tmp_path,
                                                                 torch_linked_program):
    marker = tmp_path / "marker"
    proc = run([torch_linked_program], shim=shim, KFORGE_HOOK=stand_in_hook,
               KFORGE_TEST_MARKER=marker)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "hook loaded before main: yes\n", "")
    lines = marker_lines(marker)
    assert len(lines) == 1 and lines[0].endswith("libtorch_cpu=1 torch_C=0 ready=na"), lines


def test_a_program_linked_to_libtorch_without_a_hook_runs_unchanged(shim, tmp_path,
                                                                    torch_linked_program):
    without = run([torch_linked_program])
    proc = run([torch_linked_program], shim=shim, KFORGE_HOOK_DIR=tmp_path)
    assert (proc.returncode, proc.stdout) == (without.returncode, without.stdout)
    assert kforge_lines(proc) == [
        f"kforge: no hook for torch {TORCH_MAJOR_MINOR} in {tmp_path} (have: none); "
        "running without kforge"]
    assert stderr_without_kforge_lines(proc) == without.stderr


# ---- the torch version, from either layout -----------------------------------------------------

OPEN_BY_PATH_MAIN = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
  if (argc < 2) return 2;
  puts(dlopen(argv[1], RTLD_NOW) != NULL ? "loaded" : dlerror());
  return 0;
}
"""


@pytest.mark.parametrize("version_file, text, expected", [
    ("build-version", "2.9.1+cpu\n", "no hook for torch 2.9 in"),
    ("version.py", "from typing import Optional\n__version__ = '2.12.0a0+git1234'\n",
     "no hook for torch 2.12 in"),
    ("version.py", '__version__: str = "3.0.0"\n', "no hook for torch 3.0 in"),
    ("README", "nothing here", "cannot tell the version of the torch in"),
], ids=["libtorch-zip", "pip-wheel", "annotated", "no-version-file"])
def test_the_torch_version_is_read_next_to_libtorch_cpu(shim, tmp_path, version_file, text,
                                                        expected):
    # A stand-in libtorch_cpu.so in a libtorch-like tree; only its name and location matter here.
    lib = tmp_path / "libtorch" / "lib"
    lib.mkdir(parents=True)
    compile_c(lib, "libtorch_cpu.so", "int stand_in_for_libtorch_cpu;\n", "-shared", "-fPIC")
    (tmp_path / "libtorch" / version_file).write_text(text)
    program = compile_c(tmp_path, "open_by_path", OPEN_BY_PATH_MAIN, "-ldl")
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    proc = run([program, lib / "libtorch_cpu.so"], shim=shim, KFORGE_HOOK_DIR=hooks)
    assert (proc.returncode, proc.stdout) == (0, "loaded\n")
    lines = kforge_lines(proc)
    assert len(lines) == 1 and expected in lines[0] and lines[0].endswith(
        "; running without kforge"), lines


STAND_IN_TORCH_WITH_NESTED_LOAD = r"""
// A stand-in libtorch_cpu.so whose constructor dlopen()s a library by path before it finishes, as
// a static initializer might: the shim must not load the hook from inside this load.
#include <dlfcn.h>
int stand_in_torch_ready = 0;
__attribute__((constructor)) static void initialize(void) {
  dlopen(NESTED_LIBRARY, RTLD_NOW);
  stand_in_torch_ready = 1;
}
"""


def test_the_hook_is_not_loaded_from_inside_torchs_own_load(shim, stand_in_hook, tmp_path):
    nested = compile_c(tmp_path, "libnested.so", "int nested;\n", "-shared", "-fPIC")
    lib = tmp_path / "libtorch" / "lib"
    lib.mkdir(parents=True)
    (tmp_path / "libtorch" / "build-version").write_text("2.11.0\n")
    torch = compile_c(lib, "libtorch_cpu.so", STAND_IN_TORCH_WITH_NESTED_LOAD, "-shared", "-fPIC",
                      f'-DNESTED_LIBRARY="{nested}"')
    program = compile_c(tmp_path, "open_by_path", OPEN_BY_PATH_MAIN, "-ldl")
    marker = tmp_path / "marker"
    proc = run([program, torch], shim=shim, KFORGE_HOOK=stand_in_hook, KFORGE_TEST_MARKER=marker)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "loaded\n", "")
    lines = marker_lines(marker)
    assert len(lines) == 1 and lines[0].endswith("libtorch_cpu=1 torch_C=0 ready=1"), lines
