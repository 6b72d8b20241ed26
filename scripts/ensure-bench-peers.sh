#!/bin/sh
# The peers the benchmarks measure tidemq against (benchmarks/peers.py): redis-server
# (Redis Streams, XADD) and nats-server (NATS JetStream). When either binary is missing,
# install the Debian package (redis-server, nats-server) with apt-get. Needs root (or sudo).
# Their Python clients (redis-py, nats-py) are the `bench` extra, installed by `make bench`.
set -eu

missing=""
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
command -v nats-server >/dev/null 2>&1 || missing="$missing nats-server"
if [ -z "$missing" ]; then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-bench-peers: missing:$missing and no apt-get: install them (Redis 7+," >&2
    echo "NATS server 2.9+ with JetStream); until then the benchmarks report a missing" >&2
    echo "peer as missing and measure the rest" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# shellcheck disable=SC2086 # one word per package
$SUDO apt-get install -y -q --no-install-recommends $missing
# The Debian package starts a system-wide redis-server on port 6379 where systemd runs;
# the benchmarks start their own on free ports and do not need it.
redis-server --version
nats-server --version
