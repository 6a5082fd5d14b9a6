"""Scaling through HAProxy (issue 36): one replica pinned to one core against two replicas, each pinned to a core
of its own, in one run.

    python -m bench.cluster_scaling                  # both clusters, listener counts searched upward
    python -m bench.cluster_scaling --ttfa-factor 3 --start 3

Each cluster is what an operator starts: ``deploy/local-cluster.sh up N PORT`` with ``LOCAL_CLUSTER_CPUS`` (replica
k under ``taskset -c``). Its listeners are bench.load's: real-time playback from the first byte, a stall is a gap
over 20 ms, each listener asking for the next utterance when the last one has played, all of them through the
balancer. Listener counts go up one at a time from ``--start``; a count passes when no listener stalled, the replicas
themselves counted no late chunk, nothing failed or was refused, and the TTFA p95 is within the bound: ``--ttfa-factor``
times the TTFA p95 of one listener alone on the one-replica cluster, measured first in the same run (machines of one
kind differ in speed by 2x and more, so no fixed bound in milliseconds). A count that
fails is tried once more (the machine wavers); the cluster's capacity is the most listeners below the first count
that failed twice. Two replicas start their search at one replica's capacity. The bound is the same for both
clusters, so the two capacities are at the same p95 first audio.

Printed per cluster: every row, its capacity, and the CPU that this process (the load generator) and HAProxy took
per wall second while the rows ran: on a machine with as many cores as replicas they share those cores with the
replicas. The figure is the ratio of the capacities, the issue's target being >= 1.7.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.load import Row, Target, print_rows, run_row
from bench.whep_listeners import process_cpu_s
from testkit.cluster import LocalCluster, start_cluster
from testkit.servers import metric


@dataclass
class Capacity:
    cpus: list[str]
    listeners: int
    """The most listeners that passed below the first count that failed twice (0: the first count failed)."""
    ttfa_p95_s: float
    rows: list[Row]
    load_generator_cpu: float
    """CPU seconds this process took per wall second of the rows."""
    haproxy_cpu: float
    """CPU seconds HAProxy's processes took per wall second of the rows."""


def haproxy_pids(cluster: LocalCluster) -> list[int]:
    """HAProxy's master (its pid file) and its workers (the master's children)."""
    master = int((cluster.state / "haproxy.pid").read_text().split()[0])
    children = Path(f"/proc/{master}/task/{master}/children")
    return [master, *(int(pid) for pid in children.read_text().split())] if children.exists() else [master]


def late_chunks(cluster: LocalCluster) -> float:
    """Chunks the replicas themselves counted late (``rtvoice_late_chunks_total``, summed over replicas)."""
    return sum(metric(cluster.replica_url(k), "rtvoice_late_chunks_total") for k in range(1, cluster.replicas + 1))


def passes(row: Row, late: float, ttfa_bound_s: float) -> bool:
    return row.stalled == 0 and late == 0 and row.errors == 0 and row.rejected == 0 and row.ttfa_p95 <= ttfa_bound_s


def measure(
    cpus: list[str], start: int, utterances: int, join_s: float, ttfa_factor: float, ttfa_bound_s: float | None
) -> tuple[Capacity, float]:
    """The cluster's capacity, and the TTFA bound it was judged by (``ttfa_factor`` times a lone listener's p95 here
    when ``ttfa_bound_s`` is None)."""
    with tempfile.TemporaryDirectory(prefix="rtvoice-scaling-") as state:
        cluster = start_cluster(len(cpus), Path(state), {"LOCAL_CLUSTER_CPUS": " ".join(cpus)})
        try:
            target = Target(f"{len(cpus)} replica(s) on cpus {','.join(cpus)}", cluster.url, "sft")
            asyncio.run(run_row("warm-up", target, None, len(cpus) * 2, 1, 0.0))
            if ttfa_bound_s is None:
                alone = asyncio.run(run_row("1 listener alone", target, None, 1, 2 * utterances, 0.0))
                ttfa_bound_s = ttfa_factor * alone.ttfa_p95
                print(
                    f"  a lone listener's TTFA p95 {alone.ttfa_p95 * 1000:.0f} ms: bound {ttfa_bound_s * 1000:.0f} ms"
                )
            rows: list[Row] = []
            best, best_p95, level, failures = 0, float("nan"), start, 0
            wall = own_cpu = proxy_cpu = 0.0
            while failures < 2:
                proxies = haproxy_pids(cluster)
                late_before, proxy_before = (
                    late_chunks(cluster),
                    sum(process_cpu_s(pid, waited_children=True) for pid in proxies),
                )
                began, own_before = time.perf_counter(), time.process_time()
                row = asyncio.run(run_row(f"{level} listeners", target, None, level, utterances, join_s))
                wall += time.perf_counter() - began
                own_cpu += time.process_time() - own_before
                proxy_cpu += sum(process_cpu_s(pid, waited_children=True) for pid in proxies) - proxy_before
                late = late_chunks(cluster) - late_before
                rows.append(row)
                print(
                    f"  {target.name}: {level} listeners, TTFA p95 {row.ttfa_p95 * 1000:.0f} ms, "
                    f"{row.stalled} stalled, {late:.0f} late chunks, {row.errors} errors, {row.rejected} refused",
                    flush=True,
                )
                if passes(row, late, ttfa_bound_s):
                    best, best_p95, level, failures = level, row.ttfa_p95, level + 1, 0
                else:
                    failures += 1
            return Capacity(cpus, best, best_p95, rows, own_cpu / wall, proxy_cpu / wall), ttfa_bound_s
        finally:
            cluster.script("down")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--start", type=int, default=1, help="the first listener count tried (default 1)")
    parser.add_argument("--utterances", type=int, default=2, help="utterances per listener in a row (default 2)")
    parser.add_argument("--join-seconds", type=float, default=1.0, help="listeners join over this long (default 1)")
    parser.add_argument(
        "--ttfa-factor", type=float, default=3.0, help="the TTFA p95 bound, in lone listener's p95s (default 3)"
    )
    args = parser.parse_args()
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        raise SystemExit("needs two CPUs: one replica per core")
    one, bound = measure([str(usable[0])], args.start, args.utterances, args.join_seconds, args.ttfa_factor, None)
    # Two replicas start their search where one replica's ended: they hold at least as many.
    two_start = max(args.start, one.listeners)
    two, _ = measure(
        [str(usable[0]), str(usable[1])], two_start, args.utterances, args.join_seconds, args.ttfa_factor, bound
    )
    for capacity in (one, two):
        print_rows(f"{len(capacity.cpus)} replica(s), cpus {','.join(capacity.cpus)}", capacity.rows)
        print(
            f"capacity {capacity.listeners} listeners (TTFA p95 there {capacity.ttfa_p95_s * 1000:.0f} ms); "
            f"CPU per wall second: load generator {capacity.load_generator_cpu:.2f}, HAProxy {capacity.haproxy_cpu:.3f}"
        )
    ratio = two.listeners / one.listeners if one.listeners else float("nan")
    print(f"\nTTFA p95 bound {bound * 1000:.0f} ms (x{args.ttfa_factor:g} a lone listener's on one replica)")
    print(f"2 replicas / 1 replica: {two.listeners} / {one.listeners} = {ratio:.2f}x (target >= 1.7x)")


if __name__ == "__main__":
    main()
