"""Tools around the server. `duetime bench`, the load generator, is `duetime.tools.loadgen`:

    from duetime.tools.loadgen import BenchConfig, run_bench
    result = run_bench(BenchConfig(model="mlp", address="127.0.0.1:8000", rate=2000))
    print(result.format()); result.overall.goodput_rps

Its parts: `config` (settings), `arrivals` (schedules, due classes), `payloads` (requests built
before a run), `transports` and `http_client` (where requests go), `drivers` (open and closed
loops), `outcomes` and `report` (what came back, summarised).
"""
