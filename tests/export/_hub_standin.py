"""A local stand-in for the few Hub API endpoints huggingface_hub's HfApi.create_repo / upload_folder call.

It validates model cards as the Hub does for `base_model`, answers every file as a "regular" upload (content inline
in the commit, no LFS or Xet transfer), keeps the committed files in memory (`StandIn.repos[repo_id][path] = bytes`)
and records every request. Nothing leaves the machine: tests point huggingface_hub at it through its endpoint
setting.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _validate_card(content: str) -> tuple[int, dict]:
    """Like the Hub: a model card's `base_model` must be a Hub id (owner/name), never a local path."""
    for line in content.split("---")[1].splitlines() if content.startswith("---") else []:
        if line.startswith("base_model:"):
            value = line.split(":", 1)[1].strip()
            if value.count("/") != 1 or value.startswith(("/", ".")):
                return 400, {"errors": [{"message": f'"base_model" with value "{value}" is not a valid model id'}]}
    return 200, {"errors": [], "warnings": []}


class StandIn:
    def __init__(self):
        self.repos: dict[str, dict[str, bytes]] = {}
        self.requests: list[tuple[str, str]] = []
        self.private: dict[str, bool | None] = {}
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _reply(self, status: int, payload) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length", 0)))

            def do_GET(self):
                standin.requests.append(("GET", self.path))
                self._reply(404, {"error": f"not served by the stand-in: {self.path}"})

            def do_POST(self):
                standin.requests.append(("POST", self.path))
                body = self._body()
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts[:2] == ["api", "validate-yaml"]:
                    return self._reply(*_validate_card(json.loads(body)["content"]))
                if parts[:3] == ["api", "repos", "create"]:
                    data = json.loads(body)
                    repo_id = (
                        f"{data.get('organization') or 'user'}/{data['name']}"
                        if "/" not in data["name"]
                        else data["name"]
                    )
                    standin.repos.setdefault(repo_id, {})
                    standin.private[repo_id] = data.get("visibility", data.get("private"))
                    return self._reply(200, {"url": f"{standin.url}/{repo_id}", "name": repo_id, "id": repo_id})
                if len(parts) >= 6 and parts[:2] == ["api", "models"] and parts[4] == "preupload":
                    files = json.loads(body)["files"]
                    return self._reply(
                        200,
                        {
                            "files": [
                                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None}
                                for f in files
                            ]
                        },
                    )
                if len(parts) >= 6 and parts[:2] == ["api", "models"] and parts[4] == "commit":
                    repo_id = f"{parts[2]}/{parts[3]}"
                    if repo_id not in standin.repos:
                        return self._reply(404, {"error": f"Repository {repo_id} not found"})
                    for line in body.decode().splitlines():
                        item = json.loads(line)
                        if item["key"] == "file":
                            value = item["value"]
                            standin.repos[repo_id][value["path"]] = base64.b64decode(value["content"])
                    oid = hashlib.sha1(body).hexdigest()
                    return self._reply(
                        200,
                        {
                            "commitUrl": f"{standin.url}/{repo_id}/commit/{oid}",
                            "commitOid": oid,
                            "pullRequestUrl": None,
                        },
                    )
                return self._reply(404, {"error": f"not served by the stand-in: {self.path}"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
