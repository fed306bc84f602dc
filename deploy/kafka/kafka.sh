#!/usr/bin/env bash
# A local single-node Apache Kafka 4.1 broker (KRaft, combined broker + controller) assembled from Maven
# Central. Every subcommand is idempotent:
#
#   kafka.sh fetch    download the broker jars once into the cache (needs java + mvn)
#   kafka.sh start    fetch, format storage on first use, start in the background, wait until it answers,
#                     print the bootstrap address (the only line on stdout)
#   kafka.sh stop     graceful stop (SIGTERM, then SIGKILL after KAFKA_STOP_TIMEOUT seconds)
#   kafka.sh status   print "running <bootstrap>" (exit 0) or "stopped" (exit 3)
#
# Environment:
#   KAFKA_STATE_DIR    run directory: rendered config, data, logs, pid, ports (default: <repo>/var/kafka)
#   KAFKA_VERSION      kafka_2.13 version (default: the one pinned in pom.xml)
#   KAFKA_CACHE_DIR    jar cache (default: ${XDG_CACHE_HOME:-$HOME/.cache}/streamdedup/kafka-<version>)
#   KAFKA_HEAP_OPTS    JVM heap (default: -Xms256m -Xmx768m)
#   KAFKA_START_TIMEOUT, KAFKA_STOP_TIMEOUT   seconds (default 120, 30)
#   KAFKA_EXTRA_CONFIG  a properties file appended to the rendered server.properties, placeholders and all
#                       (a key set there overrides the template's), e.g. listeners with TLS and SASL
#   KAFKA_FORMAT_ARGS   more arguments for the first storage format, split at blanks (no quoting), e.g.
#                       --add-scram SCRAM-SHA-512=[name=svc,password=secret]
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PINNED_VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$HERE/pom.xml")"
VERSION="${KAFKA_VERSION:-$PINNED_VERSION}"
CACHE_DIR="${KAFKA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/streamdedup/kafka-$VERSION}"
LIBS="$CACHE_DIR/libs"
STATE_DIR="${KAFKA_STATE_DIR:-$REPO/var/kafka}"
if [[ -d "$STATE_DIR" ]]; then STATE_DIR="$(cd "$STATE_DIR" && pwd)"; fi
HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms256m -Xmx768m}"
START_TIMEOUT="${KAFKA_START_TIMEOUT:-120}"
STOP_TIMEOUT="${KAFKA_STOP_TIMEOUT:-30}"

say() { echo "kafka.sh: $*" >&2; }
die() { say "$*"; exit 1; }

need() {
    command -v "$1" >/dev/null 2>&1 || die "$1 not found on PATH ($2)"
}

# A fresh Debian/Ubuntu machine gets java and mvn from apt (as root, or through sudo); elsewhere we say
# what is missing.
install_tools() {
    local missing=()
    command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
    command -v mvn >/dev/null 2>&1 || missing+=(maven)
    ((${#missing[@]})) || return 0
    command -v apt-get >/dev/null 2>&1 || return 0
    local sudo=()
    if [[ "$(id -u)" != 0 ]]; then
        command -v sudo >/dev/null 2>&1 || return 0
        sudo=(sudo -n)
    fi
    say "installing ${missing[*]} with apt-get"
    "${sudo[@]}" apt-get update -qq >&2 || true
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >&2 \
        || say "apt-get could not install ${missing[*]}"
}

fetch() {
    if [[ -f "$LIBS/.complete" ]]; then
        return 0
    fi
    install_tools
    need java "a Java 17+ runtime runs the broker, e.g. apt-get install openjdk-17-jre-headless"
    need mvn "Maven fetches the broker jars from Maven Central, e.g. apt-get install maven"
    say "fetching kafka_2.13 $VERSION and log4j2 from Maven Central into $LIBS"
    local partial="$LIBS.partial.$$"
    rm -rf "$partial"
    mkdir -p "$partial"
    mvn -q -B -Dstyle.color=never -f "$HERE/pom.xml" -Dkafka.version="$VERSION" \
        dependency:copy-dependencies -DoutputDirectory="$partial" >&2
    ls "$partial"/kafka_2.13-"$VERSION".jar >/dev/null || die "kafka_2.13-$VERSION.jar missing after fetch"
    touch "$partial/.complete"
    rm -rf "$LIBS"
    mv "$partial" "$LIBS"
}

running() {
    [[ -n "$1" ]] && kill -0 "$1" 2>/dev/null && [[ "$(ps -o stat= -p "$1" 2>/dev/null)" != Z* ]]
}

pid_alive() {
    [[ -f "$STATE_DIR/kafka.pid" ]] || return 1
    local pid
    pid="$(cat "$STATE_DIR/kafka.pid")"
    # A recycled pid or a zombie is not our broker.
    running "$pid" \
        && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "kafka.Kafka $STATE_DIR/server.properties"
}

port_answers() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

free_port() {
    need python3 "picks free ports"
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

bootstrap() {
    echo "127.0.0.1:$(cat "$STATE_DIR/broker.port")"
}

render_config() {
    # Ports are chosen once per state directory: restarts keep the address clients already know and the
    # controller endpoint that formatting wrote into the metadata log.
    if [[ ! -f "$STATE_DIR/broker.port" || ! -f "$STATE_DIR/controller.port" ]]; then
        free_port >"$STATE_DIR/broker.port"
        local controller
        controller="$(free_port)"
        while [[ "$controller" == "$(cat "$STATE_DIR/broker.port")" ]]; do controller="$(free_port)"; done
        echo "$controller" >"$STATE_DIR/controller.port"
    fi
    local broker_port controller_port
    broker_port="$(cat "$STATE_DIR/broker.port")"
    controller_port="$(cat "$STATE_DIR/controller.port")"
    for port in "$broker_port" "$controller_port"; do
        if port_answers "$port"; then
            die "port $port (recorded in $STATE_DIR) is taken by another process; stop it or remove $STATE_DIR"
        fi
    done
    local sources=("$HERE/server.properties.template")
    if [[ -n "${KAFKA_EXTRA_CONFIG:-}" ]]; then
        [[ -f "$KAFKA_EXTRA_CONFIG" ]] || die "KAFKA_EXTRA_CONFIG: no file $KAFKA_EXTRA_CONFIG"
        # Java properties: a key read again later wins, so the appended keys override the template's.
        sources+=("$KAFKA_EXTRA_CONFIG")
    fi
    sed -e "s|@BROKER_PORT@|$broker_port|g" -e "s|@CONTROLLER_PORT@|$controller_port|g" \
        -e "s|@LOG_DIR@|$STATE_DIR/data|g" "${sources[@]}" >"$STATE_DIR/server.properties"
}

java_opts() {
    echo "$HEAP_OPTS -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true" \
        "-Dlog4j2.configurationFile=$HERE/log4j2.properties -Dkafka.logs.dir=$STATE_DIR/logs"
}

start() {
    mkdir -p "$STATE_DIR"
    STATE_DIR="$(cd "$STATE_DIR" && pwd)"
    if pid_alive; then
        bootstrap
        return 0
    fi
    fetch
    need java "runs the broker"
    mkdir -p "$STATE_DIR/logs" "$STATE_DIR/data"
    render_config
    # shellcheck disable=SC2046
    if [[ ! -f "$STATE_DIR/data/meta.properties" ]]; then
        local cluster_id
        cluster_id="$(java -cp "$LIBS/*" $(java_opts) kafka.tools.StorageTool random-uuid)"
        local format_args=()
        read -r -a format_args <<<"${KAFKA_FORMAT_ARGS:-}"
        java -cp "$LIBS/*" $(java_opts) kafka.tools.StorageTool format --standalone \
            -t "$cluster_id" -c "$STATE_DIR/server.properties" "${format_args[@]}" >"$STATE_DIR/logs/format.out" 2>&1 \
            || { cat "$STATE_DIR/logs/format.out" >&2; die "formatting storage failed"; }
    fi
    local started_marker
    started_marker="$(wc -l <"$STATE_DIR/logs/server.log" 2>/dev/null || echo 0)"
    # setsid: the broker outlives this script and does not get the caller's terminal signals.
    # shellcheck disable=SC2046
    setsid java -cp "$LIBS/*" $(java_opts) kafka.Kafka "$STATE_DIR/server.properties" \
        >>"$STATE_DIR/kafka.out" 2>&1 </dev/null &
    local pid=$! port deadline
    echo "$pid" >"$STATE_DIR/kafka.pid"
    port="$(cat "$STATE_DIR/broker.port")"
    deadline=$((SECONDS + START_TIMEOUT))
    until port_answers "$port" \
        && tail -n +"$((started_marker + 1))" "$STATE_DIR/logs/server.log" 2>/dev/null | grep -q "Kafka Server started"; do
        # Our own child: until it has exec'd java its command line is still this script's (a slow host).
        if ! running "$pid"; then
            tail -n 40 "$STATE_DIR/kafka.out" >&2 || true
            die "broker exited during start-up; see $STATE_DIR/logs/server.log"
        fi
        if ((SECONDS >= deadline)); then
            stop
            die "broker did not answer on 127.0.0.1:$port within ${START_TIMEOUT}s"
        fi
        sleep 0.5
    done
    bootstrap
}

stop() {
    [[ -d "$STATE_DIR" ]] || return 0
    if ! pid_alive; then
        rm -f "$STATE_DIR/kafka.pid"
        return 0
    fi
    local pid deadline
    pid="$(cat "$STATE_DIR/kafka.pid")"
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + STOP_TIMEOUT))
    while pid_alive; do
        if ((SECONDS >= deadline)); then
            say "broker $pid did not stop within ${STOP_TIMEOUT}s; killing it"
            kill -KILL "$pid" 2>/dev/null || true
        fi
        sleep 0.2
    done
    rm -f "$STATE_DIR/kafka.pid"
}

status() {
    if pid_alive && port_answers "$(cat "$STATE_DIR/broker.port")"; then
        echo "running $(bootstrap)"
        return 0
    fi
    echo "stopped"
    return 3
}

case "${1:-}" in
    fetch) fetch ;;
    start) start ;;
    stop) stop ;;
    status) status ;;
    *)
        echo "usage: $0 fetch|start|stop|status" >&2
        exit 2
        ;;
esac
