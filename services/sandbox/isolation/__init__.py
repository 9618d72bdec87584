"""Per-call isolation of python code, standard library only.

These modules run inside the zygote (`python -I -S`, no site-packages), so they import nothing
but the standard library and each other (relatively); the service imports them too.

- libc: the system calls (mount, unshare, pivot_root, prctl, capset) through ctypes
- rootfs: the allowlisted root each call runs in, built once in the zygote
- seccomp: the worker's system-call filter, a BPF program written by hand, and the pod profile
- cgroups: per-call memory and pids cgroups where the hierarchy is writable
"""
