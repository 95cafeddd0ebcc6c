"""The operating-system layers of the sandbox, applied by the sandbox process to itself (stdlib only: this file runs
inside a fresh `python -I -S` interpreter, imported by child.py as a top-level module).

Each layer is irreversible once applied and reports "on" or why it is not ("unavailable: ..."):
- rlimits: address space (memory), CPU seconds, file size 0, no core dumps, no new processes (RLIMIT_NPROC=0; the
  kernel does not apply it to root), no new file descriptors (RLIMIT_NOFILE = the ones already open).
- namespaces: new user, network and IPC namespaces (Linux, unprivileged): no network interface but a down loopback,
  no SysV IPC shared with the trainer, no capability outside the namespace (no ptrace of the trainer).
- landlock: no file-system access at all (read, write, execute, list, create), no TCP bind/connect, no signals or
  abstract unix sockets outside the sandbox (what the running kernel's Landlock ABI covers).
- seccomp: process creation, exec, sockets, ptrace, cross-process memory, signals, io_uring, bpf, perf and
  userfaultfd return EPERM (x86_64 and aarch64; x32 system calls are refused too).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys

try:  # imported now: nothing can be read from disk after the lock-down
    import resource
except ImportError:  # not a POSIX system
    resource = None

ON = "on"

# Linux constants (uapi headers)
_CLONE_NEWUSER, _CLONE_NEWNET, _CLONE_NEWIPC = 0x10000000, 0x40000000, 0x08000000
_PR_SET_NO_NEW_PRIVS, _PR_SET_PDEATHSIG, _PR_SET_SECCOMP = 38, 1, 22
_SECCOMP_MODE_FILTER = 2
_LANDLOCK_SYSCALLS = {"x86_64": (444, 446), "aarch64": (444, 446)}  # landlock_create_ruleset, _restrict_self
_LANDLOCK_FS_BITS_BY_ABI = {1: 13, 2: 14, 3: 15, 5: 16}  # number of access_fs bits each ABI handles
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_DENIED_SYSCALLS = {
    # fork vfork clone clone3 execve execveat socket socketpair ptrace process_vm_readv/writev kill tkill tgkill
    # io_uring_setup bpf perf_event_open userfaultfd
    "x86_64": (57, 58, 56, 435, 59, 322, 41, 53, 101, 310, 311, 62, 200, 234, 425, 321, 298, 323),
    "aarch64": (220, 435, 221, 281, 198, 199, 117, 270, 271, 129, 130, 131, 425, 280, 241, 282),
}
_X32_SYSCALL_BIT = 0x40000000


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _errno_text() -> str:
    return os.strerror(ctypes.get_errno())


def _lowest_free_fd() -> int:
    fd = 0
    while True:
        try:
            os.fstat(fd)
        except OSError:
            return fd
        fd += 1


def apply_rlimits(memory_bytes: int, cpu_seconds: int) -> str:
    if resource is None:
        return "unavailable: no resource module on this platform"
    limits = [
        (resource.RLIMIT_AS, memory_bytes),
        (resource.RLIMIT_CPU, cpu_seconds),
        (resource.RLIMIT_FSIZE, 0),
        (resource.RLIMIT_CORE, 0),
        (getattr(resource, "RLIMIT_NPROC", None), 0),
        (resource.RLIMIT_NOFILE, _lowest_free_fd()),  # every number below it is taken: no new descriptor
    ]
    for which, value in limits:
        if which is not None:
            resource.setrlimit(which, (value, value))
    return ON


def die_with_parent() -> None:
    """SIGKILL this process when the process that started it exits (Linux), so no orphan outlives the trainer."""
    if sys.platform.startswith("linux"):
        _libc().prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)


_NOT_LINUX = "unavailable: not Linux (macOS and Windows have no namespaces, Landlock or seccomp)"
_WHY_NO_NAMESPACES = {
    errno.EPERM: "unprivileged user namespaces are refused here (a container's seccomp profile such as Docker's "
    "default, sysctl kernel.unprivileged_userns_clone=0, or an AppArmor userns restriction)",
    errno.ENOSPC: "the user namespace limit is reached (sysctl user.max_user_namespaces is 0 or used up)",
    errno.EINVAL: "this kernel lacks user or network namespaces (CONFIG_USER_NS / CONFIG_NET_NS)",
    errno.ENOSYS: "this kernel has no unshare system call (or a filter hides it)",
}
_WHY_NO_LANDLOCK = {
    errno.ENOSYS: "this kernel has no Landlock (it needs Linux 5.13+ built with CONFIG_SECURITY_LANDLOCK)",
    errno.EOPNOTSUPP: "Landlock is built in but not enabled (add landlock to the kernel's lsm= boot parameter)",
    errno.EPERM: "a seccomp profile (a container's) refuses the Landlock system calls",
}


def _why(table: dict, what: str) -> str:
    code = ctypes.get_errno()
    return f"unavailable: {table.get(code, what)} ({os.strerror(code)})"


def unshare_namespaces() -> str:
    if not sys.platform.startswith("linux"):
        return _NOT_LINUX
    if _libc().unshare(_CLONE_NEWUSER | _CLONE_NEWNET | _CLONE_NEWIPC) != 0:
        return _why(_WHY_NO_NAMESPACES, "unshare(user, net, ipc) failed")
    return ON


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]  # fmt: skip


def apply_landlock() -> str:
    if not sys.platform.startswith("linux"):
        return _NOT_LINUX
    numbers = _LANDLOCK_SYSCALLS.get(os.uname().machine)
    if numbers is None:
        return "unavailable: slimrl applies Landlock on Linux x86_64 and aarch64 only"
    create, restrict = numbers
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(create, None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        return _why(_WHY_NO_LANDLOCK, "Landlock is not enabled in this kernel")
    fs_bits = max(bits for version, bits in _LANDLOCK_FS_BITS_BY_ABI.items() if version <= abi)
    attr = _RulesetAttr((1 << fs_bits) - 1, 0b11 if abi >= 4 else 0, 0b11 if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(create, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return f"unavailable: landlock_create_ruleset failed: {_errno_text()}"
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.syscall(restrict, ruleset, ctypes.c_uint32(0)) != 0:
        return f"unavailable: landlock_restrict_self failed: {_errno_text()}"
    os.close(ruleset)
    return f"{ON} (ABI {abi})"


def _bpf(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def _seccomp_program(arch: int, denied: tuple[int, ...], error: int = errno.EPERM) -> bytes:
    """A filter that makes each system call in `denied` (and every x32 one) fail with `error`."""
    ld_w_abs, jeq_k, jge_k, ret_k = 0x20, 0x15, 0x35, 0x06
    kill_process, errno_eperm, allow = 0x80000000, 0x00050000 | error, 0x7FFF0000
    program = [
        _bpf(ld_w_abs, 0, 0, 4),  # seccomp_data.arch
        _bpf(jeq_k, 1, 0, arch),
        _bpf(ret_k, 0, 0, kill_process),
        _bpf(ld_w_abs, 0, 0, 0),  # seccomp_data.nr
        _bpf(jge_k, len(denied) + 1, 0, _X32_SYSCALL_BIT),  # x32 numbers: to the EPERM return at the end
    ]
    for index, number in enumerate(denied):
        program.append(_bpf(jeq_k, len(denied) - index, 0, number))
    program += [_bpf(ret_k, 0, 0, allow), _bpf(ret_k, 0, 0, errno_eperm)]
    return b"".join(program)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def install_filter(program: bytes) -> str:
    """Install a seccomp `program` on this process (and, inherited, on every process it starts)."""
    libc = _libc()
    fprog = _SockFprog(len(program) // 8, program)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return f"unavailable: no_new_privs failed: {_errno_text()}"
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return f"unavailable: seccomp filter refused: {_errno_text()}"
    return ON


def apply_seccomp() -> str:
    if not sys.platform.startswith("linux"):
        return _NOT_LINUX
    machine = os.uname().machine
    if machine not in _DENIED_SYSCALLS:
        return "unavailable: slimrl's seccomp filter is written for Linux x86_64 and aarch64 only"
    return install_filter(_seccomp_program(_AUDIT_ARCH[machine], _DENIED_SYSCALLS[machine]))


def lock_down(memory_bytes: int, cpu_seconds: int, layers: dict) -> dict:
    """Apply every layer `layers` leaves on ({"namespaces": False} skips one); returns each layer's status."""
    die_with_parent()
    steps = (
        ("namespaces", unshare_namespaces),
        ("landlock", apply_landlock),
        ("rlimits", lambda: apply_rlimits(memory_bytes, cpu_seconds)),
        ("seccomp", apply_seccomp),  # last: the steps above need system calls it refuses
    )
    status = {}
    for name, step in steps:
        if not layers.get(name, True):
            status[name] = "unavailable: switched off by the caller"
            continue
        try:
            status[name] = step()
        except (OSError, ValueError, AttributeError) as exc:
            status[name] = f"unavailable: {type(exc).__name__}: {exc}"
    return status
