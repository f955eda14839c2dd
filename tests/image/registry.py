"""A read-only Docker registry (HTTP API v2) on the loopback, serving one image from a
`docker save` archive under any repository name and tag: what the image tier's first run
pulls its stand-in vendor image from (this machine and its containers reach no public
registry, and no registry image is at hand). The Docker engine pulls from it as from any
registry: 127.0.0.0/8 is one of its default insecure registries, so plain HTTP is used.

The layers are served as they are in the archive (uncompressed tars, which the engine
detects), so their digests are their diff IDs. The config is the archive's with LABELS added:
an image the engine does not have yet (it pulls nothing of an image ID it has), so every
layer is downloaded and extracted as on a fresh host; the engine records this registry's
manifest digest.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import subprocess
import tarfile
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER_TYPE = "application/vnd.docker.image.rootfs.diff.tar.gzip"  # the engine sniffs the compression
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
    offset: int  # where its bytes start in the archive, or -1 when held in `data`
    size: int
    data: bytes = b""


def _member(archive: tarfile.TarFile, name: str) -> tarfile.TarInfo:
    """NAME's member, a symbolic link (docker save links a layer it holds twice) followed."""
    member = archive.getmember(name)
    while member.issym():
        name = posixpath.normpath(posixpath.join(posixpath.dirname(name), member.linkname))
        member = archive.getmember(name)
    return member


class ArchiveRegistry:
    def __init__(self, archive: Path, labels: dict[str, str]) -> None:
        self.archive, self.blobs = archive, {}
        with tarfile.open(archive) as saved:
            entry = json.load(saved.extractfile("manifest.json"))[0]
            config = json.load(saved.extractfile(_member(saved, entry["Config"])))
            config["config"]["Labels"] = {**(config["config"].get("Labels") or {}), **labels}
            config = json.dumps(config, separators=(",", ":")).encode()
            self.image_id = "sha256:" + hashlib.sha256(config).hexdigest()
            self.blobs[self.image_id] = Blob(-1, len(config), config)
            layers = []
            with archive.open("rb") as raw:
                for name in entry["Layers"]:
                    member = _member(saved, name)
                    digest = "sha256:" + self._hash(raw, member.offset_data, member.size)
                    self.blobs[digest] = Blob(member.offset_data, member.size)
                    layers.append({"mediaType": LAYER_TYPE, "size": member.size, "digest": digest})
        self.manifest = json.dumps({
            "schemaVersion": 2, "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "size": len(config), "digest": self.image_id},
            "layers": layers}, indent=1).encode()
        self.digest = "sha256:" + hashlib.sha256(self.manifest).hexdigest()
        self.server: ThreadingHTTPServer | None = None

    @staticmethod
    def _hash(raw, offset: int, size: int) -> str:
        digest = hashlib.sha256()
        raw.seek(offset)
        while size:
            chunk = raw.read(min(CHUNK, size))
            digest.update(chunk)
            size -= len(chunk)
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
                if blob.offset < 0:
                    return self.send(200, "application/octet-stream", blob.data, body, digest)
                self.send_response(200)
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(blob.size))
                self.send_header("Docker-Content-Digest", digest)
                self.end_headers()
                if not body:
                    return
                with registry.archive.open("rb") as raw:
                    raw.seek(blob.offset)
                    left = blob.size
                    while left:
                        chunk = raw.read(min(CHUNK, left))
                        self.wfile.write(chunk)
                        left -= len(chunk)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self.server.server_address[1]

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
