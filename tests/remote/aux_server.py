#!/usr/bin/env python3
"""Loopback HTTP server for the remote tests, serving files under ROOT in ways real servers
misbehave, chosen by the first path segment:
  /signed/...   only with a valid AWS SigV4 signature (S3 style) for the test key, else 403
  /flaky/...    the first request for each path is dropped without an answer, the second gets
                half its body and a closed connection, later ones succeed
  /corrupt/...  the file with one byte flipped
  /slow/...     shards sent in 8 pieces 0.3 s apart (2.4 s a shard)
It also listens on HANG_PORT without ever accepting, for timeout tests.
usage: aux_server.py ROOT PORT HANG_PORT
"""
import hashlib, hmac, os, socket, sys, time, urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT, PORT, HANG_PORT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ACCESS_KEY, SECRET_KEY = "ANVILTESTKEY", "anvil/test+secret"
seen = {}


def sigv4_ok(handler):
    """Recomputes the request's SigV4 signature from the AWS specification and compares."""
    auth = handler.headers.get("Authorization", "")
    if not auth.startswith("AWS4-HMAC-SHA256 "):
        return False
    fields = dict(part.strip().split("=", 1) for part in auth[len("AWS4-HMAC-SHA256 "):].split(","))
    key_id, date, region, service, terminator = fields["Credential"].split("/")
    if key_id != ACCESS_KEY:
        return False
    signed = fields["SignedHeaders"].split(";")
    url = urllib.parse.urlsplit(handler.path)
    path = urllib.parse.quote(urllib.parse.unquote(url.path), safe="/-_.~")
    query = "&".join(f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
                     for k, v in sorted(urllib.parse.parse_qsl(url.query, keep_blank_values=True)))
    headers = "".join(f"{h}:{' '.join(handler.headers.get(h, '').split())}\n" for h in signed)
    payload = handler.headers.get("x-amz-content-sha256", "")
    canonical = "\n".join([handler.command, path, query, headers, ";".join(signed), payload])
    scope = f"{date}/{region}/{service}/{terminator}"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", handler.headers.get("x-amz-date", ""), scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + SECRET_KEY).encode()
    for part in (date, region, service, terminator):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.compare_digest(hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest(), fields["Signature"])


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        parts = urllib.parse.urlsplit(self.path).path.split("/", 2)
        mode, rel = parts[1], urllib.parse.unquote(parts[2] if len(parts) > 2 else "")
        if mode == "signed":
            rel = rel.split("/", 1)[1] if "/" in rel else ""  # drop the bucket
            if not sigv4_ok(self):
                return self.reply(403, b"<Error><Code>SignatureDoesNotMatch</Code></Error>")
        path = os.path.join(ROOT, rel)
        if not os.path.isfile(path):
            return self.reply(404, b"<Error><Code>NoSuchKey</Code></Error>")
        data = open(path, "rb").read()
        if mode == "flaky":
            n = seen[rel] = seen.get(rel, 0) + 1
            if n == 1:
                self.close_connection = True
                return  # no answer at all
            if n == 2:
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.close_connection = True
                return
        if mode == "slow" and rel.endswith((".mds", ".zstd")):
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            step = (len(data) + 7) // 8
            for k in range(0, len(data), step):
                self.wfile.write(data[k:k + step])
                self.wfile.flush()
                time.sleep(0.3)
            return
        if mode == "corrupt" and rel.endswith((".mds", ".zstd")):
            data = bytearray(data)
            data[len(data) // 2] ^= 0xFF
            data = bytes(data)
        self.reply(200, data)

    def reply(self, code, body):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


hang = socket.socket()
hang.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
hang.bind(("127.0.0.1", HANG_PORT))
hang.listen(8)  # never accepted: connections complete, requests are never answered
ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
