#!/usr/bin/env bash
# rtvoice replicas behind HAProxy on this machine, for trying it out and for tests (docs/scaling.md).
#
#   deploy/local-cluster.sh up N PORT   start N `rtvoice serve` replicas and HAProxy on 127.0.0.1:PORT, sharing one
#                                       data directory (registered voices, lexicons); prints the balancer's URL,
#                                       then "ready" once every replica answers /readyz and HAProxy has them up
#   deploy/local-cluster.sh restart [K...]  rolling restart: each replica (or replica K) in turn drains, exits,
#                                       starts again and is back in HAProxy before the next
#   deploy/local-cluster.sh reload      reload HAProxy (the old worker finishes its connections)
#   deploy/local-cluster.sh down        stop everything `up` started
#
# Replica k (1..N) is named rK (RTVOICE_REPLICA_ID, its HAProxy server name) and listens on PORT+k, its agent-check
# on PORT+N+k; HAProxy's stats and Prometheus metrics are on PORT+2N+1 (/stats, /metrics). Needs only Debian's
# haproxy and rtvoice's own install (`rtvoice` on PATH, or this checkout's .venv).
#
# Environment: every RTVOICE_* variable passes through to the replicas (RTVOICE_DATA_DIR defaults to the state
# directory's data/). LOCAL_CLUSTER_DIR: where state, logs and the data live (default ${TMPDIR:-/tmp}/rtvoice-cluster).
# LOCAL_CLUSTER_CPUS: CPU lists, one per replica, space-separated (e.g. "0 1"): replica k runs under `taskset -c`.
# LOCAL_CLUSTER_READY_TIMEOUT_S: how long `up` waits (default 300).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="${LOCAL_CLUSTER_DIR:-${TMPDIR:-/tmp}/rtvoice-cluster}"

usage() { echo "usage: $0 up N PORT | restart [K...] | reload | down" >&2; exit 2; }

rtvoice_command() {
  if command -v rtvoice >/dev/null 2>&1; then command -v rtvoice
  elif [ -x "$HERE/../.venv/bin/rtvoice" ]; then echo "$HERE/../.venv/bin/rtvoice"
  else echo "rtvoice is not installed: pip install it, or run 'make venv' in the checkout" >&2; exit 1; fi
}

# The HTTP status of GET PATH on 127.0.0.1:PORT, with bash's /dev/tcp (no curl needed); 000 when it cannot connect.
http_status() {
  local port=$1 path=$2 line
  if ! { exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null; then echo 000; return; fi
  printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$path" >&3
  IFS= read -r -t 5 line <&3 || line=""
  exec 3<&- 3>&-
  line="${line#HTTP/* }"
  echo "${line%% *}"
}

# HAProxy's stats as CSV: how many servers of the backend "replicas" it has up (UP, or DRAIN: up, but full).
servers_up() {
  local port=$1 count=0 row fields
  if ! { exec 4<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null; then echo 0; return; fi
  printf 'GET /stats;csv HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&4
  while IFS= read -r -t 5 row; do
    IFS=, read -r -a fields <<<"$row"
    if [ "${fields[0]:-}" = replicas ] && [[ "${fields[1]:-}" == r* ]]; then
      case "${fields[17]:-}" in UP | DRAIN*) count=$((count + 1)) ;; esac
    fi
  done <&4
  exec 4<&- 4>&-
  echo "$count"
}

stop_pid_file() {
  local file=$1 pid
  [ -f "$file" ] || return 0
  pid="$(cat "$file")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
}

down() {
  [ -d "$STATE" ] || { echo "nothing running ($STATE does not exist)"; return 0; }
  stop_pid_file "$STATE/haproxy.pid"
  local file
  for file in "$STATE"/r*.pid; do [ -e "$file" ] && stop_pid_file "$file" & done
  wait
  rm -f "$STATE/cluster.env"
  echo "down"
}

up() {
  local n=$1 port=$2
  [[ "$n" =~ ^[1-9][0-9]*$ && "$port" =~ ^[1-9][0-9]*$ ]] || usage
  command -v haproxy >/dev/null || { echo "haproxy is not installed (apt-get install haproxy)" >&2; exit 1; }
  rtvoice_command >/dev/null
  if [ -e "$STATE/haproxy.pid" ] || compgen -G "$STATE/r*.pid" >/dev/null; then
    echo "a cluster is already running from $STATE: '$0 down' first" >&2; exit 1
  fi
  mkdir -p "$STATE/run"
  export RTVOICE_DATA_DIR="${RTVOICE_DATA_DIR:-$STATE/data}"
  export RTVOICE_HOST=127.0.0.1

  local k config="$STATE/haproxy.cfg"
  printf 'N=%s\nPORT=%s\n' "$n" "$port" >"$STATE/cluster.env"
  for k in $(seq 1 "$n"); do start_replica "$k" "$n" "$port"; done

  # The reference configuration, with this cluster's replicas as the servers of each backend (with their agents in
  # the first, "replicas", without in "replicas_full").
  awk -v n="$n" -v port="$port" '
    /^backend / { backend = $2 }
    /^    server / { next }
    { print }
    /^    # replicas/ {
      for (k = 1; k <= n; k++) {
        line = "    server r" k " 127.0.0.1:" (port + k)
        if (backend == "replicas") line = line " agent-port " (port + n + k)
        print line
      }
    }' "$HERE/haproxy/haproxy.cfg" >"$config"

  local deadline=$((SECONDS + ${LOCAL_CLUSTER_READY_TIMEOUT_S:-300}))
  wait_ready "$deadline" "$port" $(seq 1 "$n") || { down >&2; exit 1; }

  HAPROXY_RUN_DIR="$STATE/run" RTVOICE_LB_BIND="127.0.0.1:$port" RTVOICE_LB_STATS_BIND="127.0.0.1:$((port + 2 * n + 1))" \
    haproxy -W -D -p "$STATE/haproxy.pid" -f "$config" >>"$STATE/haproxy.log" 2>&1 </dev/null \
    || { echo "haproxy did not start; see $STATE/haproxy.log" >&2; down >&2; exit 1; }
  echo "http://127.0.0.1:$port"
  wait_balanced "$deadline" "$n" "$port" || { down >&2; exit 1; }
  echo "ready"
}

start_replica() {
  local k=$1 n=$2 port=$3 rtvoice pin=()
  rtvoice="$(rtvoice_command)"
  read -r -a cpus <<<"${LOCAL_CLUSTER_CPUS:-}"
  if [ "${#cpus[@]}" -ge "$k" ]; then pin=(taskset -c "${cpus[$((k - 1))]}"); fi
  RTVOICE_PORT=$((port + k)) RTVOICE_AGENT_PORT=$((port + n + k)) RTVOICE_REPLICA_ID="r$k" \
    nohup "${pin[@]}" "$rtvoice" serve >>"$STATE/r$k.log" 2>&1 </dev/null &
  echo $! >"$STATE/r$k.pid"
}

# Until every replica K given answers /readyz (1 when one exits or the deadline passes).
wait_ready() {
  local deadline=$1 port=$2 k waiting; shift 2
  while :; do
    waiting=0
    for k in "$@"; do
      if ! kill -0 "$(cat "$STATE/r$k.pid")" 2>/dev/null; then
        echo "replica r$k exited; its log, $STATE/r$k.log, ends:" >&2; tail -n 20 "$STATE/r$k.log" >&2; return 1
      fi
      [ "$(http_status $((port + k)) /readyz)" = 200 ] || waiting=1
    done
    [ "$waiting" = 0 ] && return 0
    if [ "$SECONDS" -ge "$deadline" ]; then echo "replicas not ready in time" >&2; return 1; fi
    sleep 0.5
  done
}

# Until HAProxy has every replica up.
wait_balanced() {
  local deadline=$1 n=$2 port=$3
  until [ "$(servers_up $((port + 2 * n + 1)))" = "$n" ]; do
    if [ "$SECONDS" -ge "$deadline" ]; then echo "HAProxy does not see every replica up" >&2; return 1; fi
    sleep 0.2
  done
}

# A rolling restart: each replica (or only those named) in turn drains (SIGTERM: it finishes its streams while
# HAProxy, told by its checks, sends new work elsewhere), exits, starts again and is back in HAProxy before the next.
restart() {
  [ -f "$STATE/cluster.env" ] || { echo "no cluster running from $STATE" >&2; exit 1; }
  local N PORT k
  # shellcheck disable=SC1091
  . "$STATE/cluster.env"
  local replicas=("$@")
  [ "${#replicas[@]}" -gt 0 ] || mapfile -t replicas < <(seq 1 "$N")
  export RTVOICE_DATA_DIR="${RTVOICE_DATA_DIR:-$STATE/data}"
  export RTVOICE_HOST=127.0.0.1
  for k in "${replicas[@]}"; do
    [[ "$k" =~ ^[0-9]+$ && "$k" -ge 1 && "$k" -le "$N" ]] || usage
    stop_pid_file "$STATE/r$k.pid"
    start_replica "$k" "$N" "$PORT"
    local deadline=$((SECONDS + ${LOCAL_CLUSTER_READY_TIMEOUT_S:-300}))
    wait_ready "$deadline" "$PORT" "$k" && wait_balanced "$deadline" "$N" "$PORT" || exit 1
    echo "r$k restarted"
  done
}

reload() {
  [ -f "$STATE/haproxy.pid" ] || { echo "no HAProxy running from $STATE" >&2; exit 1; }
  kill -USR2 "$(cat "$STATE/haproxy.pid")"
  echo "reloaded"
}

case "${1:-}" in
  up) [ $# -eq 3 ] || usage; up "$2" "$3" ;;
  reload) reload ;;
  restart) shift; restart "$@" ;;
  down) down ;;
  *) usage ;;
esac
