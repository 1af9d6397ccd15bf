#!/usr/bin/env bash
# Brings up a one-host Slurm cluster on this machine, for tests and CI: installs Slurm and munge
# from the Debian packages if they are missing, writes /etc/slurm/slurm.conf (this host as the
# controller and the only compute node, on 127.0.0.1, no accounting, no cgroups), starts munged,
# slurmctld and slurmd, and waits until the node is idle. For a single test host, not for
# production clusters. Run as root; data_scripts/slurm_local_down.sh stops it all again.
# Does nothing if slurmctld and slurmd are already running. Refuses to replace a slurm.conf it
# did not write, unless SLURM_LOCAL_FORCE=1 (then that file is kept as slurm.conf.bak-DATE).
set -euo pipefail
export PATH=/usr/sbin:/sbin:/usr/bin:/bin:$PATH
me=slurm_local_up.sh
conf=/etc/slurm/slurm.conf
marker="# Written by t2t-lite data_scripts/slurm_local_up.sh: one-host test cluster."
run_dir=/run/slurm
state_dir=/var/lib/slurm/slurmctld
spool_dir=/var/lib/slurm/slurmd
log_dir=/var/log/slurm
ctld_pid=$run_dir/slurmctld.pid
slurmd_pid=$run_dir/slurmd.pid
wait_idle=${SLURM_LOCAL_WAIT:-30}

die() { echo "$me: $*" >&2; exit 1; }
# alive PIDFILE NAME: the pid file names a live process (not a zombie) called NAME, not a
# recycled pid
alive() {
  local pid stat
  [ -s "$1" ] || return 1
  pid=$(cat "$1")
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] && [[ ${stat#*) } != Z* ]]
}

[ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages and starts daemons)"
host=$(hostname -s)
[ -n "$host" ] || die "hostname -s printed nothing"

if alive "$ctld_pid" slurmctld && alive "$slurmd_pid" slurmd; then
  echo "$me: slurmctld and slurmd already running (pids $(cat "$ctld_pid"), $(cat "$slurmd_pid")); nothing to do"
  exit 0
fi
if alive "$ctld_pid" slurmctld || alive "$slurmd_pid" slurmd; then
  die "only one of slurmctld and slurmd is running; run data_scripts/slurm_local_down.sh first"
fi

# A slurm.conf that is not ours is left alone
if [ -e "$conf" ] && ! grep -qxF "$marker" "$conf"; then
  if [ "${SLURM_LOCAL_FORCE:-}" = 1 ]; then
    backup=$conf.bak-$(date +%Y%m%d-%H%M%S)
    mv "$conf" "$backup"
    echo "$me: kept the existing $conf as $backup"
  else
    die "$conf exists and was not written by this script; move it away (or set SLURM_LOCAL_FORCE=1 to back it up and replace it)"
  fi
fi

# 1. Packages
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
    || ! command -v sinfo >/dev/null || ! command -v munged >/dev/null; then
  apt_log=$(mktemp /tmp/slurm_local_apt.XXXXXX)
  added_policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    # keep the packages' maintainer scripts from starting daemons before slurm.conf exists
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    added_policy=1
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm munge \
      >> "$apt_log" 2>&1
  }
  status=0
  apt_install || status=$?
  if [ "$status" -ne 0 ] && grep -qE "Unable to locate package|has no installation candidate|404 +Not Found" "$apt_log"; then
    DEBIAN_FRONTEND=noninteractive apt-get update >> "$apt_log" 2>&1 || true
    status=0
    apt_install || status=$?
  fi
  [ -z "$added_policy" ] || { rm -f /usr/sbin/policy-rc.d; trap - EXIT; }
  [ "$status" -eq 0 ] || die "apt-get install slurm-wlm munge failed (log: $apt_log)"
  rm -f "$apt_log"
fi
id slurm >/dev/null 2>&1 || die "the slurm user does not exist after installing slurm-wlm"

# 2. munge
if [ ! -s /etc/munge/munge.key ]; then
  mungekey --create --keyfile=/etc/munge/munge.key >/dev/null 2>&1 \
    || die "no /etc/munge/munge.key and mungekey --create failed"
  chown munge:munge /etc/munge/munge.key
  chmod 600 /etc/munge/munge.key
fi
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  service munge start >/dev/null 2>&1 || die "service munge start failed (see /var/log/munge/munged.log)"
  for _ in $(seq 50); do
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
    sleep 0.1
  done
  munge -n 2>/dev/null | unmunge >/dev/null 2>&1 \
    || die "munged does not answer (see /var/log/munge/munged.log)"
fi

# 3. Directories and slurm.conf
mkdir -p /etc/slurm "$run_dir" "$state_dir" "$spool_dir" "$log_dir"
chown slurm:slurm "$run_dir" "$state_dir" "$log_dir"
chmod 755 "$run_dir" "$state_dir" "$spool_dir" "$log_dir"
# slurmd -C: this host's NodeName line (CPUs, sockets, cores, threads, RealMemory) and UpTime
node_line=$(slurmd -C 2>/dev/null | grep '^NodeName=' | head -n 1) || true
case "$node_line" in
  "NodeName=$host "*) ;;
  *) die "slurmd -C did not print a NodeName=$host line (got: '${node_line:-nothing}')" ;;
esac
cpus=$(printf '%s\n' "$node_line" | sed -n 's/.* CPUs=\([0-9]*\).*/\1/p')
tmp_conf=$(mktemp "$conf.XXXXXX")
cat > "$tmp_conf" <<EOF
$marker
# Controller and the only compute node are this host, reached on 127.0.0.1. Not for production.
ClusterName=t2tlite
SlurmctldHost=$host(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
SlurmctldPidFile=$ctld_pid
SlurmdPidFile=$slurmd_pid
StateSaveLocation=$state_dir
SlurmdSpoolDir=$spool_dir
SlurmctldLogFile=$log_dir/slurmctld.log
SlurmdLogFile=$log_dir/slurmd.log
$node_line NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
chmod 644 "$tmp_conf"
mv "$tmp_conf" "$conf"

# 4. Daemons (both fork into the background; the pid files say they are up)
slurmctld >/dev/null 2>&1 || die "slurmctld failed to start (see $log_dir/slurmctld.log)"
slurmd >/dev/null 2>&1 || die "slurmd failed to start (see $log_dir/slurmd.log)"
for _ in $(seq 50); do
  alive "$ctld_pid" slurmctld && alive "$slurmd_pid" slurmd && break
  sleep 0.2
done
alive "$ctld_pid" slurmctld || die "slurmctld is not running (see $log_dir/slurmctld.log)"
alive "$slurmd_pid" slurmd || die "slurmd is not running (see $log_dir/slurmd.log)"

# 5. Wait for the node to be idle
state=
for ((i = 0; i < wait_idle * 2; i++)); do
  state=$(sinfo -h -n "$host" -o %T 2>/dev/null | head -n 1) || state=
  [ "$state" = idle ] && break
  sleep 0.5
done
[ "$state" = idle ] || die "node $host is '${state:-unknown}', not idle, after ${wait_idle} s (see $log_dir/slurmctld.log and $log_dir/slurmd.log)"
echo "$me: Slurm cluster up: node $host idle with $cpus CPUs in partition local (default)"
