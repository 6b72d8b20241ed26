"""Batch codec speed: µs per batch and messages per second, encode and decode.

Run: ``python benchmarks/bench_codec.py`` (``--codec zstd`` or ``lz4`` to compress,
``--runs N``). For each value size (100 B, 1 KiB) and batch size (1, 16, 256 messages) it
times:

* ``encode_values``   values with one timestamp, no key (the producer's fast path);
* ``encode_batch``    full records: key, tag, one business key, one header, own timestamps;
* ``decode_columns``  of the encode_values payload (column views, no per-message work);
* ``decode_messages`` of each payload (``.../values`` and ``.../full``);
* ``batch_to_arrow``  of the full payload, when pyarrow is installed.

Each figure is the median of ``--runs`` runs (default 5); a run repeats the operation for
about 0.1 s and takes the mean. Timings on a shared machine vary by tens of percent from
one invocation to the next: compare figures taken in one invocation.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from tidemq.core.batch import (
    Codec,
    MessageRecord,
    decode_columns,
    decode_messages,
    encode_batch,
    encode_values,
)

VALUE_SIZES = (100, 1024)
BATCH_SIZES = (1, 16, 256)
TS = 1_700_000_000_000


def time_per_call(fn: Callable[[], object], runs: int, run_seconds: float = 0.1) -> float:
    """Median over `runs` runs of the mean seconds per call."""
    fn()  # warm up (imports of optional codecs, caches)
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    number = max(1, int(run_seconds / once))
    results = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        results.append((time.perf_counter() - start) / number)
    return statistics.median(results)


def configuration(codec: Codec, runs: int) -> str:
    try:
        import pyarrow  # noqa: PLC0415 - optional

        arrow = pyarrow.__version__
    except ImportError:  # pragma: no cover - the spark extra is not installed
        arrow = "not installed"
    return (
        f"python {platform.python_version()} ({platform.python_implementation()}), "
        f"numpy {np.__version__}, pyarrow {arrow}\n"
        f"{platform.platform()}, {platform.machine()}, {os.cpu_count()} CPUs\n"
        f"codec {codec.name.lower()}, median of {runs} runs"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--codec", choices=[c.name.lower() for c in Codec], default="none")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    codec = Codec[args.codec.upper()]
    runs: int = args.runs

    batch_to_arrow: Callable[[bytes], object] | None
    try:
        from tidemq.core.arrow import batch_to_arrow  # noqa: PLC0415 - needs pyarrow
    except ImportError:  # pragma: no cover
        batch_to_arrow = None

    print(configuration(codec, runs))
    print()
    print(f"{'operation':24} {'value':>6} {'batch':>6} {'µs/batch':>10} {'msg/s':>12}")
    rng = np.random.default_rng(0)
    for size in VALUE_SIZES:
        for count in BATCH_SIZES:
            # Random values: compressed figures are then the worst case, not a best one.
            values = [rng.bytes(size) for _ in range(count)]
            records = [
                MessageRecord(v, b"key-%d" % i, "tag", (f"id-{i}",), (("trace", b"t"),), TS + i)
                for i, v in enumerate(values)
            ]
            simple = encode_values(values, timestamp_ms=TS, codec=codec)
            full = encode_batch(records, codec=codec)
            cases: list[tuple[str, Callable[[], object]]] = [
                ("encode_values", partial(encode_values, values, timestamp_ms=TS, codec=codec)),
                ("encode_batch", partial(encode_batch, records, codec=codec)),
                ("decode_columns", partial(decode_columns, simple)),
                ("decode_messages/values", partial(decode_messages, simple)),
                ("decode_messages/full", partial(decode_messages, full)),
            ]
            if batch_to_arrow is not None:
                cases.append(("batch_to_arrow/full", partial(batch_to_arrow, full)))
            for name, fn in cases:
                seconds = time_per_call(fn, runs)
                print(
                    f"{name:24} {size:>6} {count:>6} {seconds * 1e6:>10.1f} "
                    f"{count / seconds:>12,.0f}"
                )
            sys.stdout.flush()
        print()


if __name__ == "__main__":
    main()
