"""A stand-in for the Hugging Face Hub, enough for the real `hf download` (HF_ENDPOINT=its url): model
repositories served from local folders (one, or more with `others`), every file request counted (`GET /_downloads` returns the counts as
JSON). `stall` names a file whose download sends half its bytes and then waits until `release` is set (a
download to kill midway). On 127.0.0.1 in tests; tests/e2e runs it in a pod:

    python3 hub_standin.py REPO FOLDER PORT [REPO FOLDER ...]     # serves on 0.0.0.0:PORT until killed
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
    def __init__(self, repo: str, folder: Path, host: str = "127.0.0.1", port: int = 0,
                 others: dict[str, Path] | None = None):
        self.repo, self.folder = repo, folder
        self.repos = {repo: folder, **(others or {})}
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

    def files(self, repo: str | None = None) -> dict[str, Path]:
        folder = self.repos[repo or self.repo]
        return {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*")) if p.is_file()}

    def repo_of(self, path: str, prefix: str) -> str | None:
        """The repository a request path names after `prefix` (`/api/models/` or `/`), if it is served here."""
        return next((r for r in self.repos if path.startswith(f"{prefix}{r}/")), None)

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
                repo = hub.repo_of(path, "/")
                prefix = f"/{repo}/resolve/"
                name = path[len(prefix):].split("/", 1)[1] if repo and path.startswith(prefix) else None
                file = hub.files(repo).get(name) if name else None
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
                repo = hub.repo_of(path, "/api/models/")
                if path == "/_downloads":
                    self._json(dict(hub.downloads))
                elif repo and path.startswith(f"/api/models/{repo}/revision/"):
                    self._json({"id": repo, "sha": COMMIT,
                                "siblings": [{"rfilename": name} for name in hub.files(repo)]})
                elif repo and path.startswith(f"/api/models/{repo}/tree/"):
                    self._json([{"type": "file", "path": name, "size": file.stat().st_size,
                                 "oid": hashlib.sha1(file.read_bytes()).hexdigest()}
                                for name, file in hub.files(repo).items()])
                else:
                    self._file(head=False)

        return Handler


if __name__ == "__main__":
    more = dict(zip(sys.argv[4::2], map(Path, sys.argv[5::2])))
    HubStandIn(sys.argv[1], Path(sys.argv[2]), "0.0.0.0", int(sys.argv[3]), more).server.serve_forever()
