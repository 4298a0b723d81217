"""Images API throughput: N images from a local OpenAI-compatible images server that takes
DELAY seconds per request, with one call at a time vs `concurrency` calls at a time (the
generator option), through the engine and its store. Prints name=value lines, the ratio last.

    python bench/api_concurrency.py [N=16] [DELAY=0.1] [CONCURRENCY=4]
"""
from __future__ import annotations

import base64
import io
import json
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import _common  # noqa: F401 - offline env, repository on sys.path
from PIL import Image


def serve(delay: float) -> ThreadingHTTPServer:
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (90, 120, 200)).save(buf, format="PNG")
    body = json.dumps({"data": [{"b64_json": base64.b64encode(buf.getvalue()).decode()}]}).encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            time.sleep(delay)   # the remote model's generation time
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def seconds_for(url: str, n: int, concurrency: int) -> float:
    from engine.core.engine import Engine

    engine = Engine("synthetic", data_dir=tempfile.mkdtemp(), generator=f"openai:{url}/v1",
                    options={"generator": {"model": "bench-image", "concurrency": concurrency}})
    engine.default_settings()   # connect first: time only the images
    start = time.perf_counter()
    engine.image_set("a photo of a doctor", list(range(n)))
    return time.perf_counter() - start


def main(argv) -> None:
    n = int(argv[1]) if len(argv) > 1 else 16
    delay = float(argv[2]) if len(argv) > 2 else 0.1
    concurrency = int(argv[3]) if len(argv) > 3 else 4
    server = serve(delay)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    serial = seconds_for(url, n, 1)
    parallel = seconds_for(url, n, concurrency)
    server.shutdown()
    print(f"images={n}")
    print(f"server_delay_s={delay}")
    print(f"concurrency={concurrency}")
    print(f"seconds_one_at_a_time={serial:.3f}")
    print(f"seconds_concurrent={parallel:.3f}")
    print(f"speedup={serial / parallel:.2f}")


if __name__ == "__main__":
    main(sys.argv)
