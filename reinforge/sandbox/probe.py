"""What the machine offers the sandbox: a memory cgroup the runs may be put in, libseccomp, and
the messages that say what is missing and how to get it."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from .limits import _LIBSECCOMP

_cgroup_cache: dict[str, tuple[dict | None, str]] = {}


def memory_cgroup(mode: str = "auto") -> tuple[dict | None, str]:
    """Where this process can create the runs' memory cgroups: ({"parent", "version"}, "") or
    (None, why not). Probed once per mode."""
    if mode not in _cgroup_cache:
        _cgroup_cache[mode] = _find_cgroup(mode)
    return _cgroup_cache[mode]


def _find_cgroup(mode: str) -> tuple[dict | None, str]:
    if mode == "off":
        return None, "cgroup=off"
    if os.path.isabs(mode):
        candidates = [mode]
    else:
        candidates = _cgroup_candidates()
        if not candidates:
            return None, "no cgroup memory controller is mounted for this process"
    errors = []
    for parent in candidates:
        # A plain directory accepts the same mkdir and writes; only a cgroup file system fills a
        # new directory with cgroup.procs.
        if not os.path.isfile(os.path.join(parent, "cgroup.procs")):
            errors.append(f"{parent} is not a cgroup directory (it has no cgroup.procs): name a "
                          "directory of a cgroup file system, e.g. under /sys/fs/cgroup")
            continue
        version = 2 if os.path.exists(os.path.join(parent, "cgroup.controllers")) else 1
        if version == 2:
            try:
                enabled = Path(parent, "cgroup.subtree_control").read_text().split()
            except OSError as err:
                errors.append(f"{parent}: {err.strerror}")
                continue
            if "memory" not in enabled:
                errors.append(f"{parent}: the memory controller is not enabled for its children "
                              "(cgroup.subtree_control)")
                continue
        probe = os.path.join(parent, f"reinforge-probe-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            os.mkdir(probe)
        except OSError as err:
            errors.append(f"{parent}: cannot create a cgroup there ({err.strerror})")
            continue
        try:
            name = "memory.max" if version == 2 else "memory.limit_in_bytes"
            Path(probe, name).write_text(str(64 << 20))
            return {"parent": parent, "version": version}, ""
        except OSError as err:
            errors.append(f"{parent}: cannot set a memory limit ({err.strerror})")
        finally:
            try:
                os.rmdir(probe)
            except OSError:
                pass
    return None, "; ".join(errors)


def _cgroup_candidates() -> list[str]:
    try:
        own = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    v1_mount = v2_mount = None
    for line in mounts:
        pre, _, post = line.partition(" - ")
        parts, rest = pre.split(), post.split()
        if len(parts) < 5 or len(rest) < 3:
            continue
        if rest[0] == "cgroup2" and v2_mount is None:
            v2_mount = parts[4]
        elif rest[0] == "cgroup" and "memory" in rest[2].split(",") and v1_mount is None:
            v1_mount = parts[4]
    out = []
    for line in own:
        hid, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hid != "0" and "memory" in controllers.split(",") and v1_mount:
            out.append(os.path.join(v1_mount, path.lstrip("/")))
        elif hid == "0" and controllers == "" and v2_mount:
            out.append(os.path.join(v2_mount, path.lstrip("/")))
    return [p.rstrip("/") or "/" for p in out if os.path.isdir(p)]


def _libseccomp_error() -> str | None:
    import ctypes

    try:
        ctypes.CDLL(_LIBSECCOMP)
        return None
    except OSError as err:
        return (f"{_LIBSECCOMP} cannot be loaded ({err}); install it (Debian/Ubuntu: libseccomp2, "
                "Fedora: libseccomp)")


def _cgroup_message(error: str, asked: str) -> str:
    return (
        f"the code sandbox has no memory cgroup to enforce {asked}: {error or 'none found'}. A "
        "memory cgroup needs a cgroup directory this process may create children in: as root, "
        "cgroup v1's memory hierarchy or the v2 root; otherwise a delegated one, e.g. start the "
        "trainer with `systemd-run --user --scope -p Delegate=yes bash`, create a child cgroup "
        "for the trainer and one for the sandboxes with the memory controller enabled, and pass "
        "the latter as cgroup=<path> (or $REINFORGE_SANDBOX_CGROUP). Without a cgroup, leave "
        "total_memory_mb unset: rlimits and seccomp still bound a run to "
        "max_processes x memory_mb + tmpfs_mb (docs/sandbox.md)."
    )


def _unavailable_message(ns_error: str | None, seccomp_error: str | None) -> str:
    parts = ["the code sandbox cannot build full isolation on this machine:"]
    if ns_error:
        parts.append(
            f"  namespaces: {ns_error}. Unprivileged user namespaces may be disabled: on Debian "
            "`sysctl kernel.unprivileged_userns_clone=1`; on Ubuntu 23.10+ "
            "`sysctl kernel.apparmor_restrict_unprivileged_userns=0`; in a container, run it with "
            "user namespaces allowed (Docker: --security-opt seccomp=unconfined, or use Podman)."
        )
    if seccomp_error:
        parts.append(f"  seccomp: {seccomp_error}.")
    parts.append(
        "  To run anyway with weaker isolation (rlimits, timeouts, a private working directory; "
        "without namespaces the code can read and write your files), set the verifier's option "
        "isolation: best_effort (reward.verifiers[].options.isolation, for the code verifier and "
        "for the task verifier's scoring workers; Sandbox(isolation='best_effort')). See "
        "docs/sandbox.md."
    )
    return "\n".join(parts)
