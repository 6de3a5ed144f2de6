"""A fake timesvc replica for tests: answers every ``GET /now`` with a huge ``now_us``.

``python liar.py PORT [NOW_US]`` serves on 127.0.0.1:PORT until killed; prints "listening" once
it accepts connections (so the test waits for that line, not for a fixed time).
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    port = int(sys.argv[1])
    now_us = int(sys.argv[2]) if len(sys.argv) > 2 else 10**20
    body = json.dumps({"now_us": now_us, "replica": "liar"}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print("listening", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
