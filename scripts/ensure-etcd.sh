#!/bin/sh
# The replication tests (issue 23) start real etcd processes: Debian's `etcd-server`
# (the `etcd` binary) and `etcd-client` (`etcdctl`, for looking at a test's keys by hand).
# Installs them with apt-get when `etcd` is missing. Needs root (or sudo).
#
# Debian's package may try to start a system etcd on 127.0.0.1:2379; the tests never use
# it (each starts its own on free ports with a temporary data directory).
set -eu

if command -v etcd >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-etcd: no etcd and no apt-get: install etcd 3.4 or later (etcd-server), then retry" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "ensure-etcd: no etcd, not root and no sudo: run 'apt-get install etcd-server etcd-client' as root" >&2
        exit 1
    fi
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends etcd-server etcd-client
etcd --version
