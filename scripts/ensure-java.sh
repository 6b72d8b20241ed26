#!/bin/sh
# The Spark tests need Java 17 or later (PySpark 4 runs on 17 and 21). When `java` is
# missing, install a headless JRE from Debian: openjdk-17-jre-headless, or
# openjdk-21-jre-headless where 17 is no longer packaged. Needs root (or sudo).
set -eu

major() {
    # "openjdk version "17.0.15" ..." -> 17; "java version "1.8.0_..." -> 1
    java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1
}

if command -v java >/dev/null 2>&1; then
    version="$(major)"
    if [ -n "$version" ] && [ "$version" -ge 17 ]; then
        exit 0
    fi
    echo "ensure-java: found Java ${version:-?}; PySpark needs 17 or later" >&2
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-java: no java and no apt-get: install a Java 17+ runtime, then retry" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
for package in openjdk-17-jre-headless openjdk-21-jre-headless; do
    if apt-cache show "$package" >/dev/null 2>&1; then
        $SUDO apt-get install -y -q --no-install-recommends "$package"
        java -version
        exit 0
    fi
done
echo "ensure-java: neither openjdk-17-jre-headless nor openjdk-21-jre-headless is packaged here" >&2
exit 1
