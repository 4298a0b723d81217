"""Which filesystem the store's directory is on. SQLite's WAL journal keeps its index in shared memory
(a `-shm` file every connection maps), which needs all connections on one host: "WAL does not work over a
network filesystem" (https://www.sqlite.org/wal.html, "Disadvantages"), and fcntl locks are unreliable on
several (https://www.sqlite.org/howtocorrupt.html, section 2.1). A database on one of NETWORK_FILESYSTEMS
therefore uses the rollback journal (`journal_mode=DELETE`, engine/store/store.py).

The type comes from the kernel's mount table (/proc/mounts: the mount with the longest mount point that
holds the path), which names the filesystem ("nfs4", "lustre", "cifs"); `os.statvfs` does not (it has no
f_type). Where there is no mount table (macOS, Windows) the type is unknown and WAL is kept.
"""
from __future__ import annotations

import os
import re

MOUNTS = "/proc/mounts"
# Filesystems whose files other machines share (NFS, Lustre, SMB/CIFS, CephFS, GlusterFS, GPFS/Spectrum Scale,
# BeeGFS, PanFS, AFS, 9p, and network FUSE mounts) or whose disk they share (GFS2, OCFS2).
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "lustre", "cifs", "smb", "smb3", "smbfs", "ceph", "glusterfs", "gpfs", "beegfs", "panfs",
    "pvfs2", "afs", "9p", "gfs2", "ocfs2", "fuse.sshfs", "fuse.s3fs", "fuse.gcsfuse", "fuse.glusterfs",
    "fuse.cephfs", "fuse.ceph-fuse", "fuse.juicefs", "fuse.rclone", "fuse.beegfs"})


def filesystem_type(path, mounts: str | None = None) -> str | None:
    """The type of the filesystem holding `path` (e.g. "ext4", "nfs4", "lustre"): that of the mount in the
    mount table `mounts` (default MOUNTS) with the longest mount point holding it, the later one when a
    point is mounted twice (an automount's NFS over its autofs entry). None when the table is unreadable."""
    try:
        with open(mounts or MOUNTS, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    found, kind = None, None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])   # "\040" is a space
        holds = target == point or target.startswith(point.rstrip("/") + "/")
        if holds and (found is None or len(point) >= len(found)):
            found, kind = point, fields[2]
    return kind


def on_network_filesystem(path, mounts: str | None = None) -> bool:
    """True when `path` is on a filesystem other machines share (NETWORK_FILESYSTEMS)."""
    return (filesystem_type(path, mounts) or "").lower() in NETWORK_FILESYSTEMS
