"""The pure helpers of ``make bench-client`` (deploy/local/bench.py): the quantiles it prints from
the brokers' histograms, and the machine-speed line it prints before and after the steps."""

from __future__ import annotations

import math
import re

import pytest

from deploy.local.bench import SPEED_PROBE, histogram_quantile, machine_speed


def test_quantiles_interpolate_within_the_bucket_as_prometheus_does() -> None:
    buckets = [(0.001, 10.0), (0.01, 90.0), (math.inf, 100.0)]  # cumulative
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.001 + 0.009 * 40 / 80)
    assert histogram_quantile(0.05, buckets) == pytest.approx(0.0005)
    # Above the highest finite bound all one can say is that bound.
    assert histogram_quantile(0.99, buckets) == 0.01
    assert histogram_quantile(0.5, []) is None
    assert histogram_quantile(0.5, [(0.001, 0.0), (math.inf, 0.0)]) is None


def test_the_machine_speed_line_names_the_probe_and_a_time() -> None:
    line = machine_speed(repeat=2, number=1)
    match = re.fullmatch(r"(\d+\.\d\d) ms for (.+) \(best of 2; lower is a faster hour\)", line)
    assert match, line
    assert match.group(2) == SPEED_PROBE and float(match.group(1)) > 0


def test_the_peer_bench_reads_its_latency_table_from_the_perf_summary_line() -> None:
    from client.perf import PerfResult
    from deploy.local.peer_bench import latency_figures

    latencies = [float(i) for i in range(1, 1001)]
    ok = PerfResult(1000, 100_000, 0.5, latencies, 0, 0.25).summary("sent")
    figures = latency_figures(f"warming up\n{ok} [nats-py, publish_async]\n")
    assert figures == {"rate": 2000.0, "50th": 501.0, "99th": 991.0, "99.9th": 1000.0, "cpu_us": 250.0}
    # A run with failed sends has no figures to compare, nor has output without the line.
    assert latency_figures(PerfResult(1000, 100_000, 0.5, latencies, 3, 0.25).summary("sent")) is None
    assert latency_figures("1000 records sent, 2000.0 records/sec (0.19 MB/sec)") is None


def test_the_latency_step_prints_the_brokers_cpu_per_produce_request() -> None:
    from deploy.local.bench import cpu_per_request

    line = cpu_per_request({1: 10.0, 2: 20.0, 3: 5.0}, {1: 11.0, 2: 20.5, 3: 5.5, 4: 9.0}, 500, 5.0)
    # Nodes measured at both ends only (4 started in between): 2 s of CPU over 500 requests.
    assert line == "the brokers' CPU: 4.00 ms a produce request (500 requests, 100/s); cores busy: " \
                   "node 1 0.20, node 2 0.10, node 3 0.10"
    assert cpu_per_request({}, {1: 1.0}, 500, 5.0) is None
    assert cpu_per_request({1: 1.0}, {1: 2.0}, 0, 5.0) is None


def test_repeated_latency_runs_print_every_p99_their_median_and_the_runs_within_the_goal() -> None:
    from deploy.local.bench import runs_line

    assert runs_line("produce", [5.5, 4.25, 7.0], 5.0) == (
        "produce p99 over 3 runs: 5.50, 4.25, 7.00 ms; median 5.50 ms; 1 of 3 within the goal of 5 ms")
    assert runs_line("end-to-end", [9.0, 11.0], 10.0) == (
        "end-to-end p99 over 2 runs: 9.00, 11.00 ms; median 10.00 ms; 1 of 2 within the goal of 10 ms")
    assert runs_line("produce", [], 5.0) == "produce p99: no run completed"
    # Runs the machine stalled in are marked, and the others counted apart.
    assert runs_line("produce", [21.1, 4.75, 5.25], 5.0, [True, False, False]) == (
        "produce p99 over 3 runs: 21.10*, 4.75, 5.25 ms; median 5.25 ms; 1 of 3 within the goal of 5 ms "
        "(* the machine stalled, or the hypervisor took 0.5% of its cores' time or more, during the run; "
        "of the 2 other run(s), 1 within)")
    assert runs_line("produce", [4.5], 5.0, [False]) == (
        "produce p99 over 1 runs: 4.50 ms; median 4.50 ms; 1 of 1 within the goal of 5 ms")
