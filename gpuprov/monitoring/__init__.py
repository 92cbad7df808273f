"""Monitoring made from the inventory: exporters on every host, Prometheus targets, rules and a dashboard.

The modules, one job each:
    policy     a host's monitoring settings from its inventory variables (addresses, ports, exporter mode)
    exporters  the `Change`s of node_exporter and dcgm-exporter (a container, or NVIDIA's package's service)
    timers     the drift timer and the idle-GPU validation timer (host-side scripts, systemd units)
    deploy     one host's deploy: facts, plan, apply through gpuprov.core.apply, like provision
    targets    Prometheus file_sd targets and the scrape configuration, from the inventory
    server     the Prometheus host: Debian's package with gpuprov's configuration, rules and targets
    query      Prometheus's HTTP API, directly or through the monitoring host's SSH connection
    idle       idle GPUs and what they cost
    dashboard  the Grafana dashboard, built with grafanalib
    promtool   promtool (Debian's prometheus package), the outside judge of rules and queries
"""
