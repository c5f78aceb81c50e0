# Sourced by up.sh and down.sh: where the test cluster lives and how it is named.
#
# JAXCLUSTER_SLURM_DIR  state directory (default /tmp/jaxcluster-slurm); everything the
#                       cluster writes (config, munge key and socket, spool, logs) is here
# JAXCLUSTER_SLURM_PORT first of 5 TCP ports: slurmctld, then one slurmd per node
#                       (default 16817)
SLURM_DIR="${JAXCLUSTER_SLURM_DIR:-/tmp/jaxcluster-slurm}"
SLURM_PORT="${JAXCLUSTER_SLURM_PORT:-16817}"
NODES=(n1 n2 n3 n4)
# Each node answers on its own loopback address, as separate hosts would on a network.
declare -A NODE_ADDR=([n1]=127.0.0.2 [n2]=127.0.0.3 [n3]=127.0.0.4 [n4]=127.0.0.5)
HOSTS_MARK="# jaxcluster test Slurm cluster"

# /etc/hosts without this cluster's lines; written in place (it is often a bind mount,
# which `sed -i`'s rename cannot replace).
remove_host_lines() {
    local kept
    kept="$(grep -vF "$HOSTS_MARK" /etc/hosts || true)"
    printf '%s\n' "$kept" > /etc/hosts
}
