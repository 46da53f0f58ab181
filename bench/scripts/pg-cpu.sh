#!/bin/sh
# pg-cpu.sh DATADIR: the CPU seconds (user + system) a local PostgreSQL cluster has used so far:
# its postmaster's, its live server processes', and those of the server processes that have
# exited (the postmaster's reaped children). Read it before and after a run; the difference is
# what the run cost the server, background processes (autovacuum, checkpointer) included.
# Linux only (/proc). Example, a bench run's share:
#   a=$(bench/scripts/pg-cpu.sh /tmp/pg1/data); gendurable bench ...; b=$(bench/scripts/pg-cpu.sh /tmp/pg1/data)
set -eu
[ $# -eq 1 ] || { echo "usage: $0 DATADIR" >&2; exit 2; }
pm=$(head -n 1 "$1/postmaster.pid")
exec python3 - "$pm" "$(getconf CLK_TCK)" <<'PY'
import os, sys
pm, tick = int(sys.argv[1]), int(sys.argv[2])
def stat(pid):
    s = open(f"/proc/{pid}/stat").read()
    return s[s.rindex(")") + 2:].split()  # fields from 3 (state) on
s = stat(pm)
total = sum(int(x) for x in s[11:15])  # utime, stime, cutime, cstime
for p in os.listdir("/proc"):
    if not p.isdigit() or int(p) == pm:
        continue
    try:
        s = stat(p)
    except OSError:
        continue
    if int(s[1]) == pm:  # ppid
        total += int(s[11]) + int(s[12])
print(f"{total / tick:.2f}")
PY
