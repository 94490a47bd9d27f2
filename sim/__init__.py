"""The simulation, as product: the whole system on emulated links.

  sim/netem/     the link emulator: a TCP proxy with a profile's delay, jitter, capacity (a rate or
                 a mahimahi trace), loss and outages (docker-compose's `channel` service)
  sim/runner.py  `tandem sim`: verifier + one emulated link and edge daemon per profile, on
                 loopback, the workload through the daemon's HTTP API (config: sim/config.py)
  sim/workload.py, sim/report.py
                 the OpenAI-API workload as a client sees it, and its table, JSON and plots
  sim/loadgen.py `tandem loadgen`: the workload against a running daemon (compose's loadgen)
  sim/cli.py     the `tandem` command: these verbs, and the benchmarks' (bench/) loaded by name

It imports edge/ and cloud/; neither imports it. bench/ measures and may import it.
"""
