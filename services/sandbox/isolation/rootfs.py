"""The allowlisted root every python call runs in.

Nothing of the host is visible but what the interpreter needs, bound read-only:
- the directories on the interpreter's sys.path (its standard library and lib-dynload) and the
  configured import paths, with a site-packages inside them covered by an empty tmpfs;
- the interpreter executable, its program interpreter (ld.so) and every shared library it loads
  (found by loading every extension module once in a throwaway child and reading its memory map),
  with the symlinks that lead to them (/lib -> usr/lib, libffi.so.8 -> libffi.so.8.1.2);
- a minimal /etc written for the sandbox (passwd, group, hosts, nsswitch.conf);
- /dev/null, /dev/zero, /dev/urandom;
and per call a private, size-capped, writable /tmp and a private read-only /proc (when the
kernel allows a fresh proc mount: container runtimes that mask /proc paths do not, and then the
call has no /proc at all). No socket, no /run, no /var, no home, no project or data directory.

The zygote builds this root once, as a template in its own mount namespace (over /tmp, which it
then no longer sees); each worker only mounts its /tmp and /proc into its copy of the template
and pivots into it, which costs well under a millisecond.
"""

from __future__ import annotations

import os
import struct
import sys
from dataclasses import dataclass, field

from . import libc

STAGE = "/tmp"  # the template's place in the zygote's own mount namespace
SANDBOX_UID = SANDBOX_GID = 1000  # who python code is inside its user namespace
DEVICES = ("null", "zero", "urandom")
DEVICE_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"}
ETC = {
    "passwd": f"root:x:0:0:root:/nonexistent:/sbin/nologin\nsandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:sandbox:/tmp:/sbin/nologin\n"
              "nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n",
    "group": f"root:x:0:\nsandbox:x:{SANDBOX_GID}:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1 localhost\n::1 localhost\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
}
HOST_ONLY = ("/etc/", "/dev/", "/proc/", "/sys/", "/run/", "/var/", "/tmp/")  # never bound, whatever maps say
MAX_EXTENSION_MODULES = 5000


@dataclass
class Allowlist:
    """What of the host a python call sees (all read-only)."""

    dirs: list[str] = field(default_factory=list)  # bound with everything below them
    files: list[str] = field(default_factory=list)  # bound one by one
    links: list[str] = field(default_factory=list)  # paths whose symlink chain is recreated
    hidden: list[str] = field(default_factory=list)  # directories inside `dirs` covered by an empty tmpfs

    def as_dict(self) -> dict:
        return self.__dict__


# --- what the interpreter needs ------------------------------------------------------------


def discover(import_paths: list[str]) -> Allowlist:
    """The allowlist for this interpreter and these import paths (runs a throwaway child)."""
    dirs = _outermost([os.path.realpath(p) for p in [*sys.path, *import_paths] if p and os.path.isdir(p)])
    hidden = [os.path.join(d, name) for d in dirs for name in ("site-packages", "dist-packages")
              if os.path.isdir(os.path.join(d, name)) and os.path.realpath(os.path.join(d, name)) not in dirs]
    executable = os.path.realpath(sys.executable)
    files = sorted({p for p in [executable, *_loaded_files(dirs)] if not _under_any(p, dirs)})
    top_level = [f"/{n}" for n in sorted(os.listdir("/")) if n.startswith("lib") and os.path.islink(f"/{n}")]
    links = [_program_interpreter(executable), *top_level, *_aliases(files)]
    return Allowlist(dirs, files, [p for p in links if p], hidden)


def _aliases(files: list[str]) -> list[str]:
    """Symlinks beside the files that lead to them: the names the loader asks for
    (libffi.so.8 -> libffi.so.8.1.2)."""
    wanted = set(files)
    found = []
    for directory in sorted({os.path.dirname(f) for f in files}):
        with os.scandir(directory) as entries:
            found += [e.path for e in entries if e.is_symlink() and os.path.realpath(e.path) in wanted]
    return sorted(found)


def _outermost(paths: list[str]) -> list[str]:
    kept: list[str] = []
    for path in sorted(set(paths), key=len):
        if not _under_any(path, kept):
            kept.append(path)
    return kept


def _under_any(path: str, dirs: list[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def _loaded_files(dirs: list[str]) -> list[str]:
    """Files mapped by a child that loaded every extension module under dirs (so their shared
    libraries, resolved by the real loader, are mapped too)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            _load_everything(dirs)
            with open("/proc/self/maps") as maps:
                paths = {line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) == 6}
            found = [p for p in paths if p.startswith("/") and not p.startswith(HOST_ONLY) and os.path.isfile(p)]
            os.write(write_end, "\n".join(found).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 1 << 16):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    if status != 0:  # it crashed loading something: the list would be incomplete
        raise OSError(f"finding the interpreter's shared libraries failed (wait status {status})")
    return [p for p in b"".join(chunks).decode().split("\n") if p]


def _load_everything(dirs: list[str]) -> None:
    import ctypes
    import pwd

    pwd.getpwuid(os.getuid())  # loads the name-service modules libc uses for /etc/passwd
    loaded = 0
    for top in dirs:
        for root, _subdirs, names in os.walk(top):
            for name in names:
                if name.endswith(".so") and loaded < MAX_EXTENSION_MODULES:
                    loaded += 1
                    try:
                        ctypes.CDLL(os.path.join(root, name))
                    except OSError:  # needs a library this machine lacks: unusable anyway
                        pass


def _program_interpreter(executable: str) -> str:
    """The ELF program interpreter (ld.so) path the kernel starts the executable with."""
    with open(executable, "rb") as f:
        header = f.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2:
            return ""
        phoff, = struct.unpack_from("<Q", header, 32)
        phentsize, phnum = struct.unpack_from("<HH", header, 54)
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            p_type, _flags, p_offset, _vaddr, _paddr, p_filesz = struct.unpack("<IIQQQQ", f.read(40))
            if p_type == 3:  # PT_INTERP
                f.seek(p_offset)
                return f.read(p_filesz).rstrip(b"\0").decode()
    return ""


# --- the template, once per zygote ---------------------------------------------------------


def build_template(allow: Allowlist) -> None:
    """Builds the read-only root at STAGE in this (the zygote's own) mount namespace."""
    libc.mount(None, "/", None, libc.MS_REC | libc.MS_PRIVATE)
    libc.mount("tmpfs", STAGE, "tmpfs", libc.MS_NOSUID | libc.MS_NODEV, "size=4m,nr_inodes=16384,mode=0755")
    for name in ("tmp", "proc", "dev", "etc"):
        os.mkdir(_inside(f"/{name}"), 0o755)
    for name, text in ETC.items():
        with open(_inside(f"/etc/{name}"), "w") as f:
            f.write(text)
        os.chmod(_inside(f"/etc/{name}"), 0o644)
    for path in allow.links:
        _replicate(path)
    for path in allow.files:
        _bind(path)
    for path in allow.dirs:
        _bind(path)
    for path in allow.hidden:
        libc.mount("tmpfs", _inside(path), "tmpfs", libc.MS_RDONLY | libc.MS_NOSUID | libc.MS_NODEV | libc.MS_NOEXEC,
                   "size=4k,nr_inodes=16,mode=0555")
    for name in DEVICES:
        _bind(f"/dev/{name}")
    for name, target in DEVICE_LINKS.items():
        os.symlink(target, _inside(f"/dev/{name}"))
    _make_read_only()


def _inside(path: str) -> str:
    return STAGE + path


def _replicate(path: str, depth: int = 0) -> str:
    """Recreates path's directories and symlinks in the template as on the host; returns the
    real path it leads to."""
    if depth > 40:
        raise OSError(f"too many symlinks under {path}")
    parts = [p for p in path.split("/") if p]
    current = "/"
    for i, part in enumerate(parts):
        host = os.path.join(current, part)
        if os.path.islink(host):
            target = os.readlink(host)
            if not os.path.lexists(_inside(host)):
                os.symlink(target, _inside(host))
            rest = "/".join(parts[i + 1:])
            resolved = os.path.normpath(os.path.join(current, target))
            return _replicate(os.path.join(resolved, rest) if rest else resolved, depth + 1)
        if i < len(parts) - 1 and not os.path.isdir(_inside(host)):
            os.mkdir(_inside(host), 0o755)
        current = host
    return current


def _bind(path: str) -> None:
    real = _replicate(path)
    target = _inside(real)
    if os.path.isdir(real):
        os.makedirs(target, 0o755, exist_ok=True)
    elif not os.path.exists(target):
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o644))
    libc.mount(real, target, None, libc.MS_BIND | libc.MS_REC)


def _make_read_only() -> None:
    """Remounts every mount of the template read-only, nosuid, and nodev (but the devices),
    repeating the flags each already has (a user namespace may not clear locked ones). The
    template is the tmpfs last mounted at STAGE and the mounts below it: host mounts under
    STAGE (say a chroot's /proc under /tmp) lie shadowed beneath it and are left alone."""
    mounts = _mountinfo()
    stage = [mount_id for mount_id, _, point, _ in mounts if point == STAGE][-1]  # ours is the newest
    template = {stage}
    for mount_id, parent, point, flags in mounts:  # mountinfo lists a parent before its children
        if mount_id != stage and parent not in template:
            continue
        template.add(mount_id)
        wanted = flags | libc.MS_RDONLY | libc.MS_NOSUID
        if not point.startswith(_inside("/dev/")):
            wanted |= libc.MS_NODEV
        libc.mount(None, point, None, libc.MS_REMOUNT | libc.MS_BIND | wanted)


def _mountinfo() -> list[tuple[int, int, str, int]]:
    """(mount id, parent id, mount point, per-mount flags) of every mount in this namespace."""
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # \040 for spaces
            flags = 0
            for option in fields[5].split(","):
                flags |= libc.MOUNT_FLAGS.get(option, 0)
            mounts.append((int(fields[0]), int(fields[1]), point, flags))
    return mounts


# --- per worker ----------------------------------------------------------------------------


def enter(tmp_mb: int, tmp_inodes: int) -> bool:
    """Mounts this call's /tmp and /proc into its copy of the template and makes it the root.
    Returns whether /proc could be mounted. Runs as pid 1 of the call's pid namespace."""
    libc.mount("tmpfs", _inside("/tmp"), "tmpfs", libc.MS_NOSUID | libc.MS_NODEV | libc.MS_NOEXEC,
               f"size={tmp_mb}m,nr_inodes={tmp_inodes},mode=0700,uid={SANDBOX_UID},gid={SANDBOX_GID}")
    try:
        libc.mount("proc", _inside("/proc"), "proc", libc.MS_RDONLY | libc.MS_NOSUID | libc.MS_NODEV | libc.MS_NOEXEC)
        has_proc = True
    except PermissionError:  # the runtime masks parts of its /proc, so the kernel refuses a fresh one
        has_proc = False
    # The template came from the zygote's namespace, so here it is locked to its place and
    # pivot_root refuses it; a recursive bind of it onto itself is this namespace's own mount.
    libc.mount(STAGE, STAGE, None, libc.MS_BIND | libc.MS_REC)
    os.chdir(STAGE)
    libc.pivot_root(".", ".")  # the old root now sits on top of the new one ...
    libc.umount(".", libc.MNT_DETACH)  # ... and goes, with every host mount under it
    os.chdir("/")
    return has_proc


def leave_template() -> None:
    """Unmounts the template (when workers will not be isolated after all)."""
    libc.umount(STAGE, libc.MNT_DETACH)
