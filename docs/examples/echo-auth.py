#!/usr/bin/env python3
"""A stand-in for an API that wants a token (README's tour): on 127.0.0.1:PORT, GET /v1/hello
answers 200 when the request carries `Authorization: Bearer ...`, else 401. The host side logs
what it got on stderr, so the tour shows that the token reached the API while the sandbox never
held it."""
import http.server
import sys


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        auth = self.headers.get("Authorization", "")
        ok = auth.startswith("Bearer ") and len(auth) > len("Bearer ")
        body = (b"hello from an API that got its token\n" if ok else b"no token\n")
        sys.stderr.write(f"echo-auth: {self.path} with Authorization: "
                         f"{auth or '(none)'}\n")
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
