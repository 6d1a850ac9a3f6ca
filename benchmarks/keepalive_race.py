"""The keep-alive race: client-side ``httpx.ReadError``s with no error on the server.

A client pool keeps an idle connection for its expiry (httpx and the openai SDK: 5 s); the server
closes it after its own keep-alive timeout (uvicorn's default: 5 s). When the two are equal, a
request sent on a connection just as the server closes it reaches a closed socket: the client sees
``ReadError`` (connection reset) or ``RemoteProtocolError`` ("Server disconnected without sending a
response") and the server never saw a request. Floods with many connections idling near the
expiry (64 streams on a busy machine) hit it now and then.

    python benchmarks/keepalive_race.py [--server-keep-alive 0.5] [--client-expiry 0.5]
        [--clients 16] [--requests 20]

Each client sends a request, idles for 97-100% of its pool's expiry, and sends the next; the
baseline is the same run with the server keeping connections three times longer.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fakes: a torch-free target

from tests.fakes.generative import WordsTarget

from mmchaos.server import ServerConfig, ServerThread

BODY = {"model": "fake:words", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def run(server_keep_alive: float, client_expiry: float, clients: int, requests: int) -> Counter[str]:
    """Errors by kind over ``clients x requests`` requests."""
    errors: Counter[str] = Counter()
    lock = threading.Lock()
    with ServerThread(WordsTarget(), ServerConfig(keep_alive_timeout=server_keep_alive)) as srv:

        def client(i: int) -> None:
            rng = random.Random(i)
            with httpx.Client(limits=httpx.Limits(keepalive_expiry=client_expiry), timeout=30) as c:
                for _ in range(requests):
                    try:
                        c.post(srv.base_url + "/chat/completions", json=BODY).raise_for_status()
                        kind = "ok"
                    except Exception as exc:  # the client's view is the measurement
                        kind = type(exc).__name__
                    with lock:
                        errors[kind] += 1
                    time.sleep(client_expiry * rng.uniform(0.97, 1.0))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server-keep-alive", type=float, default=0.5)
    ap.add_argument("--client-expiry", type=float, default=0.5)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=20)
    a = ap.parse_args()
    for label, keep_alive in (("equal (the race)", a.server_keep_alive), ("server 3x longer", a.server_keep_alive * 3)):
        errors = run(keep_alive, a.client_expiry, a.clients, a.requests)
        failed = sum(n for k, n in errors.items() if k != "ok")
        print(f"{label:18s} server keep-alive {keep_alive:g} s, client expiry {a.client_expiry:g} s: "
              f"{failed}/{sum(errors.values())} failed {dict(errors)}")  # fmt: skip


if __name__ == "__main__":
    main()
