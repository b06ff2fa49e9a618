"""MERGE benchmark: the engine against delta-rs (``deltalake``), and optionally Delta on Spark's own MERGE INTO, on
the same data in the same run.

Workloads (issue 4) on a target of ``--rows`` rows (default 5,000,000) in ``--files`` files (default 20), sorted by
``id``; target ids are even, new keys odd, so they fall between existing keys all over the key range:

  (1) upsert of rows/10 rows, keys random: half existing ids, half new ids
  (2) upsert of 1,000 rows, keys random, half existing and half new
  (3) upsert of rows/10 rows whose keys all lie in the newest 5% of the key range (half existing, half new)
  (4) insert-only (WHEN NOT MATCHED THEN INSERT *) of rows/10 new keys, random
  (5) delete (WHEN MATCHED THEN DELETE) of rows/100 existing keys, random
  (1c, --cdf) workload (1) on tables with delta.enableChangeDataFeed = true (issue 6)
  (1v-5v, --dv) workloads (1)-(5) with the engine merging a copy of the target with deletion vectors enabled
      (merge-on-read), delta-rs merging the plain table (it cannot write deletion vectors); targets: at most 1.0x
      delta-rs, (5v) at most 0.5x (issue 20)
  (6, --scale) 1,000 scattered upserts, merge-on-read, at each size of --scale-rows (default 5M and 20M rows, in
      files of --rows/--files rows); prints how each peer's time grows; target: the engine at least 3x as fast as
      delta-rs at the largest size
  read overhead (--dv or --read): a full scan (count + sum) of the target with 10% of its rows deleted by deletion
      vectors against the same live rows rewritten without vectors

``--delta`` adds Delta's own MERGE INTO (Delta 4.4 on Spark 4.2, from the cache tests/oracle/delta_spark.py fills) as
a third peer: the same tables, a Spark Connect server with the same resources (local[2], driver memory, shuffle
partitions), warmed by the same untimed rounds; on the deletion-vector variants Delta merges the same copy with
deletion vectors enabled and writes vectors too. Its server runs after the engine's, not beside it (memory).

Every merge runs on a fresh copy of its target, each peer in a process of its own (``children``) so that its peak
memory is its own. Rounds: every workload once per round and peer, ``--warmup`` untimed rounds then ``--repeat``
timed ones, the best time counting. Timed: loading the target's snapshot, reading the source Delta table and the
merge with its commit; not process start-up, imports or the Spark Connect session set-up.

After the runs every peer's table is read back with deltalake and compared in full with delta-rs's, the result
counts are checked against the counts the data was built for, and a deletion-vector variant must have written
deletion vectors: a fast wrong answer fails the run (exit code 1). Missed targets are reported, not failed.
The machine's load average is printed with every line of progress: other processes slow every peer.

    .venv/bin/python bench/merge_bench.py [--rows N] [--files N] [--only 1,3] [--repeat N] [--warmup N] [--cdf]
        [--dv] [--scale] [--scale-rows 5000000,20000000] [--read] [--delta] [--driver-memory 4g] [--keep]

Modules: ``workloads`` (what is merged), ``data`` (the tables), ``peer_engine``, ``peer_deltars``, ``peer_delta``
(each peer's timed merge and scan), ``children`` (a peer in its own process), ``measure`` (memory, CPU, load),
``runner`` (rounds and checks), ``check`` (is the answer right), ``read_overhead``, ``report``, ``cli``.
"""
