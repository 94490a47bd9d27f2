"""The edge daemon: a long-running local service that keeps the draft model loaded and one gRPC
channel to the verifier open, and serves an OpenAI-compatible HTTP API over the session client.

  openai_schema.py  request / response / error bodies (pydantic)
  errors.py         domain errors and their OpenAI-style status and body
  detokenizer.py    incremental ids -> text that never splits a UTF-8 character
  stop.py           stop-string matching over streamed text
  sse.py            server-sent-event framing
  metrics.py        Prometheus metrics on a registry passed in
  jobs.py           API request -> GenerationJob (validated against the daemon's limits)
  pool.py           GenerationPool: runs jobs (pool of draft runtimes, worker threads), link state
  output.py         a generation's text as it forms (detokenizer, stop strings) and its output
  responses.py      generation output -> OpenAI bodies and SSE chunk streams
  app.py            the FastAPI app: thin handlers over the pool
  server.py         uvicorn in the foreground (signals) or in a thread (tests, simulation)
  command.py        the `tandem-edge serve` subcommand (registered by edge/cli.py)
"""
