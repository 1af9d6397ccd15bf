#!/usr/bin/env bash
# Stops the one-host Slurm cluster that data_scripts/slurm_local_up.sh started: slurmd and
# slurmctld (by their pid files in /run/slurm, waiting until they have exited), then munged.
# For a single test host, not for production clusters. Run as root; exits 0 when nothing runs.
# Job steps still running keep their slurmstepd processes; cancel jobs first to end them.
set -euo pipefail
export PATH=/usr/sbin:/sbin:/usr/bin:/bin:$PATH
me=slurm_local_down.sh
run_dir=/run/slurm

[ "$(id -u)" -eq 0 ] || { echo "$me: must run as root" >&2; exit 1; }

# is PID NAME: process PID is alive (not a zombie) and called NAME (a stale pid file may name a
# recycled pid)
is() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ] && [[ ${stat#*) } != Z* ]]
}

stop() {  # stop NAME PIDFILE: SIGTERM, up to 30 s to exit, then SIGKILL
  local name=$1 pid_file=$2 pid
  [ -s "$pid_file" ] || return 0
  pid=$(cat "$pid_file")
  if ! is "$pid" "$name"; then
    rm -f "$pid_file"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 300); do
    is "$pid" "$name" || break
    sleep 0.1
  done
  if is "$pid" "$name"; then
    echo "$me: $name (pid $pid) still running after 30 s; sending SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.5
  fi
  rm -f "$pid_file"
  echo "$me: stopped $name (pid $pid)"
}

stop slurmd "$run_dir/slurmd.pid"
stop slurmctld "$run_dir/slurmctld.pid"
if [ -x /etc/init.d/munge ] && [ -s /run/munge/munged.pid ] \
    && is "$(cat /run/munge/munged.pid)" munged; then
  service munge stop >/dev/null 2>&1 || { echo "$me: service munge stop failed" >&2; exit 1; }
  echo "$me: stopped munged"
fi
