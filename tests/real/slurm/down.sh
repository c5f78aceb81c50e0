#!/usr/bin/env bash
# Stops the test cluster up.sh started (its jobs, slurmd, slurmctld, munged), removes its
# /etc/hosts lines and its state directory. Safe to run when nothing is up; exits 0 unless
# a daemon survives SIGKILL.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=common.sh
source "$HERE/common.sh"

say() { printf 'slurm-down: %s\n' "$*" >&2; }

if [[ -f "$SLURM_DIR/slurm.conf" ]]; then
    # Jobs first, while the controller can still tell the nodes to end them.
    SLURM_CONF="$SLURM_DIR/slurm.conf" timeout 20 scancel --user=root --full 2>/dev/null || true
fi

# Only the daemons this cluster started: their pid files are in the state directory.
pids=()
for pid_file in "$SLURM_DIR"/slurmd-*.pid "$SLURM_DIR/slurmctld.pid" "$SLURM_DIR/munge/munged.pid"; do
    [[ -f "$pid_file" ]] || continue
    pid="$(cat "$pid_file" 2>/dev/null)"
    [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && pids+=("$pid")
done
# slurmstepd processes of this cluster (a step's daemon outlives slurmd when it is killed).
while read -r pid args; do
    [[ "$args" == *"$SLURM_DIR"* ]] && pids+=("$pid")
done < <(ps -eo pid=,args= | grep '[s]lurmstepd' || true)

if (( ${#pids[@]} )); then
    kill -TERM "${pids[@]}" 2>/dev/null || true
    deadline=$((SECONDS + 15))
    for pid in "${pids[@]}"; do
        while kill -0 "$pid" 2>/dev/null && (( SECONDS < deadline )); do sleep 0.2; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    done
fi

status=0
for pid in "${pids[@]}"; do
    sleep 0.1
    if kill -0 "$pid" 2>/dev/null; then
        say "error: process $pid ($(ps -o args= -p "$pid")) survived SIGKILL"
        status=1
    fi
done

[[ -w /etc/hosts ]] && remove_host_lines
rm -rf "$SLURM_DIR"
say "down (stopped ${#pids[@]} processes)"
exit $status
