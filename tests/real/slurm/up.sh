#!/usr/bin/env bash
# A real Slurm 22.05 cluster on this one machine, for tests/real: munge, slurmctld and four
# slurmd daemons (nodes n1..n4 at 127.0.0.2..127.0.0.5, 2 CPUs and 2 fake GPUs each), plus
# Open MPI's mpirun. Needs root (apt-get, /etc/hosts, daemons running as root).
#
#   bash tests/real/slurm/up.sh        # prints `export SLURM_CONF=...` on its last line
#   bash tests/real/slurm/down.sh      # stops everything and removes the state directory
#
# Debian's slurm-wlm, munge and openmpi-bin are installed with apt-get when missing. No
# systemd: every daemon is started here, its state, sockets and logs under $SLURM_DIR, so
# nothing of the machine's own configuration is used or changed except /etc/hosts, which
# gets one marked line per node (down.sh removes them): tasks reach each other by node name.
#
# What running in a container as root needs (each choice is in slurm.conf below):
#   - SlurmUser=root, SlurmdUser=root: there is no `slurm` account to drop to that owns
#     the state directory, and jobs are submitted by root (Slurm allows it by default).
#   - ProctrackType=proctrack/linuxproc, TaskPlugin=task/none, JobAcctGatherType=none: the
#     cgroup plugins need a writable, delegated cgroup hierarchy a container rarely has;
#     linuxproc tracks a step's processes through /proc parent links instead.
#   - One slurmd per node name (`slurmd -N nX`), each on its own Port=: Debian builds Slurm
#     with multiple-slurmd support; the daemons share the machine, so they differ by port,
#     and NodeAddr gives each node its own loopback address.
#   - munged runs with --force (it refuses to run as root otherwise) on its own socket,
#     named to Slurm through AuthInfo=socket=...
#   - Fake GPUs: gres.conf lists character devices made with mknod (/dev/null's numbers)
#     named nvidia0 and nvidia1 in the state directory. Slurm only stats them; it then sets CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS and SLURM_JOB_GPUS exactly
#     as on a GPU node (ConstrainDevices is off: no cgroup).
#   - mpirun as root needs OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;
#     the tests set them for the processes they start.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=common.sh
source "$HERE/common.sh"
# The daemons started here must not inherit a closed standard input (CI has none): a
# daemon whose descriptor 0 is free later opens a file there, and task launches fail.
exec </dev/null

say() { printf 'slurm-up: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

[[ $(id -u) == 0 ]] || die "needs root (apt-get, /etc/hosts and the daemons); run as root"

# --- packages ------------------------------------------------------------------------
missing=()
for tool in slurmctld slurmd srun sbatch munged mpirun; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if (( ${#missing[@]} )); then
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
    say "installing slurm-wlm munge openmpi-bin (missing: ${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends slurm-wlm munge openmpi-bin >/dev/null
fi
say "$(slurmctld -V), $(mpirun --version 2>/dev/null | head -1)"

# --- a clean state directory ---------------------------------------------------------
if [[ -e "$SLURM_DIR" ]]; then
    say "a previous cluster's state is in $SLURM_DIR: stopping it first"
    bash "$HERE/down.sh"
fi
mkdir -p "$SLURM_DIR"/{munge,ctld,log,gpu,spool}
chmod 700 "$SLURM_DIR/munge"
for node in "${NODES[@]}"; do
    mkdir -p "$SLURM_DIR/spool/$node"
    # Character devices with /dev/null's numbers, named as NVIDIA's device files are.
    mkdir -p "$SLURM_DIR/gpu/$node"
    mknod "$SLURM_DIR/gpu/$node/nvidia0" c 1 3
    mknod "$SLURM_DIR/gpu/$node/nvidia1" c 1 3
done

# --- node names ----------------------------------------------------------------------
remove_host_lines
for node in "${NODES[@]}"; do
    printf '%s %s %s\n' "${NODE_ADDR[$node]}" "$node" "$HOSTS_MARK" >> /etc/hosts
done

# --- munge ---------------------------------------------------------------------------
MUNGE_SOCKET="$SLURM_DIR/munge/munge.socket.2"
dd if=/dev/urandom of="$SLURM_DIR/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$SLURM_DIR/munge/munge.key"
munged --force \
    --key-file="$SLURM_DIR/munge/munge.key" \
    --socket="$MUNGE_SOCKET" \
    --pid-file="$SLURM_DIR/munge/munged.pid" \
    --seed-file="$SLURM_DIR/munge/munged.seed" \
    --log-file="$SLURM_DIR/log/munged.log"
munge -S "$MUNGE_SOCKET" -n | unmunge -S "$MUNGE_SOCKET" >/dev/null \
    || die "munge does not round-trip a credential; see $SLURM_DIR/log/munged.log"

# --- slurm.conf and gres.conf --------------------------------------------------------
CONTROLLER="$(hostname -s)"
{
    cat <<CONF
# Written by tests/real/slurm/up.sh: a four-node test cluster on one machine.
ClusterName=jaxcluster-test
SlurmctldHost=$CONTROLLER(127.0.0.1)
SlurmctldPort=$SLURM_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$SLURM_DIR/ctld
SlurmdSpoolDir=$SLURM_DIR/spool/%n
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd-%n.pid
SlurmctldLogFile=$SLURM_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
GresTypes=gpu
ReturnToService=2
# Quick turnaround for a test cluster: steps killed promptly, no long grace periods.
KillWait=5
MessageTimeout=20
InactiveLimit=0
MinJobAge=300
CONF
    port=$SLURM_PORT
    for node in "${NODES[@]}"; do
        port=$((port + 1))
        echo "NodeName=$node NodeAddr=${NODE_ADDR[$node]} Port=$port CPUs=2 Gres=gpu:2 State=UNKNOWN"
    done
    echo "PartitionName=test Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP"
} > "$SLURM_DIR/slurm.conf"
for node in "${NODES[@]}"; do
    echo "NodeName=$node Name=gpu File=$SLURM_DIR/gpu/$node/nvidia[0-1]"
done > "$SLURM_DIR/gres.conf"
export SLURM_CONF="$SLURM_DIR/slurm.conf"

# --- daemons -------------------------------------------------------------------------
slurmctld -f "$SLURM_CONF" -c   # -c: a fresh cluster, no saved jobs from an earlier run
for node in "${NODES[@]}"; do
    slurmd -f "$SLURM_CONF" -N "$node"
done

# Up means: every node idle in sinfo and a one-task step runs.
deadline=$((SECONDS + 60))
until [[ "$(sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 == "idle"' | wc -l)" == "${#NODES[@]}" ]]; do
    if (( SECONDS > deadline )); then
        sinfo -N >&2 || true
        tail -n 20 "$SLURM_DIR"/log/*.log >&2 || true
        die "the nodes did not become idle within 60 s (logs above, in $SLURM_DIR/log)"
    fi
    sleep 0.5
done
placed="$(timeout 60 srun -N 4 -n 4 -l printenv SLURMD_NODENAME </dev/null | sort | tr '\n' ' ')"
[[ "$placed" == "0: n1 1: n2 2: n3 3: n4 " ]] \
    || die "a test step on all four nodes printed '$placed'; expected '0: n1 1: n2 2: n3 3: n4'"
say "up: ${#NODES[@]} nodes idle; state and logs in $SLURM_DIR"
echo "export SLURM_CONF=$SLURM_CONF"
