"""The edge daemon: a long-running local service that keeps the draft model loaded and one gRPC
channel to the verifier open, and serves an OpenAI-compatible HTTP API over the session client.

  openai_schema.py  request / response / error bodies (pydantic)
  errors.py         domain errors and their OpenAI-style status and body
  detokenizer.py    incremental ids -> text that never splits a UTF-8 character
  stop.py           stop-string matching over streamed text
  sse.py            server-sent-event framing
  metrics.py        Prometheus metrics on a registry passed in
  engine.py         the plain class that runs generations (pool of draft runtimes, worker threads)
  responses.py      engine output -> OpenAI bodies and SSE chunk streams
  app.py            the FastAPI app: thin handlers over the engine
  server.py         uvicorn in the foreground (signals) or in a thread (tests, simulation)
  command.py        the `tandem-edge serve` subcommand (registered by edge/cli.py)
"""
