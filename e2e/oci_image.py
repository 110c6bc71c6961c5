"""Make the real node's images locally: a static busybox packed as an OCI image archive.

The e2e machine reaches no image registry, so the pause (sandbox) image and the test image are
made here from Debian's busybox-static and imported with `ctr -n k8s.io images import`:

    python3 e2e/oci_image.py OUT.tar NAME [--entrypoint JSON] [--cmd JSON] [--busybox PATH] [--add PATH]...

The image has /bin/busybox, a symlink in /bin for each of its applets, /etc/passwd and
/etc/group (root, nobody), /tmp and /www (for `httpd -h /www`), and each --add file (a static
binary such as our kubectl) in /bin. One uncompressed layer; every file time is 0, so the same
inputs always give the same image digest.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path

PASSWD = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
GROUP = b"root:x:0:\nnogroup:x:65534:\n"


def _add(tar: tarfile.TarFile, name: str, kind: bytes, data: bytes = b"", mode: int = 0o644, link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime, info.linkname = kind, mode, 0, link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def layer(busybox: Path, extra: list[Path]) -> bytes:
    """The root file system as an uncompressed tar."""
    applets = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True).stdout.split()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d, mode in (("bin", 0o755), ("etc", 0o755), ("tmp", 0o1777), ("www", 0o755), ("root", 0o700)):
            _add(tar, d, tarfile.DIRTYPE, mode=mode)
        _add(tar, "bin/busybox", tarfile.REGTYPE, busybox.read_bytes(), mode=0o755)
        for path in extra:
            _add(tar, f"bin/{path.name}", tarfile.REGTYPE, path.read_bytes(), mode=0o755)
        for applet in sorted(set(applets) - {"busybox"} - {p.name for p in extra}):
            if "/" not in applet:
                _add(tar, f"bin/{applet}", tarfile.SYMTYPE, link="busybox")
        _add(tar, "etc/passwd", tarfile.REGTYPE, PASSWD)
        _add(tar, "etc/group", tarfile.REGTYPE, GROUP)
        _add(tar, "www/index.html", tarfile.REGTYPE, b"rljob e2e busybox\n")
    return buf.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes, media_type: str) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def archive(name: str, rootfs: bytes, entrypoint: list[str] | None, cmd: list[str] | None) -> bytes:
    """An OCI image layout (oci-layout, index.json, blobs/) as one tar, the way ctr imports it."""
    blobs: dict[str, bytes] = {}
    diff_id = "sha256:" + hashlib.sha256(rootfs).hexdigest()
    config: dict[str, object] = {"Env": ["PATH=/bin"], "WorkingDir": "/"}
    if entrypoint:
        config["Entrypoint"] = entrypoint
    if cmd:
        config["Cmd"] = cmd
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": _blob(blobs, json.dumps(image_config).encode(), "application/vnd.oci.image.config.v1+json"),
        "layers": [_blob(blobs, rootfs, "application/vnd.oci.image.layer.v1.tar")],
    }
    desc = _blob(blobs, json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
    desc["annotations"] = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name}
    desc["platform"] = {"architecture": "amd64", "os": "linux"}
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [desc]}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "oci-layout", tarfile.REGTYPE, b'{"imageLayoutVersion":"1.0.0"}')
        _add(tar, "index.json", tarfile.REGTYPE, json.dumps(index).encode())
        _add(tar, "blobs", tarfile.DIRTYPE, mode=0o755)
        _add(tar, "blobs/sha256", tarfile.DIRTYPE, mode=0o755)
        for digest, data in blobs.items():
            _add(tar, "blobs/sha256/" + digest.removeprefix("sha256:"), tarfile.REGTYPE, data)
    return buf.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("name", help="image reference, e.g. rljob.e2e/busybox:local")
    ap.add_argument("--entrypoint", type=json.loads, default=None, help="JSON list")
    ap.add_argument("--cmd", type=json.loads, default=None, help="JSON list")
    ap.add_argument("--busybox", type=Path, default=Path("/bin/busybox"))
    ap.add_argument("--add", type=Path, action="append", default=[], help="a static binary for /bin")
    args = ap.parse_args()
    data = archive(args.name, layer(args.busybox, args.add), args.entrypoint, args.cmd)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(args.out)


if __name__ == "__main__":
    main()
