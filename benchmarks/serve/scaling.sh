#!/usr/bin/env bash
# Data-parallel scaling of `pxvm serve --replicas N` (Ray Serve, one GPU per replica) on
# one machine: for each N, start N replicas of MODEL, wait until they are up, run
# `pxvm bench serve` against the one endpoint at each number of concurrent streams, stop
# the cluster, and print one markdown table (replicas, streams, aggregate output tokens/s
# and its ratio to one replica's, TTFT p50/p99, TPOT p50) with the JSON of every level.
#
#     bash benchmarks/serve/scaling.sh MODEL [options]
#
#   --replicas "1 2 4"   replica counts, in turn (default "1 2")
#   --streams 64,256     concurrent streams per level (default 64,256)
#   --input-len 128      prompt tokens of each request (default 128)
#   --output-len 128     tokens generated per request, ignore_eos (default 128)
#   --seconds 20         no request of a level starts after this (default 20)
#   --per-process 32     streams per client process (default 32: one Python client
#                        process parses a few thousand streamed tokens/s at most)
#   --budget 420         seconds for the whole script: an N whose estimate no longer
#                        fits is skipped, and said so, and every step is cut off at it
#                        (then 60 s more at most to stop the last cluster; default 420)
#   --load-timeout 240   seconds for N replicas to load and answer /health (default 240)
#   --ingress proxy      proxy: Serve's HTTP proxy (a Python actor) forwards every streamed
#                        token, as `pxvm serve --replicas` does by default; haproxy: Ray's
#                        HAProxy ingress (RAY_SERVE_ENABLE_HA_PROXY=1, experimental in Ray
#                        2.60) sends requests straight to the replicas' own HTTP servers
#   --backend auto       pxvm's backend in each replica (default auto: CUDA on a GPU)
#   --max-batch 128      sequences each replica decodes together (default 128)
#   --kit FILE           the Ray kit to unpack into --site first (default
#                        .ray312/ray-kit-cp312.tar.xz, made by benchmarks/serve/ray_kit.py;
#                        "none" when Ray is installed already)
#   --site /tmp/site     the folder the kit is unpacked into (put first on PYTHONPATH)
#   --out DIR            where scaling.md (the table), scaling.json (every level), serve.log,
#                        warmup.log and cpu.log (the busiest processes mid-level: Serve's
#                        proxy, replicas, clients) go (default $OUT, else /tmp/scaling)
#
# Ray gives each replica one GPU (num_gpus=1; it sets CUDA_VISIBLE_DEVICES in the replica),
# so N may not exceed the GPUs. Every level begins after a short warm-up level (its
# numbers discarded) that makes each replica compile and run its kernels once.
# On the lent GPU machine, after `source benchmarks/gpu_machine.sh 8b` (which writes
# /tmp/models/8b.gguf and puts /tmp/site on PYTHONPATH); unpack the kit after it, since
# its pip --target install replaces the folders the kit adds to (opentelemetry).
set -u -o pipefail

usage() { sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0" >&2; exit 1; }
[ $# -ge 1 ] || usage
MODEL=$1; shift
REPLICAS="1 2"; STREAMS=64,256; INPUT_LEN=128; OUTPUT_LEN=128; SECONDS_PER_LEVEL=20
PER_PROCESS=32; BUDGET=420; LOAD_TIMEOUT=240; BACKEND=auto; MAX_BATCH=128; INGRESS=proxy
KIT=.ray312/ray-kit-cp312.tar.xz; SITE=/tmp/site; DIR=${OUT:-/tmp/scaling}
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || { echo "error: $1 needs a value" >&2; usage; }
    case $1 in
        --replicas) REPLICAS=$2 ;; --streams) STREAMS=$2 ;; --input-len) INPUT_LEN=$2 ;;
        --output-len) OUTPUT_LEN=$2 ;; --seconds) SECONDS_PER_LEVEL=$2 ;;
        --per-process) PER_PROCESS=$2 ;; --budget) BUDGET=$2 ;;
        --load-timeout) LOAD_TIMEOUT=$2 ;; --backend) BACKEND=$2 ;; --ingress) INGRESS=$2 ;;
        --max-batch) MAX_BATCH=$2 ;; --kit) KIT=$2 ;; --site) SITE=$2 ;; --out) DIR=$2 ;;
        *) echo "error: unknown option $1" >&2; usage ;;
    esac
    shift 2
done
[ -f "$MODEL" ] || { echo "error: no model file at $MODEL" >&2; exit 1; }
for n in $REPLICAS $PER_PROCESS $BUDGET $LOAD_TIMEOUT $SECONDS_PER_LEVEL; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "error: $n is not a whole number > 0" >&2; exit 1; }
done
case $INGRESS in
    proxy) ;; haproxy) export RAY_SERVE_ENABLE_HA_PROXY=1 ;;
    *) echo "error: --ingress is proxy or haproxy, not $INGRESS" >&2; exit 1 ;;
esac
[[ $STREAMS =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || {
    echo "error: --streams takes numbers like 64,256, not $STREAMS" >&2; exit 1; }
START=$(date +%s)
mkdir -p "$DIR"
WORK=$(mktemp -d)  # each level's JSON; $DIR gets the merged one (few files come back)

if [ "$KIT" != none ]; then
    [ -f "$KIT" ] || { echo "error: no Ray kit at $KIT (benchmarks/serve/ray_kit.py makes it)" >&2; exit 1; }
    mkdir -p "$SITE" && tar xJf "$KIT" -C "$SITE" || exit 1
    case ":${PYTHONPATH:-}:" in *:"$SITE":*) ;; *) export PYTHONPATH=$SITE:$PWD/src${PYTHONPATH:+:$PYTHONPATH} ;; esac
fi
# Ray's memory monitor kills workers past 95% of MemTotal, which on the lent machines
# reads a fraction of their memory until it is used (KINDS.md): N replicas loading a
# 5 GB model each could be killed for memory the machine has
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 RAY_memory_monitor_refresh_ms=0
python3 -c 'import ray.serve, openai' || { echo "error: Ray Serve or openai does not import" >&2; exit 1; }

LEVELS=$(tr ',' ' ' <<< "$STREAMS" | wc -w)
# a level: its time, the requests still in flight at its end (one request's time), the
# client processes' start
ESTIMATE_LEVEL=$((SECONDS_PER_LEVEL + 15))
SERVER_PID=

stop_server() {  # SIGTERM: the replicas close their engines and Ray stops; KILL after 60 s
    [ -n "$SERVER_PID" ] || return 0
    kill -TERM "$SERVER_PID" 2>/dev/null
    for _ in $(seq 60); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
    if kill -0 "$SERVER_PID" 2>/dev/null; then
        echo "the server did not stop within 60 s: killing it and Ray's processes" >&2
        kill -KILL "$SERVER_PID" 2>/dev/null
        python3 -m ray.scripts.scripts stop --force > /dev/null 2>&1
    fi
    wait "$SERVER_PID" 2>/dev/null
    SERVER_PID=
}
trap 'stop_server' EXIT
trap 'exit 130' INT TERM

left() {  # seconds of --budget left, at least 1
    local n=$(( BUDGET - ($(date +%s) - START) ))
    echo $(( n > 1 ? n : 1 ))
}
at_most() { echo $(( $1 < $(left) ? $1 : $(left) )); }

wait_ready() {  # the URL once `pxvm serve` says its replicas are up and /health answers 200
    local log=$1 deadline=$(( $(date +%s) + $(at_most "$LOAD_TIMEOUT") )) url
    while [ "$(date +%s)" -lt "$deadline" ]; do
        kill -0 "$SERVER_PID" 2>/dev/null || return 1
        url=$(grep -o 'OpenAI API at http://[^ ]*/v1' "$log" | head -1 | sed 's/^OpenAI API at //; s#/v1$##')
        if [ -n "$url" ] && python3 - "$url" <<'EOF'
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/health", timeout=5) as answer:
    sys.exit(answer.status != 200)
EOF
        then echo "$url"; return 0; fi
        sleep 2
    done
    return 1
}

sample_cpu() {  # mid-level, the busiest processes: is Serve's proxy, a replica or a client the limit?
    command -v top > /dev/null || return 0
    sleep $(( SECONDS_PER_LEVEL / 2 + 5 ))
    { echo "== $1"; top -b -n 2 -d 2 -w 200 -c | awk '/^top -/{n++} n==2' | sed -n '1,5p;7,25p'; } >> "$DIR/cpu.log"
}

for n in $REPLICAS; do
    elapsed=$(( $(date +%s) - START ))
    need=$(( 60 + LEVELS * ESTIMATE_LEVEL + 20 ))  # start and load, levels, warm-up and stop
    if [ $(( elapsed + need )) -gt "$BUDGET" ]; then
        echo "skipping $n replicas: ${elapsed} s spent, about ${need} s more needed, --budget $BUDGET" | tee -a "$DIR/skipped.txt" >&2
        continue
    fi
    log=$WORK/serve-$n.log
    echo "== $n replicas: starting" >&2
    python3 -m pxvm serve --model "$MODEL" --replicas "$n" --port 0 --backend "$BACKEND" \
        --max-batch "$MAX_BATCH" --max-waiting 1024 > "$log" 2>&1 &
    SERVER_PID=$!
    t0=$(date +%s)
    if ! url=$(wait_ready "$log"); then
        echo "error: $n replicas did not come up within $LOAD_TIMEOUT s; the end of $log:" >&2
        tail -n 30 "$log" >&2
        stop_server
        { echo "== pxvm serve --replicas $n"; cat "$log"; } >> "$DIR/serve.log"
        continue
    fi
    echo "== $n replicas up at $url after $(( $(date +%s) - t0 )) s" >&2
    # warm-up: a few requests per replica (Serve spreads concurrent ones), numbers discarded
    timeout "$(at_most 120)" python3 -m pxvm bench serve --model "$MODEL" --url "$url" --concurrency $((4 * n)) \
        --requests $((8 * n)) --input-len "$INPUT_LEN" --output-len 16 --max-seconds 15 \
        > /dev/null 2>> "$DIR/warmup.log" || echo "note: the warm-up had failures ($DIR/warmup.log)" >&2
    for streams in $(tr ',' ' ' <<< "$STREAMS"); do
        processes=$(( (streams + PER_PROCESS - 1) / PER_PROCESS ))
        echo "== $n replicas, $streams streams ($processes client processes)" >&2
        sample_cpu "$n replicas, $streams streams" &
        # a level ends one request's time after --seconds; the budget bounds it all
        timeout "$(at_most $((SECONDS_PER_LEVEL + 120)))" python3 -m pxvm bench serve --model "$MODEL" \
            --url "$url" --concurrency "$streams" --requests $((streams * 64)) \
            --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" \
            --max-seconds "$SECONDS_PER_LEVEL" --processes "$processes" \
            --json "$WORK/bench-$n-$streams.json" >&2 \
            || echo "note: $n replicas, $streams streams: bench serve ended with status $?" >&2
    done
    stop_server
    { echo "== pxvm serve --replicas $n"; cat "$log"; } >> "$DIR/serve.log"
done

wait  # the last CPU sample
INGRESS=$INGRESS python3 - "$WORK" "$DIR" <<'EOF' | tee "$DIR/scaling.md"
"""The levels of every bench-N-S.json as one table and one scaling.json."""
import json, os, sys
from pathlib import Path

work, out = Path(sys.argv[1]), Path(sys.argv[2])
rows = []
for path in work.glob("bench-*-*.json"):
    replicas = int(path.stem.split("-")[1])
    data = json.loads(path.read_text())
    for level in data["levels"]:
        rows.append({"replicas": replicas, "ingress": os.environ["INGRESS"],
                     "settings": data["settings"],
                     "client_processes": data["server"].get("client_processes"), **level})
rows.sort(key=lambda r: (r["concurrency"], r["replicas"]))
one = {r["concurrency"]: r["output_tokens_per_s"] for r in rows if r["replicas"] == 1}
(out / "scaling.json").write_text(json.dumps(rows, indent=2) + "\n")
fmt = lambda v: "-" if v is None else f"{v:,.1f}"
print("| replicas | streams | requests (failed) | output tok/s | x 1 replica | TTFT p50 ms "
      "| TTFT p99 ms | TPOT p50 ms |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    ratio = (f"{r['output_tokens_per_s'] / one[r['concurrency']]:.2f}"
             if one.get(r["concurrency"]) else "-")
    print(f"| {r['replicas']} | {r['concurrency']} | {r['requests']} ({r['failed']}) "
          f"| {fmt(r['output_tokens_per_s'])} | {ratio} | {fmt(r['ttft_ms']['p50'])} "
          f"| {fmt(r['ttft_ms']['p99'])} | {fmt(r['tpot_ms']['p50'])} |")
if rows:
    s = rows[0]["settings"]
    print(f"\n{s['input_len']} prompt tokens, {s['output_len']} output tokens (ignore_eos), "
          f"requests started for {s['max_seconds']:g} s per level; ingress: "
          f"{os.environ['INGRESS']}")
EOF
