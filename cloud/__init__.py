"""The cloud verifier: target runtime (runtime/), verification (verify.py), batching
(batcher.py), sessions and memory budget (sessions.py), the Verifier that ties them (engine.py)
and the thin gRPC servicer (service.py; convert.py: proto <-> engine; server.py, auth.py) with
its CLI (cli.py). Never imports `edge`."""
