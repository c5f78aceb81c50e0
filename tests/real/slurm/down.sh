#!/usr/bin/env bash
# Stops the test cluster up.sh started (its jobs, slurmd, slurmctld, munged), removes its
# /etc/hosts lines and its state directory. Safe to run when nothing is up; exits 0 unless
# a daemon survives SIGKILL.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=common.sh
source "$HERE/common.sh"
# The daemons started here must not inherit a closed standard input (CI has none): a
# daemon whose descriptor 0 is free later opens a file there, and task launches fail.
exec </dev/null

say() { printf 'slurm-down: %s\n' "$*" >&2; }

alive() { [[ "$1" =~ ^[0-9]+$ ]] && kill -0 "$1" 2>/dev/null && ! grep -q '^[^)]*) Z' "/proc/$1/stat" 2>/dev/null; }

ctld_pid="$(cat "$SLURM_DIR/slurmctld.pid" 2>/dev/null || true)"
if [[ -f "$SLURM_DIR/slurm.conf" ]] && alive "$ctld_pid"; then
    # Jobs first, while the controller can still tell the nodes to end them, and until
    # they are gone (a bounded wait): their tasks may hold ports the next run needs.
    export SLURM_CONF="$SLURM_DIR/slurm.conf"
    if timeout 20 scancel --user=root --full 2>/dev/null; then
        deadline=$((SECONDS + 30))
        while [[ -n "$(timeout 10 squeue -h 2>/dev/null)" ]] && (( SECONDS < deadline )); do
            sleep 0.5
        done
    fi
fi

# Only the daemons this cluster started: their pid files are in the state directory.
pids=()
for pid_file in "$SLURM_DIR"/slurmd-*.pid "$SLURM_DIR/slurmctld.pid" "$SLURM_DIR/munge/munged.pid"; do
    [[ -f "$pid_file" ]] || continue
    pid="$(cat "$pid_file" 2>/dev/null)"
    alive "$pid" && pids+=("$pid")
done
# slurmstepd processes of this cluster (a step's daemon outlives slurmd when it is killed).
# They rename themselves ("slurmstepd: [12.0]"), so they are known by what they keep open:
# their working directory or a log file in the state directory.
for pid in $(pgrep -x slurmstepd || true); do
    if [[ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" == "$SLURM_DIR"* ]] \
        || ls -l "/proc/$pid/fd" 2>/dev/null | grep -qF "$SLURM_DIR"; then
        alive "$pid" && pids+=("$pid")
    fi
done
# Tasks of this cluster's jobs left by a step daemon that died: processes of a job
# (SLURM_JOB_ID set) of this cluster (SLURM_CONF is its slurm.conf). Only reached when the
# daemons did not end the jobs themselves.
for environ in /proc/[0-9]*/environ; do
    pid="${environ#/proc/}"; pid="${pid%/environ}"
    [[ "$pid" == "$$" ]] && continue
    variables="$(tr '\0' '\n' 2>/dev/null < "$environ")" || continue
    if grep -qxF "SLURM_CONF=$SLURM_DIR/slurm.conf" <<< "$variables" \
        && grep -q '^SLURM_JOB_ID=' <<< "$variables"; then
        alive "$pid" && pids+=("$pid")
    fi
done

if (( ${#pids[@]} )); then
    kill -TERM "${pids[@]}" 2>/dev/null || true
    deadline=$((SECONDS + 15))
    for pid in "${pids[@]}"; do
        while alive "$pid" && (( SECONDS < deadline )); do sleep 0.2; done
        alive "$pid" && kill -KILL "$pid" 2>/dev/null
    done
fi

status=0
for pid in "${pids[@]}"; do
    sleep 0.1
    if alive "$pid"; then
        say "error: process $pid ($(ps -o args= -p "$pid")) survived SIGKILL"
        status=1
    fi
done

[[ -w /etc/hosts ]] && remove_host_lines
rm -rf "$SLURM_DIR"
say "down (stopped ${#pids[@]} processes)"
exit $status
