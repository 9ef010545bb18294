"""A stand-in for the Hugging Face Hub, enough for the real `hf download` (HF_ENDPOINT=its url): one model
repository served from a local folder, every file request counted (`GET /_downloads` returns the counts as
JSON). `stall` names a file whose download sends half its bytes and then waits until `release` is set (a
download to kill midway). On 127.0.0.1 in tests; tests/e2e runs it in a pod:

    python3 hub_standin.py REPO FOLDER PORT      # serves on 0.0.0.0:PORT until killed
"""
import hashlib
import json
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class HubStandIn:
    def __init__(self, repo: str, folder: Path, host: str = "127.0.0.1", port: int = 0):
        self.repo, self.folder = repo, folder
        self.downloads: Counter[str] = Counter()   # GETs of each file's bytes
        self.stall: str | None = None
        self.stalled = threading.Event()
        self.release = threading.Event()
        self.server = ThreadingHTTPServer((host, port), self._handler())
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "HubStandIn":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def files(self) -> dict[str, Path]:
        return {str(p.relative_to(self.folder)): p for p in sorted(self.folder.rglob("*")) if p.is_file()}

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _json(self, body) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _file(self, head: bool) -> None:
                path = unquote(urlparse(self.path).path)
                prefix = f"/{hub.repo}/resolve/"
                name = path[len(prefix):].split("/", 1)[1] if path.startswith(prefix) else None
                file = hub.files().get(name) if name else None
                if file is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = file.read_bytes()
                self.send_response(200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if head:
                    return
                hub.downloads[name] += 1
                if name == hub.stall:
                    self.wfile.write(data[:len(data) // 2])
                    self.wfile.flush()
                    hub.stalled.set()
                    hub.release.wait(30)
                    return
                self.wfile.write(data)

            def do_HEAD(self) -> None:
                self._file(head=True)

            def do_GET(self) -> None:
                path = unquote(urlparse(self.path).path)
                if path == "/_downloads":
                    self._json(dict(hub.downloads))
                elif path.startswith(f"/api/models/{hub.repo}/revision/"):
                    self._json({"id": hub.repo, "sha": COMMIT,
                                "siblings": [{"rfilename": name} for name in hub.files()]})
                elif path.startswith(f"/api/models/{hub.repo}/tree/"):
                    self._json([{"type": "file", "path": name, "size": file.stat().st_size,
                                 "oid": hashlib.sha1(file.read_bytes()).hexdigest()}
                                for name, file in hub.files().items()])
                else:
                    self._file(head=False)

        return Handler


if __name__ == "__main__":
    HubStandIn(sys.argv[1], Path(sys.argv[2]), "0.0.0.0", int(sys.argv[3])).server.serve_forever()
