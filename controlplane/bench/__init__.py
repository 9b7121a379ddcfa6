"""`galaxy bench`: the real control plane under load, measured against the
machine's own limit (a plain grpc.aio echo) in the same run.

Modules:
    plan       experiment files -> control plane configs and request schedules
    trace      Azure Functions 2019 trace replay (time-compressed)
    loadgen    the load-generator process (`python -m controlplane.bench.loadgen`)
    echo       the raw grpc.aio unary echo server (the yardstick)
    promscrape Prometheus /metrics scraping and histogram quantiles
    runner     runs an experiment: processes up, load, scrape
    summary    per-plan figures, ratios to the echo, CPU cost per request
    report     results.json, report.md and PNG plots
    recommend  SLO search over the configuration space
    slo        objectives like p99_cold_start<50ms
    profile    py-spy profiles and per-process CPU time
    etcd       a throwaway etcd for state: etcd plans
    cli        the `bench` sub-command
"""
