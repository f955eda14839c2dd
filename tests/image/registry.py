"""A read-only Docker registry (HTTP API v2) on the loopback, serving one image from a
`docker save` archive under any repository name and tag: what the image tier's first run
pulls its stand-in vendor image from (this machine and its containers reach no public
registry, and no registry image is at hand). The Docker engine pulls from it as from any
registry: 127.0.0.0/8 is one of its default insecure registries, so plain HTTP is used.

The engine pulls nothing it already has: no layer of an image ID it holds, no blob whose
digest it has pulled before. So the config is the archive's with LABELS added (an image ID
the engine has not seen), and each layer is served gzip-wrapped without compression (level
0, the archive's tar unchanged inside) under a gzip header time drawn per registry, so its
blob digest is new too: every layer is downloaded and extracted as on a fresh host, at the
cost of a copy. The engine records this registry's manifest digest.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import posixpath
import secrets
import shutil
import subprocess
import tarfile
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER_TYPE = "application/vnd.docker.image.rootfs.diff.tar.gzip"
CHUNK = 1 << 20


def saved_archive(image_id: str, cache: Path) -> Path:
    """IMAGE_ID as a `docker save` archive in CACHE, made once (keyed by the ID)."""
    archive = cache / f"{image_id.removeprefix('sha256:')[:16]}.tar"
    if not archive.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        staged = archive.with_suffix(".tar.tmp")
        with staged.open("wb") as out:
            subprocess.run(["docker", "save", image_id], stdout=out, check=True)
        staged.replace(archive)
    return archive


@dataclass(frozen=True)
class Blob:
    size: int
    path: Path | None = None  # a layer's file, or None for `data` (the config)
    data: bytes = b""


def _member(archive: tarfile.TarFile, name: str) -> tarfile.TarInfo:
    """NAME's member, a symbolic link (docker save links a layer it holds twice) followed."""
    member = archive.getmember(name)
    while member.issym():
        name = posixpath.normpath(posixpath.join(posixpath.dirname(name), member.linkname))
        member = archive.getmember(name)
    return member


class ArchiveRegistry:
    def __init__(self, archive: Path, labels: dict[str, str], workdir: Path) -> None:
        """The image of ARCHIVE with LABELS, its layers written to WORKDIR (about its size)."""
        self.blobs, self.asked = {}, []  # the paths asked for, in order
        stamp = secrets.randbits(31)
        with tarfile.open(archive) as saved:
            entry = json.load(saved.extractfile("manifest.json"))[0]
            config = json.load(saved.extractfile(_member(saved, entry["Config"])))
            config["config"]["Labels"] = {**(config["config"].get("Labels") or {}), **labels}
            config = json.dumps(config, separators=(",", ":")).encode()
            self.image_id = "sha256:" + hashlib.sha256(config).hexdigest()
            self.blobs[self.image_id] = Blob(len(config), data=config)
            layers = []
            workdir.mkdir(parents=True, exist_ok=True)
            for number, name in enumerate(entry["Layers"]):
                path = workdir / f"layer-{number}.tar.gz"
                with saved.extractfile(_member(saved, name)) as tar, path.open("wb") as out:
                    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=0, mtime=stamp) as wrapped:
                        shutil.copyfileobj(tar, wrapped, CHUNK)
                digest = "sha256:" + self._hash(path)
                self.blobs[digest] = Blob(path.stat().st_size, path)
                layers.append({"mediaType": LAYER_TYPE, "size": path.stat().st_size, "digest": digest})
        self.layers = len(layers)
        self.manifest = json.dumps({
            "schemaVersion": 2, "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "size": len(config), "digest": self.image_id},
            "layers": layers}, indent=1).encode()
        self.digest = "sha256:" + hashlib.sha256(self.manifest).hexdigest()
        self.server: ThreadingHTTPServer | None = None

    @staticmethod
    def _hash(path: Path) -> str:
        digest = hashlib.sha256()
        with path.open("rb") as raw:
            while chunk := raw.read(CHUNK):
                digest.update(chunk)
        return digest.hexdigest()

    def start(self) -> int:
        """Serves on a free loopback port, in a thread: the port."""
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # the test's output stays the launcher's
                pass

            def do_HEAD(self) -> None:
                self.answer(body=False)

            def do_GET(self) -> None:
                self.answer(body=True)

            def answer(self, body: bool) -> None:
                parts = self.path.split("?")[0].split("/")
                registry.asked.append(self.path)
                if parts[:2] == ["", "v2"] and len(parts) == 3:
                    return self.send(200, "application/json", b"{}", body)
                if len(parts) >= 5 and parts[-2] == "manifests":
                    return self.send(200, MANIFEST_TYPE, registry.manifest, body, registry.digest)
                if len(parts) >= 5 and parts[-2] == "blobs" and parts[-1] in registry.blobs:
                    return self.send_blob(parts[-1], body)
                self.send(404, "application/json", b'{"errors": [{"code": "NOT_FOUND"}]}', body)

            def send(self, status: int, kind: str, data: bytes, body: bool, digest: str = "") -> None:
                self.send_response(status)
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                if digest:
                    self.send_header("Docker-Content-Digest", digest)
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def send_blob(self, digest: str, body: bool) -> None:
                blob = registry.blobs[digest]
                if blob.path is None:
                    return self.send(200, "application/octet-stream", blob.data, body, digest)
                self.send_response(200)
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(blob.size))
                self.send_header("Docker-Content-Digest", digest)
                self.end_headers()
                if body:
                    with blob.path.open("rb") as raw:
                        shutil.copyfileobj(raw, self.wfile, CHUNK)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self.server.server_address[1]

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
