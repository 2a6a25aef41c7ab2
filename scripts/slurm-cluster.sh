#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for trying examples/slurm/ and for the test
# that runs it: munged, slurmctld and slurmd on localhost, run as root, everything (key,
# socket, state, spool, logs) under one folder.
#
#   scripts/slurm-cluster.sh start [DIR]   # prints the `export SLURM_CONF=...` to use
#   scripts/slurm-cluster.sh stop [DIR]    # stops the daemons it started, removes DIR
#
# DIR defaults to ${TMPDIR:-/tmp}/runner-slurm. Needs Debian's slurm-wlm and munge
# (apt-get install -y slurm-wlm munge); checked with slurm-wlm 22.05 on Debian 12.
# SLURM_CLUSTER_PORT (default 6817) is slurmctld's port; slurmd takes the next one.
set -euo pipefail

usage() {
    echo "usage: $0 start|stop [DIR]" >&2
    exit 2
}

[ $# -ge 1 ] || usage
action=$1
dir=${2:-${TMPDIR:-/tmp}/runner-slurm}
port=${SLURM_CLUSTER_PORT:-6817}

stop_daemon() {
    local pidfile=$1 pid
    [ -f "$pidfile" ] || return 0
    pid=$(cat "$pidfile")
    # Only a process that still runs the daemon this folder started.
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
}

stop() {
    [ -d "$dir" ] || return 0
    # Jobs still running are ended with the cluster: slurmd's job steps are its children.
    stop_daemon "$dir/run/slurmd.pid"
    stop_daemon "$dir/run/slurmctld.pid"
    stop_daemon "$dir/run/munged.pid"
    # slurmstepd processes outlive slurmd; end those of this cluster only.
    for pid in $(pgrep -x slurmstepd 2>/dev/null || true); do
        if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "SLURM_CONF=$dir/slurm.conf"; then
            kill "$pid" 2>/dev/null || true
        fi
    done
    rm -rf "$dir"
}

wait_for() {
    local what=$1 log=$2
    shift 2
    for _ in $(seq 100); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    echo "$what did not start; the end of its log ($log):" >&2
    tail -n 20 "$log" >&2 || true
    return 1
}

start() {
    for program in munged mungekey slurmctld slurmd sbatch sinfo; do
        command -v "$program" >/dev/null || {
            echo "$program not found: apt-get install -y slurm-wlm munge" >&2
            exit 1
        }
    done
    if [ "$(id -u)" != 0 ]; then
        echo "the one-node cluster runs its daemons as root" >&2
        exit 1
    fi
    if [ -e "$dir/slurm.conf" ]; then
        echo "$dir holds a cluster already: $0 stop $dir" >&2
        exit 1
    fi
    mkdir -p "$dir"/{munge,run,log,state,spool}
    chmod 700 "$dir" "$dir/munge"

    mungekey --create --keyfile="$dir/munge/munge.key" --force
    chmod 400 "$dir/munge/munge.key"
    munged --force \
        --key-file="$dir/munge/munge.key" \
        --socket="$dir/munge/munge.socket" \
        --pid-file="$dir/run/munged.pid" \
        --log-file="$dir/log/munged.log" \
        --seed-file="$dir/munge/munged.seed"
    wait_for munged "$dir/log/munged.log" test -S "$dir/munge/munge.socket"

    local cpus
    cpus=$(nproc)
    cat >"$dir/slurm.conf" <<EOF
ClusterName=runner
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ReturnToService=2
# Schedule when a job ends, not in a batch every 3 s (the default, for clusters that take
# thousands of jobs a second): the array's second wave and the merge start at once.
SchedulerParameters=batch_sched_delay=0
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
    export SLURM_CONF=$dir/slurm.conf
    # -i: a fresh state, whatever an earlier cluster left.
    slurmctld -i -f "$SLURM_CONF"
    wait_for slurmctld "$dir/log/slurmctld.log" scontrol ping
    slurmd -N localhost -f "$SLURM_CONF"
    wait_for slurmd "$dir/log/slurmd.log" node_is_up
    echo "export SLURM_CONF=$SLURM_CONF"
}

node_is_up() {
    sinfo -h -N -o %T | grep -Eq '^(idle|mixed|allocated)'
}

case $action in
start)
    # A start that fails half-way leaves nothing running.
    trap 'status=$?; if [ $status -ne 0 ]; then stop; fi' EXIT
    start
    trap - EXIT
    ;;
stop) stop ;;
*) usage ;;
esac
