"""The program that runs INSIDE the sandbox, in front of the model-written code (its source is sent with
``python -c``; the codec's source is put in front of it).

Inside bubblewrap it first finishes the sandbox (``harden``: the inode bound of its tmpfs mounts, no capabilities,
the kernel limits, the whole seccomp filter), then reads one JSON line from stdin: ``{"mode", "code",
"entry_point"}``.

* ``mode="script"`` (``run_python``): run the code as ``__main__`` with the sandbox's stdout / stderr.
* ``mode="serve"`` (``run_tests``): define the code with stdout / stderr sent to /dev/null, answer one line
  ``{"ready": true, "load_error", "entry"}`` (or ``{"syntax_error": {...}}``), then answer each call request
  ``{"id", "args", "kwargs"}`` with ``{"id", "value"}`` or ``{"id", "error"}``, one line each.

Nothing here is trusted once the model's code has run: it shares this process and can rewrite any of it. That is
by design: the most a rewritten runner can do is send different reply lines, and a reply only ever claims a
return value, which the judge (another process) then checks.
"""


def _harden(tmpfs, seccomp_filter, set_limits):
    """Bound the inodes of the tmpfs mounts, give up every capability, set the kernel limits, load the whole
    seccomp filter (which refuses setting a limit, so ``set_limits`` runs before it).

    bubblewrap's ``--tmpfs`` sets a size only, and a tmpfs's size counts file contents, not its files, directories
    and links, each of which costs kernel memory: ``nr_inodes`` needs a remount, which needs ``CAP_SYS_ADMIN`` in
    the sandbox's user namespace (given by ``--cap-add``, only until here) and a ``mount`` that bubblewrap's filter
    lets through. Any failure ends the process before the solution is read."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def check(result, what):
        if result != 0:
            raise OSError(ctypes.get_errno(), f"sandbox set-up: {what} failed")

    ms_remount, ms_nosuid, ms_nodev = 32, 2, 4
    for path, size, inodes in tmpfs:
        options = f"size={size},nr_inodes={inodes}".encode()
        check(libc.mount(None, path.encode(), None, ms_remount | ms_nosuid | ms_nodev, options), f"remounting {path}")
    # No capability survives: none ambient, none permitted (and with no_new_privs, which bubblewrap sets, no exec
    # can grant one again).
    pr_cap_ambient, pr_cap_ambient_clear_all, pr_set_seccomp, seccomp_mode_filter = 47, 4, 22, 2
    check(libc.prctl(pr_cap_ambient, pr_cap_ambient_clear_all, 0, 0, 0), "clearing the ambient capabilities")

    class CapHeader(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    check(libc.capset(ctypes.byref(CapHeader(0x20080522, 0)), (ctypes.c_uint32 * 6)()), "dropping the capabilities")

    set_limits()

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    program = bytes.fromhex(seccomp_filter)
    prog = SockFprog(len(program) // 8, program)
    check(libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(prog), 0, 0), "loading the seccomp filter")


def _sandbox_main():
    import builtins
    import json
    import os
    import resource
    import sys
    import traceback

    cfg = json.loads(sys.argv[1])
    mib = 1024 * 1024
    limits = [
        (resource.RLIMIT_AS, cfg["memory_mb"] * mib),
        (resource.RLIMIT_NOFILE, cfg["open_files"]),
        (resource.RLIMIT_CORE, 0),
        # Counted per user of the host, not per process (the sandbox's charges reach the trainer's uid): none
        # for the sandbox. Real-time signals (non-real-time ones are refused at their sources by the seccomp
        # filter), POSIX message queue bytes (mq_open is refused too), locked memory.
        (resource.RLIMIT_SIGPENDING, 0),
        (resource.RLIMIT_MSGQUEUE, 0),
        (resource.RLIMIT_MEMLOCK, 0),
        # Python is the PID namespace's init, and the kernel does not deliver its own default-action signals
        # (SIGXCPU, even the hard limit's SIGKILL) to an init: a handler ends the program at the soft limit
        # instead. Best effort (the code can replace the handler); the host's wall-clock limit always holds.
        # No RLIMIT_FSIZE: the tmpfs sizes bound every writable file, and SIGXFSZ would be a pending signal.
        (resource.RLIMIT_CPU, (cfg["cpu_seconds"], cfg["cpu_seconds"] + 1)),
    ]

    def set_limits():
        for which, value in limits:
            resource.setrlimit(which, value if isinstance(value, tuple) else (value, value))

    if cfg.get("harden"):
        _harden(**cfg["harden"], set_limits=set_limits)
    else:
        set_limits()
    import signal

    signal.signal(signal.SIGXCPU, lambda signum, frame: os._exit(128 + signum))

    request = json.loads(sys.stdin.buffer.readline())
    mode, source, entry_point = request["mode"], request["code"], request.get("entry_point")

    def describe(err):
        text = "".join(traceback.format_exception_only(type(err), err)).strip().splitlines()
        text = text[-1] if text else type(err).__name__
        return text if len(text) <= 300 else text[:297] + "..."

    def syntax_info(err):
        return {
            "line": getattr(err, "lineno", None),
            "offset": getattr(err, "offset", None),
            "message": getattr(err, "msg", None) or str(err),
            "text": (getattr(err, "text", None) or "").rstrip("\n"),
        }

    if mode == "script":
        sys.stdin.close()
        try:
            code = compile(source, "main.py", "exec", dont_inherit=True)
        except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError) as err:
            info = syntax_info(err)
            sys.stderr.write(f"{type(err).__name__}: {info['message']} (main.py, line {info['line']})\n")
            sys.stderr.write("__trl_collm_sandbox_syntax_error__ " + json.dumps(info) + "\n")
            sys.stderr.flush()
            os._exit(3)
        module = type(sys)("__main__")
        module.__file__ = "/tmp/main.py"
        sys.modules["__main__"] = module
        sys.argv = ["main.py"]
        return code, module.__dict__

    # serve: private copies of the pipes; the code's own prints go to /dev/null (they can neither flood the
    # channel nor be mistaken for replies by accident).
    fin = os.fdopen(os.dup(0), "rb", buffering=0)
    out_fd = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    write, dumps = os.write, json.dumps

    def send(message):
        data = (dumps(message, allow_nan=False, separators=(",", ":")) + "\n").encode("utf-8", "replace")
        while data:
            data = data[write(out_fd, data) :]

    try:
        code = compile(source, "solution.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError) as err:
        send({"syntax_error": syntax_info(err)})
        return None, None
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    load_error = None
    try:
        exec(code, namespace)  # noqa: S102
    except BaseException as err:  # noqa: BLE001 - anything the code raises is feedback, not our failure
        load_error = describe(err)
    function = namespace.get(entry_point) if entry_point else None
    send({"ready": True, "load_error": load_error, "entry": callable(function)})
    while True:
        line = fin.readline()
        if not line:
            return None, None
        call = json.loads(line)
        reply = {"id": call["id"]}
        try:
            if not callable(function):
                raise NameError(f"name {entry_point!r} is not defined")  # noqa: TRY004 - as Python says it
            args = decode(call["args"])  # noqa: F821 - the codec's source is put in front of this file
            kwargs = decode(call["kwargs"])  # noqa: F821
            result = function(*args, **kwargs)
            try:
                reply["value"] = encode(result)  # noqa: F821
            except Unencodable as err:  # noqa: F821
                reply["error"] = (
                    f"TypeError: {entry_point} returned {err}, not plain data (numbers, strings, "
                    "lists, tuples, sets, dicts of exact built-in types)"
                )
        except BaseException as err:  # noqa: BLE001
            reply["error"] = describe(err)
        try:
            send(reply)
        except (ValueError, TypeError, RecursionError, OverflowError) as err:
            send({"id": call["id"], "error": describe(err)})


_sandbox_code, _sandbox_namespace = _sandbox_main()
del _sandbox_main
if _sandbox_code is not None:
    exec(_sandbox_code, _sandbox_namespace)  # noqa: S102
