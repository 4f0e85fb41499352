"""`python -m memgate._forkserver [--inductor] PARENT_PID`: the warm Python that a memgate process forks its Python
probes from.

memgate starts one per Python and environment (MEMGATE_GC_FREEZE aside: that is the probe's own, see
memgate._probe.freeze_what_is_alive), on the first Python probe it runs, with a socket as file descriptor 3. It
imports torch and memgate's extension once; each probe is then a fork of it (os.fork) that runs what `python -m memgate
--memgate-rank ...` would (memgate._probe.main), so that a probe pays no import of torch. After a probe has ended, the
server also imports the installed packages that probe imported (timm, transformers, peft: seconds each), never the
user's own modules: the next probe of the same models starts with them imported. Before it forks a probe, it imports the
installed packages that the model's own code imports as it is built (its file's imports outside any function and those
in the entry's and the loss's callable, read, not run; memgate sends them as `file:callable`), so that the first probe,
and every rank of a distributed one, finds them imported too, instead of each importing them itself. A probe is still a
process of its own: its memory, its allocator and its counting start fresh, as they did when it was started directly.

What the server has imported is frozen for Python's collector (gc.freeze, after a collection): memgate's protocol
collects several times per probe (after each build, before each base), and each full collection walked every object of
torch, timm, PEFT and transformers (about 2 s of a ViT-B estimate's 2.5 s), writing to the pages the probe shares with
the server. Frozen objects are alive and stay so: the probe's own objects are collected as before, and its bytes are
the same.

With --inductor (the probes of a model trained as torch.compile(module) compiles it), the server also runs, before it
is ready, the checks Inductor makes once per process of which vector ISAs the CPU can build and load (a compiler run
and a Python importing torch per ISA: 11 s here), so that its probes find them made.

The protocol, one JSON object per line:
  server -> memgate: {"ready": pid}, or {"error": why} and the server exits (memgate then starts its probes directly)
  memgate -> server: {"spawn": {"argv": [...], "env": [...], "cwd": ..., "log": ..., "scan": ["file:callable"]}}
  server -> memgate: {"pid": pid}, or {"error": why} (memgate starts that probe directly); the probe is then in a
                     process group of its own (its pid), which memgate ends with it
  server -> memgate: {"exit": pid, "status": wait status}, once a probe has ended (it stays a zombie until reaped)
  memgate -> server: {"reap": pid}
The server ends when memgate closes its socket or ends (PR_SET_PDEATHSIG); its probes end with it in turn.
"""
import ctypes
import gc
import json
import os
import selectors
import signal
import socket
import sys
import sysconfig
import time

from memgate._probe import freeze_what_is_alive

_PR_SET_PDEATHSIG = 1


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _cuda_touched() -> bool:
    """Whether CUDA's driver is loaded here (a package asked for the device count, say): a process forked after that
    cannot use CUDA, so none is forked."""
    try:
        import torch

        if torch.cuda.is_initialized():
            return True
        with open("/proc/self/maps") as f:
            return any("libcuda.so" in line for line in f)
    except (OSError, ImportError):
        return True


class Server:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buffer = b""
        self.children = {}  # pid -> the read end of its pipe of imported packages; -1 once its end is reported
        self.preloaded = set()
        self.threads = 0
        self.forkable = True
        self.cwd = os.getcwd()  # sys.path[0] of `python -m`
        paths = sysconfig.get_paths()
        installed = {os.path.realpath(paths[k]) + os.sep for k in ("purelib", "platlib") if k in paths}
        # A team's own packages on PYTHONPATH count as installed ones: imported here, outside any probe (a module that
        # makes a tensor as it is imported makes it on the CPU, as a training script's import does, not on the Meta
        # device of a build that imports it), each probe forked with them as they were imported. The working folder
        # itself does not (its modules are the user's own, which the probe imports).
        for folder in os.environ.get("PYTHONPATH", "").split(os.pathsep):
            if folder and os.path.isdir(folder) and os.path.realpath(folder) != os.path.realpath(self.cwd):
                installed.add(os.path.realpath(folder) + os.sep)
        self.installed = tuple(installed)

    def send(self, message: dict) -> None:
        self.sock.sendall((json.dumps(message) + "\n").encode())

    def spawn(self, request: dict) -> dict:
        argv = request["argv"]
        if argv[1:3] != ["-m", "memgate"]:
            return {"error": f"not a memgate probe: {argv[:3]}"}
        if request.get("scan") and self.forkable:
            self.preload(self.imports_of(request["scan"], request.get("cwd", "")))
        if not self.forkable:
            return {"error": "a package it imported started a thread or loaded CUDA's driver: it no longer forks"}
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            self.child(argv, request, write_end)  # never returns
        os.close(write_end)
        # A process group of its own, as memgate starts a probe directly: memgate ends the group (the probe and what
        # the model's code started). Set here too, before the answer, so that memgate finds it set.
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass  # it has set it itself, or has already ended
        self.children[pid] = read_end
        return {"pid": pid}

    def child(self, argv: list, request: dict, packages: int) -> None:
        code = 1
        try:
            try:
                os.setpgid(0, 0)
            except OSError:
                pass
            self.sock.close()
            for fd in self.children.values():
                if fd >= 0:
                    os.close(fd)
            log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.close(log)
            os.chdir(request["cwd"])
            if sys.path and sys.path[0] == self.cwd:
                sys.path[0] = request["cwd"]  # as `python -m memgate` started there would have it
            os.environ.clear()
            os.environ.update(kv.split("=", 1) for kv in request["env"] if "=" in kv)
            # As a process started directly (launch/children.cpp): Python's SIGINT handler, SIGTERM and SIGHUP at
            # their defaults, none blocked; the others as Python's start leaves them in both (SIGPIPE ignored).
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for s in (signal.SIGTERM, signal.SIGHUP):
                signal.signal(s, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            # The modules the server had imported: what the probe imports beyond them is what the server imports
            # next (reading each module's path, thousands of torch's, took 0.05 s per probe).
            before = set(sys.modules)
            from memgate import _probe

            # sys.argv[0] as `python -m memgate` has it: the package's __main__.py.
            sys.argv = [os.path.join(os.path.dirname(_probe.__file__), "__main__.py")] + argv[3:]
            try:
                code = _probe.main()
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            with os.fdopen(packages, "w") as f:
                f.write(json.dumps(self.packages_of({name: module for name, module in sys.modules.items()
                                                     if name not in before})))
            import atexit

            atexit._run_exitfuncs()
        except BaseException:  # noqa: BLE001: as an uncaught exception ends a Python process: its traceback, 1
            import traceback

            traceback.print_exc()
            code = 1
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code if isinstance(code, int) else 1)

    def packages_of(self, modules: dict) -> list:
        """The installed top-level packages among `modules` (from site-packages: never the user's own files)."""
        names = set()
        for name, module in list(modules.items()):
            top = name.partition(".")[0]
            if top in names or top == "memgate" or top in self.preloaded:
                continue
            where = getattr(module, "__file__", None)
            if where and os.path.realpath(where).startswith(self.installed):
                names.add(top)
        return sorted(names)

    def imports_of(self, entries: list, cwd: str) -> list:
        """The installed top-level packages that a model's own code imports as its probe builds it: `entries` are
        `file:callable` (its entry's, its loss's), and the imports are those the file runs as it is imported (outside
        any function) and those in the callable's body, read, not run. Each is a name whose module is found in
        site-packages and not beside the file (its folder comes first on the probe's sys.path) or in `cwd` (its
        sys.path[0]), where a module of the user's own of that name would be the one imported."""
        import ast
        import importlib.util

        def imports(node, into: list, in_functions: bool) -> None:
            if isinstance(node, ast.Import):
                into.extend(alias.name.partition(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                into.append(node.module.partition(".")[0])
            for child in ast.iter_child_nodes(node):
                if in_functions or not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    imports(child, into, in_functions)

        names = set()
        for entry in entries:
            path, _, callable_name = entry.rpartition(":")
            try:
                with open(path, "rb") as f:
                    tree = ast.parse(f.read(), filename=path)
            except (OSError, SyntaxError, ValueError):
                continue  # the probe reports it
            found = []
            imports(tree, found, in_functions=False)
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == callable_name:
                    imports(node, found, in_functions=True)
            folders = [os.path.dirname(os.path.abspath(path)), cwd]
            for top in found:
                if top in names or top in self.preloaded or top == "memgate" or top in sys.modules:
                    continue
                if any(folder and (os.path.exists(os.path.join(folder, top + ".py")) or
                                   os.path.isdir(os.path.join(folder, top))) for folder in folders):
                    continue
                try:
                    spec = importlib.util.find_spec(top)
                except (ImportError, ValueError):
                    continue
                origin = spec.origin if spec is not None else None
                if origin and os.path.realpath(origin).startswith(self.installed):
                    names.add(top)
        return sorted(names)

    def preload(self, names: list) -> None:
        import contextlib
        import importlib

        gc.disable()  # the imports' objects are frozen below: each automatic collection of them walked them in vain
        for name in names:
            if name in self.preloaded:
                continue
            self.preloaded.add(name)
            try:
                with contextlib.redirect_stdout(sys.stderr):
                    importlib.import_module(name)
            except BaseException:  # noqa: BLE001: a package that does not import here is imported by the probe
                pass
        # fork() copies one thread: a package that started one (a pool, a watcher) could leave its locks held
        # in every probe; and a process forked after CUDA's driver was loaded cannot use CUDA. Then no more forks:
        # memgate starts the probes directly.
        if _threads() > self.threads or _cuda_touched():
            self.forkable = False
        gc.enable()
        freeze_what_is_alive()

    def reap_exited(self) -> None:
        for pid, read_end in list(self.children.items()):
            if read_end < 0:
                continue
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is None:
                continue
            if info.si_code == os.CLD_EXITED:
                status = (info.si_status & 0xFF) << 8
            else:
                status = info.si_status | (0x80 if info.si_code == os.CLD_DUMPED else 0)
            self.send({"exit": pid, "status": status})
            try:
                data = os.read(read_end, 1 << 20)
                names = json.loads(data) if data else []
            except (OSError, ValueError):
                names = []
            os.close(read_end)
            self.children[pid] = -1
            if names and self.forkable:
                self.preload(names)

    def reap(self, pid: int) -> None:
        if pid in self.children:
            os.waitpid(pid, 0)
            del self.children[pid]

    def serve(self) -> int:
        selector = selectors.DefaultSelector()
        selector.register(self.sock, selectors.EVENT_READ)
        while True:
            ready = selector.select(timeout=0.02)
            self.reap_exited()
            if not ready:
                continue
            data = self.sock.recv(1 << 16)
            if not data:
                return 0
            self.buffer += data
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                message = json.loads(line)
                if "spawn" in message:
                    try:
                        self.send(self.spawn(message["spawn"]))
                    except OSError as e:
                        self.send({"error": f"cannot fork: {e}"})
                elif "reap" in message:
                    self.reap(message["reap"])


def _warm_inductor() -> None:
    """Inductor's per-process checks of the CPU's vector ISAs, made here so that each forked probe inherits them (what
    the probe would find; a check that fails here is made again by the probe).

    Each check compiles a test library and loads it in a Python that imports torch; Inductor makes them one after
    another. Here the ISAs the CPU names are checked at once, each in a thread of its own (each waits on its
    subprocesses; a check's own result is cached on its ISA, and its compile is locked per library), and Inductor's
    list then reads their results: the same list, in 5.2 s instead of 8.3 s on this project's 2-core machine."""
    import concurrent.futures
    import contextlib

    try:
        with contextlib.redirect_stdout(sys.stderr):
            from torch._inductor import cpu_vec_isa

            try:
                flags = cpu_vec_isa.x86_isa_checker()
                named = [isa for isa in cpu_vec_isa.supported_vec_isa_list
                         if all(flag in flags for flag in str(isa).split())]
            except Exception:  # noqa: BLE001: not x86, or another Inductor: its own list makes the checks in turn
                named = []
            if len(named) > 1:
                before = _threads()
                with concurrent.futures.ThreadPoolExecutor(max_workers=len(named)) as pool:
                    list(pool.map(bool, named))
                # Joined, a thread may still be listed for a moment as it exits: a fork needs it gone.
                deadline = time.monotonic() + 5
                while _threads() > before and time.monotonic() < deadline:
                    time.sleep(0.005)
            cpu_vec_isa.valid_vec_isa_list()
    except BaseException:  # noqa: BLE001: the probe compiles as it would have, making the checks itself
        pass


def main() -> int:
    sock = socket.socket(fileno=3)
    # Ends with the memgate that started it, however that ends; one already gone ends this at once.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if len(sys.argv) < 2 or os.getppid() != int(sys.argv[-1]):
        return 3
    # Ctrl-C reaches the whole process group: memgate ends its probes itself, and then closes this.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    server = Server(sock)
    # No automatic collection while torch (and later each package) is imported: what the imports leave is collected
    # once and frozen (freeze_what_is_alive), where each collection during them walked every object imported so far
    # (0.12 of the 1.5 CPU-s that importing torch takes here, 0.6 of torch's, timm's and PEFT's 4.3). Enabled again
    # before any probe is forked.
    gc.disable()
    try:
        from memgate import check_torch

        check_torch()
        import torch  # noqa: F401

        from memgate import _core  # noqa: F401
    except BaseException as e:  # noqa: BLE001: memgate then starts its probes directly, with their own errors
        server.send({"error": f"{type(e).__name__}: {e}"})
        return 3
    if _cuda_touched():
        server.send({"error": "CUDA's driver was loaded by the imports: a forked process could not use it"})
        return 3
    server.threads = _threads()
    if "--inductor" in sys.argv[1:-1]:
        _warm_inductor()
        if _threads() > server.threads or _cuda_touched():
            server.send({"error": "Inductor's checks left a thread or loaded CUDA's driver: a fork could not use it"})
            return 3
    gc.enable()
    freeze_what_is_alive()
    server.send({"ready": os.getpid()})
    return server.serve()


if __name__ == "__main__":
    sys.exit(main())
